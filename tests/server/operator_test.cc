// What an operator of rematd relies on, over a real gRPC channel on loopback: the admin role of
// the user token file (lists, watches and cancels every user's searches, each call audited),
// token files read again on request (rematd's SIGHUP) with a bad file changing nothing, and the
// metrics an operator alerts on: the gRPC status code of every call (refusals included), watch
// streams timed, and the process_* series; the page passes promtool.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "remat/v1/remat.grpc.pb.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "tests/server/test_util.h"

namespace remat::server {
namespace {

using testing::Entry;
using testing::SmallSpec;
using testing::Submit;

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class OperatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/remat-operator-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // Every log line into `log_` as well (component loggers copy the default's sinks).
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    previous_ = spdlog::default_logger();
    spdlog::drop_all();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  }
  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown(std::chrono::seconds(1));
    coordinator_.reset();
    spdlog::drop_all();
    spdlog::set_default_logger(previous_);
    std::filesystem::remove_all(dir_);
  }

  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
    return dir_ + "/" + name;
  }

  void Start(CoordinatorOptions o) {
    o.db_path = ":memory:";
    o.listen = "127.0.0.1:0";
    auto c = Coordinator::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    ASSERT_TRUE(coordinator_->Start().ok());
    channel_ = grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials());
    users_ = v1::RematService::NewStub(channel_);
  }

  std::string SubmitAs(const std::string& token, const std::string& name) {
    v1::SubmitSearchResponse r;
    const auto table = std::map<std::string, v1::ReplayEntry>{{"selective:[]", Entry(10, 1)}};
    grpc::Status st = users_->SubmitSearch(Ctx(token).get(), Submit(SmallSpec(name), table), &r);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return r.id();
  }

  grpc::StatusCode List(const std::string& token, v1::ListSearchesResponse* out) {
    return users_->ListSearches(Ctx(token).get(), {}, out).error_code();
  }

  std::string dir_;
  std::ostringstream log_;
  std::shared_ptr<spdlog::logger> previous_;
  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::RematService::Stub> users_;
};

TEST_F(OperatorTest, AnAdminListsWatchesAndCancelsEveryUsersSearchesAndIsAudited) {
  CoordinatorOptions o;
  o.user_tokens_file = Write("users", "alice-token alice\nbob-token bob\nops-token ops admin\n");
  Start(o);
  const std::string a = SubmitAs("alice-token", "a");
  const std::string b = SubmitAs("bob-token", "b");

  v1::ListSearchesResponse list;
  ASSERT_EQ(List("bob-token", &list), grpc::StatusCode::OK);
  ASSERT_EQ(list.searches_size(), 1);  // a user still sees only their own
  ASSERT_EQ(List("ops-token", &list), grpc::StatusCode::OK);
  std::set<std::string> owners;
  for (const auto& s : list.searches()) owners.insert(s.owner());
  EXPECT_EQ(owners, (std::set<std::string>{"alice", "bob"}));

  v1::GetSearchRequest get;
  get.set_id(a);
  v1::Search s;
  EXPECT_EQ(users_->GetSearch(Ctx("bob-token").get(), get, &s).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(users_->GetSearch(Ctx("ops-token").get(), get, &s).ok());
  EXPECT_EQ(s.owner(), "alice");
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.AddMetadata("authorization", "Bearer ops-token");
    v1::WatchSearchRequest req;
    req.set_id(b);
    auto reader = users_->WatchSearch(&ctx, req);
    v1::SearchProgress p;
    ASSERT_TRUE(reader->Read(&p));  // the current state comes first
    EXPECT_EQ(p.state(), v1::SEARCH_STATE_QUEUED);
    ctx.TryCancel();
    reader->Finish();
  }
  v1::CancelSearchRequest cancel;
  cancel.set_id(a);
  v1::CancelSearchResponse cancelled;
  EXPECT_EQ(users_->CancelSearch(Ctx("bob-token").get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(users_->CancelSearch(Ctx("ops-token").get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::SEARCH_STATE_CANCELLED);
  ASSERT_TRUE(users_->GetSearch(Ctx("alice-token").get(), get, &s).ok());
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_CANCELLED);

  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  const std::string log = log_.str();
  for (const std::string& line : std::vector<std::string>{
           "admin ops ListSearches (every user's searches): OK",
        "admin ops GetSearch search " + a + ": OK",
        "admin ops WatchSearch search " + b + ": OK",
        "admin ops CancelSearch search " + a + ": OK"}) {
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  }
  EXPECT_EQ(CountOf(log, "[rematd.audit]"), 4) << log;
  // Users' calls are not audit lines.
  EXPECT_EQ(log.find("admin bob"), std::string::npos) << log;
  EXPECT_EQ(log.find("admin alice"), std::string::npos) << log;
}

TEST(AuthenticatorTest, TheThirdFieldMayOnlyBeAdmin) {
  char tmpl[] = "/tmp/remat-auth-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/users") << "t1 alice\nt2 bob root\n";
  auto bad = Authenticator::Load(dir + "/users", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("users:2: expected \"TOKEN USER [admin]\""),
            std::string::npos)
      << bad.status();
  std::ofstream(dir + "/users") << "t1 alice\nt2 bob admin\n";
  auto good = Authenticator::Load(dir + "/users", "");
  ASSERT_TRUE(good.ok()) << good.status();
  auto bob = good->Check(Role::kUser, "Bearer t2");
  ASSERT_TRUE(bob.ok());
  EXPECT_TRUE(bob->admin);
  EXPECT_TRUE(bob->sees_all);
  auto alice = good->Check(Role::kUser, "Bearer t1");
  ASSERT_TRUE(alice.ok());
  EXPECT_FALSE(alice->admin);
  EXPECT_FALSE(alice->sees_all);
  // Workers have no admin field.
  std::ofstream(dir + "/workers") << "w1 node admin\n";
  EXPECT_FALSE(Authenticator::Load("", dir + "/workers").ok());
  std::filesystem::remove_all(dir);
}

TEST_F(OperatorTest, ReloadingTheTokenFilesTakesEffectAndABadFileChangesNothing) {
  CoordinatorOptions o;
  o.user_tokens_file = Write("users", "alice-token alice\nbob-token bob\n");
  o.worker_tokens_file = Write("workers", "worker-token node\n");
  Start(o);
  v1::ListSearchesResponse list;
  ASSERT_EQ(List("bob-token", &list), grpc::StatusCode::OK);
  ASSERT_EQ(List("carol-token", &list), grpc::StatusCode::UNAUTHENTICATED);

  // Bob revoked, carol added, alice made an admin.
  Write("users", "alice-token alice admin\ncarol-token carol\n");
  ASSERT_TRUE(coordinator_->ReloadTokens().ok());
  EXPECT_EQ(List("bob-token", &list), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(List("carol-token", &list), grpc::StatusCode::OK);
  SubmitAs("carol-token", "c");
  ASSERT_EQ(List("alice-token", &list), grpc::StatusCode::OK);
  EXPECT_EQ(list.searches_size(), 1);  // carol's, seen by the admin

  // An empty, a malformed and a missing file: refused, the tokens in use stay.
  for (const std::string& text : {std::string("# nothing\n"), std::string("just-a-token\n")}) {
    Write("users", text);
    absl::Status reloaded = coordinator_->ReloadTokens();
    EXPECT_EQ(reloaded.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(reloaded.message().find("user-tokens"), std::string::npos) << reloaded;
    EXPECT_EQ(List("carol-token", &list), grpc::StatusCode::OK);
  }
  std::filesystem::remove(dir_ + "/users");
  EXPECT_NE(coordinator_->ReloadTokens().message().find("cannot read"), std::string::npos);
  EXPECT_EQ(List("carol-token", &list), grpc::StatusCode::OK);
  // A token in both files is refused on reload as on start.
  Write("users", "worker-token carol\n");
  EXPECT_FALSE(coordinator_->ReloadTokens().ok());
  EXPECT_EQ(List("carol-token", &list), grpc::StatusCode::OK);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  EXPECT_NE(log_.str().find("keeping the 2 user and 1 worker tokens in use"), std::string::npos)
      << log_.str();
}

TEST_F(OperatorTest, RpcMetricsCarryTheStatusCodeAndTheProcessSeriesExist) {
  CoordinatorOptions o;
  o.user_tokens_file = Write("users", "alice-token alice\n");
  o.metrics_listen = "127.0.0.1:0";
  o.user_rate_limit = 0.01;  // no refill within the test
  o.user_rate_burst = 5;
  Start(o);
  v1::ListSearchesResponse list;
  EXPECT_EQ(List("", &list), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(List("nope", &list), grpc::StatusCode::UNAUTHENTICATED);
  v1::GetSearchRequest get;
  get.set_id("s-none");
  v1::Search s;
  EXPECT_EQ(users_->GetSearch(Ctx("alice-token").get(), get, &s).error_code(),
            grpc::StatusCode::NOT_FOUND);
  const std::string id = SubmitAs("alice-token", "m");
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.AddMetadata("authorization", "Bearer alice-token");
    v1::WatchSearchRequest req;
    req.set_id(id);
    auto reader = users_->WatchSearch(&ctx, req);
    v1::SearchProgress p;
    ASSERT_TRUE(reader->Read(&p));
    const std::string during = HttpGet(coordinator_->metrics_port(), "/metrics");
    EXPECT_NE(during.find("remat_watch_streams 1\n"), std::string::npos) << during;
    ctx.TryCancel();
    reader->Finish();
  }
  // Burst of 5 used by: GetSearch, SubmitSearch, WatchSearch; two more, then refused.
  EXPECT_EQ(List("alice-token", &list), grpc::StatusCode::OK);
  EXPECT_EQ(List("alice-token", &list), grpc::StatusCode::OK);
  EXPECT_EQ(List("alice-token", &list), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // The stream's end is recorded by the reactor after the client saw it: wait for it.
  std::string body;
  for (int i = 0; i < 100; ++i) {
    body = HttpGet(coordinator_->metrics_port(), "/metrics");
    if (body.find("remat_watch_streams 0\n") != std::string::npos &&
        body.find("method=\"WatchSearch\"") != std::string::npos &&
        body.find("remat_rpc_duration_seconds_count{code=\"CANCELLED\",method=\"WatchSearch\"} "
                  "1") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const char* want : {
           "remat_rpc_duration_seconds_count{code=\"UNAUTHENTICATED\",method=\"ListSearches\"} 2",
           "remat_rpc_duration_seconds_count{code=\"RESOURCE_EXHAUSTED\",method=\"ListSearches\"} 1",
           "remat_rpc_duration_seconds_count{code=\"OK\",method=\"ListSearches\"} 2",
           "remat_rpc_duration_seconds_count{code=\"NOT_FOUND\",method=\"GetSearch\"} 1",
           "remat_rpc_duration_seconds_count{code=\"OK\",method=\"SubmitSearch\"} 1",
           "remat_rpc_duration_seconds_count{code=\"CANCELLED\",method=\"WatchSearch\"} 1",
           "remat_rpc_duration_seconds_count{code=\"OK\",method=\"ReportTrial\"} 0",
           "remat_watch_streams 0\n", "process_resident_memory_bytes ", "process_open_fds ",
           "process_max_fds ", "process_cpu_seconds_total ", "process_start_time_seconds ",
           "process_virtual_memory_bytes "}) {
    EXPECT_NE(body.find(want), std::string::npos) << want << "\n" << body;
  }
  // Plausible values: some memory, a handful of descriptors, started within a day.
  auto value = [&](const std::string& name) {
    const auto at = body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + name.size() + 2));
  };
  EXPECT_GT(value("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(value("process_open_fds"), 3);
  EXPECT_GE(value("process_max_fds"), value("process_open_fds"));
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(value("process_start_time_seconds"), now, 86400);

  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed";
  }
  const std::string page = Write("metrics.txt", body);
  const std::string cmd = "promtool check metrics < " + page + " > " + dir_ + "/out 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir_ + "/out");
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << out << "\n" << body;
}

}  // namespace
}  // namespace remat::server
