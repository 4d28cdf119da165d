// search/text.h: what trials write made valid UTF-8 and bounded; values quoted for error lines.
#include "search/text.h"

#include <gtest/gtest.h>

#include "search/limits.h"

namespace remat::search {
namespace {

TEST(Utf8, RecognisesWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));  // été € 😀
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));                  // truncated
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));              // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));          // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));      // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));              // cut in the middle
}

TEST(Utf8, BoundedReplacesInvalidBytesAndKeepsShortTextAsItIs) {
  EXPECT_EQ(BoundedUtf8("fine", 4096), "fine");
  EXPECT_EQ(BoundedUtf8("a\xFF" "b", 4096), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(BoundedUtf8("\xC3", 4096), "\xEF\xBF\xBD");
}

TEST(Utf8, BoundedCutsOnACodePointBoundaryWithAMarker) {
  std::string big;
  for (int i = 0; i < 1000; ++i) big += "\xE2\x82\xAC";  // 3000 bytes of €
  const std::string out = BoundedUtf8(big, 100);
  EXPECT_LE(out.size(), 100u);
  EXPECT_TRUE(IsValidUtf8(out));
  EXPECT_NE(out.find(" bytes cut)"), std::string::npos) << out;
  // Exactly the limit: kept whole.
  EXPECT_EQ(BoundedUtf8(std::string(100, 'x'), 100), std::string(100, 'x'));
  // Megabytes of invalid bytes still come out valid and bounded.
  const std::string junk(5 << 20, '\xFE');
  const std::string cut = BoundedUtf8(junk, limits::kMaxTrialMessageBytes);
  EXPECT_LE(cut.size(), limits::kMaxTrialMessageBytes);
  EXPECT_TRUE(IsValidUtf8(cut));
}

TEST(Utf8, QuoteForErrorIsOneLineEscapedAndCut) {
  EXPECT_EQ(QuoteForError("abc"), "\"abc\"");
  EXPECT_EQ(QuoteForError("a\nb\t\"c\\"), "\"a\\nb\\t\\\"c\\\\\"");
  EXPECT_EQ(QuoteForError("\xFF"), "\"\\xff\"");
  const std::string q = QuoteForError(std::string(50 << 20, 'v'), 64);
  EXPECT_LE(q.size(), 64u + 8);
  EXPECT_EQ(q.find('\n'), std::string::npos);
  EXPECT_TRUE(IsValidUtf8(q));
  EXPECT_EQ(q.substr(q.size() - 4), "\xE2\x80\xA6\"");
}

}  // namespace
}  // namespace remat::search
