// Reading files someone else chose: regular files only, bounded, and a log's tail.
#include "common/read_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace remat::common {
namespace {

class ReadFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/remat-read-file-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ReadFileTest, TailReadsTheLastBytesOfARegularFile) {
  std::string text(100000, 'a');
  text += "the end";
  const std::string path = Write("log", text);
  FileText tail = ReadRegularFileTail(path, 7);
  ASSERT_TRUE(tail.text.has_value()) << tail.error;
  EXPECT_EQ(*tail.text, "the end");
  tail = ReadRegularFileTail(path, 1 << 20);  // more than the file holds: all of it
  ASSERT_TRUE(tail.text.has_value());
  EXPECT_EQ(tail.text->size(), text.size());
  EXPECT_FALSE(ReadRegularFileTail(dir_ + "/missing", 10).text.has_value());
}

// A FIFO with no writer would block a plain open for ever: refused at once, as a directory is.
TEST_F(ReadFileTest, AFifoOrADirectoryIsRefusedWithoutWaiting) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, dir_}) {
    FileText tail = ReadRegularFileTail(path, 10);
    EXPECT_FALSE(tail.text.has_value()) << path;
    EXPECT_EQ(tail.error, "is not a regular file");
    FileText whole = ReadRegularFile(path, 10);
    EXPECT_FALSE(whole.text.has_value()) << path;
    EXPECT_EQ(whole.error, "is not a regular file");
  }
}

}  // namespace
}  // namespace remat::common
