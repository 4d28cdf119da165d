// The coordinator over a real gRPC channel on loopback: submit -> lease -> report -> frontier,
// watch streams, health, auth refusals, graceful shutdown and the metrics page (promtool).
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "remat/v1/remat.grpc.pb.h"
#include "search/frontier.h"
#include "search/rules.h"
#include "server/coordinator.h"
#include "tests/server/test_util.h"

namespace remat::server {
namespace {

using testing::Entry;
using testing::SmallSpec;
using testing::Submit;
using testing::Worker;

std::chrono::system_clock::time_point Deadline(double s = 10) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

// A context with a deadline and, when given, a bearer token.
std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "", double deadline_s = 10) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(Deadline(deadline_s));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

// The exhaustive replay table for SmallSpec: every valid policy, each with distinct figures.
std::map<std::string, v1::ReplayEntry> FullTable(const search::SearchSpec& spec) {
  std::map<std::string, v1::ReplayEntry> table;
  int i = 0;
  for (const auto& p : search::EnumerateValidPolicies(spec)) {
    ++i;
    table[p.ToString()] = Entry(100 - 7 * i, 0.5 + 0.05 * i * (i % 3));
  }
  return table;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/remat-grpc-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ + "/" + name) << text;
    return dir_ + "/" + name;
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

class GrpcTest : public ::testing::Test {
 protected:
  void Start(CoordinatorOptions o = {}) {
    if (o.db_path.empty()) o.db_path = ":memory:";
    o.listen = "127.0.0.1:0";
    auto c = Coordinator::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    ASSERT_TRUE(coordinator_->Start().ok());
    ASSERT_GT(coordinator_->port(), 0);
    channel_ = grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials());
    users_ = v1::RematService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown(std::chrono::seconds(1));
  }

  // Runs every trial the coordinator hands to one worker until `search_id` ends.
  void RunWorker(const std::string& search_id, const std::string& token = "",
                 const std::string& user_token = "") {
    v1::RegisterResponse reg;
    ASSERT_TRUE(workers_->Register(Ctx(token).get(), Worker(2), &reg).ok());
    for (int rounds = 0; rounds < 200; ++rounds) {
      v1::GetSearchRequest get;
      get.set_id(search_id);
      v1::Search s;
      // Workers don't read searches; the test peeks with the anonymous user API.
      ASSERT_TRUE(users_->GetSearch(Ctx(user_token).get(), get, &s).ok());
      if (s.state() == v1::SEARCH_STATE_SUCCEEDED || s.state() == v1::SEARCH_STATE_FAILED) return;
      v1::LeaseTrialRequest lease;
      lease.set_worker_id(reg.worker_id());
      lease.set_free_slots(2);
      lease.set_wait_s(0.2);
      v1::LeaseTrialResponse got;
      ASSERT_TRUE(workers_->LeaseTrial(Ctx(token).get(), lease, &got).ok());
      for (const auto& a : got.trials()) {
        v1::ReportTrialRequest report;
        report.set_worker_id(reg.worker_id());
        report.set_trial_id(a.trial_id());
        report.set_attempt(a.attempt());
        if (a.replay_found()) {
          *report.mutable_result() = a.replay().result();
        } else {
          report.mutable_result()->set_status(v1::TRIAL_STATUS_FAILED);
          report.mutable_result()->set_message("not in replay table");
        }
        v1::ReportTrialResponse ack;
        ASSERT_TRUE(workers_->ReportTrial(Ctx(token).get(), report, &ack).ok());
        EXPECT_TRUE(ack.accepted());
      }
    }
    FAIL() << "search did not finish";
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::RematService::Stub> users_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

TEST_F(GrpcTest, SubmitLeaseReportFrontierAndWatch) {
  Start();
  search::SearchSpec spec = SmallSpec("e2e");
  spec.search.strategy = search::StrategyKind::kExhaustive;
  spec.search.max_trials = 100;
  const auto table = FullTable(spec);
  v1::SubmitSearchResponse submitted;
  ASSERT_TRUE(users_->SubmitSearch(Ctx().get(), Submit(spec, table), &submitted).ok());
  ASSERT_EQ(submitted.id().rfind("s-", 0), 0u);

  // Two watchers, started before any trial runs.
  auto watch = [&](std::vector<v1::SearchProgress>* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(30));
    v1::WatchSearchRequest req;
    req.set_id(submitted.id());
    auto reader = users_->WatchSearch(&ctx, req);
    v1::SearchProgress p;
    while (reader->Read(&p)) out->push_back(p);
    return reader->Finish();
  };
  std::vector<v1::SearchProgress> seen1, seen2;
  auto w1 = std::async(std::launch::async, watch, &seen1);
  auto w2 = std::async(std::launch::async, watch, &seen2);

  RunWorker(submitted.id());

  ASSERT_TRUE(w1.get().ok());
  ASSERT_TRUE(w2.get().ok());
  for (const auto* seen : {&seen1, &seen2}) {
    ASSERT_FALSE(seen->empty());
    EXPECT_EQ(seen->back().state(), v1::SEARCH_STATE_SUCCEEDED);
    EXPECT_EQ(seen->back().trials_done(), static_cast<int>(table.size()));
  }

  v1::GetSearchRequest get;
  get.set_id(submitted.id());
  v1::Search s;
  ASSERT_TRUE(users_->GetSearch(Ctx().get(), get, &s).ok());
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(s.trials_size(), static_cast<int>(table.size()));

  // The frontier, computed independently from the table.
  std::vector<search::TrialResult> results;
  for (const auto& [policy, entry] : table) {
    v1::TrialResult r = entry.result();
    r.mutable_policy()->set_canonical(policy);
    results.push_back(*proto::FromProto(r));
  }
  auto expected = search::ComputeFrontier(results, search::MemoryMetric::kReserved, 80ULL << 30);
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(s.frontier_size(), static_cast<int>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(s.frontier(static_cast<int>(i)), expected[i].policy.ToString());
  }
  const auto rec = search::RecommendPolicy(spec, results);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(s.recommendation(), rec->choice.policy.ToString());
  EXPECT_EQ(s.apply().megatron_bridge(), rec->choice.policy.MegatronBridgeOverrides());
  EXPECT_EQ(s.recommendation_detail().choice().policy(), s.recommendation());
  EXPECT_EQ(s.recommendation_detail().reason(), rec->reason);
  EXPECT_EQ(s.recommendation_detail().tied_size(), static_cast<int>(rec->tied.size()));

  v1::ListSearchesResponse list;
  ASSERT_TRUE(users_->ListSearches(Ctx().get(), v1::ListSearchesRequest(), &list).ok());
  ASSERT_EQ(list.searches_size(), 1);
  EXPECT_EQ(list.searches(0).recommendation(), s.recommendation());

  v1::SubmitSearchRequest bad = Submit(spec, table);
  bad.mutable_spec()->mutable_model()->set_num_layers(-1);
  v1::SubmitSearchResponse ignored;
  grpc::Status st = users_->SubmitSearch(Ctx().get(), bad, &ignored);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("num_layers"), std::string::npos) << st.error_message();
}

TEST_F(GrpcTest, HealthServiceSaysServing) {
  Start();
  grpc::GenericStub generic(channel_);
  grpc::ByteBuffer request;  // HealthCheckRequest{service: ""} encodes to nothing
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) { done.set_value(s); });
  ASSERT_TRUE(done.get_future().get().ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

// The health status (empty service) through the generic stub: 1 SERVING, 2 NOT_SERVING.
int HealthStatus(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub generic(channel);
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) { done.set_value(s); });
  if (!done.get_future().get().ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : -1;
}

// A restart listens before it re-plans its queued searches: the port answers (health
// NOT_SERVING) while they are resumed, and every search is there once it serves.
TEST_F(GrpcTest, ARestartListensBeforeItResumesItsSearches) {
  TempDir dir;
  CoordinatorOptions o;
  o.db_path = dir.path() + "/remat.db";
  Start(o);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    const search::SearchSpec spec = SmallSpec("queued-" + std::to_string(i));
    v1::SubmitSearchResponse submitted;
    ASSERT_TRUE(users_->SubmitSearch(Ctx().get(), Submit(spec, FullTable(spec)), &submitted).ok());
    ids.push_back(submitted.id());
  }
  coordinator_->Shutdown(std::chrono::seconds(1));
  coordinator_.reset();

  int while_resuming = 0;
  o.on_listening = [&](const std::string& address) {
    while_resuming = HealthStatus(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  };
  Start(o);
  EXPECT_EQ(while_resuming, 2);  // NOT_SERVING, and answering
  EXPECT_EQ(HealthStatus(channel_), 1);
  for (const std::string& id : ids) {
    v1::GetSearchRequest get;
    get.set_id(id);
    v1::Search s;
    EXPECT_TRUE(users_->GetSearch(Ctx().get(), get, &s).ok()) << id;
  }
}

TEST_F(GrpcTest, AuthRefusals) {
  TempDir dir;
  CoordinatorOptions o;
  o.user_tokens_file = dir.Write("users", "# users\nalice-token alice\nbob-token bob\n");
  o.worker_tokens_file = dir.Write("workers", "worker-token node-1\n");
  Start(o);

  v1::SubmitSearchResponse submitted;
  search::SearchSpec spec = SmallSpec("auth");
  const auto table = std::map<std::string, v1::ReplayEntry>{{"selective:[]", Entry(10, 1)}};
  EXPECT_EQ(users_->SubmitSearch(Ctx().get(), Submit(spec, table), &submitted).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(users_->SubmitSearch(Ctx("nope").get(), Submit(spec, table), &submitted).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(
      users_->SubmitSearch(Ctx("worker-token").get(), Submit(spec, table), &submitted).error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(
      users_->SubmitSearch(Ctx("alice-token").get(), Submit(spec, table), &submitted).ok());

  v1::RegisterResponse reg;
  EXPECT_EQ(workers_->Register(Ctx().get(), Worker(1), &reg).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(workers_->Register(Ctx("alice-token").get(), Worker(1), &reg).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(workers_->Register(Ctx("worker-token").get(), Worker(1), &reg).ok());

  v1::GetSearchRequest get;
  get.set_id(submitted.id());
  v1::Search s;
  EXPECT_TRUE(users_->GetSearch(Ctx("alice-token").get(), get, &s).ok());
  EXPECT_EQ(s.owner(), "alice");
  EXPECT_EQ(users_->GetSearch(Ctx("bob-token").get(), get, &s).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::CancelSearchRequest cancel;
  cancel.set_id(submitted.id());
  v1::CancelSearchResponse cancelled;
  EXPECT_EQ(users_->CancelSearch(Ctx("bob-token").get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::ListSearchesResponse list;
  ASSERT_TRUE(users_->ListSearches(Ctx("bob-token").get(), {}, &list).ok());
  EXPECT_EQ(list.searches_size(), 0);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    ctx.AddMetadata("authorization", "Bearer bob-token");
    v1::WatchSearchRequest req;
    req.set_id(submitted.id());
    auto reader = users_->WatchSearch(&ctx, req);
    v1::SearchProgress p;
    EXPECT_FALSE(reader->Read(&p));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  RunWorker(submitted.id(), "worker-token", "alice-token");
  EXPECT_TRUE(users_->CancelSearch(Ctx("alice-token").get(), cancel, &cancelled).error_code() ==
              grpc::StatusCode::FAILED_PRECONDITION);  // already finished, but visible to her
}

// The holder of one worker token could lease under another worker's id and report a
// made-up result into any search. A worker id is bound to the token that registered it, and a
// result is accepted only for the lease it answers.
// What a caller sends is never quoted back whole: a 10 KB search id is NOT_FOUND (its status
// message would otherwise outgrow the reply's trailers), a 1 MB hostname is refused by name,
// and a registration of millions of slots or backends never reaches the store.
TEST_F(GrpcTest, OversizedIdsAndRegistrationsAreRefusedPlainly) {
  Start();
  const std::string long_id(10 << 10, 's');
  v1::GetSearchRequest get;
  get.set_id(long_id);
  v1::Search s;
  grpc::Status st = users_->GetSearch(Ctx("").get(), get, &s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message().size();
  EXPECT_LE(st.error_message().size(), 200u);
  v1::CancelSearchRequest cancel;
  cancel.set_id(long_id);
  v1::CancelSearchResponse cancelled;
  EXPECT_EQ(users_->CancelSearch(Ctx("").get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::WatchSearchRequest watch;
  watch.set_id(long_id);
  grpc::ClientContext watch_ctx;
  auto reader = users_->WatchSearch(&watch_ctx, watch);
  v1::SearchProgress p;
  while (reader->Read(&p)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  // A 100 KB value in a spec is refused by name, its echo cut.
  const search::SearchSpec spec = SmallSpec("long-backend");
  v1::SubmitSearchRequest submit = Submit(spec, FullTable(spec));
  submit.mutable_spec()->mutable_search()->set_backend(std::string(100 << 10, 'b'));
  v1::SubmitSearchResponse submitted;
  st = users_->SubmitSearch(Ctx("").get(), submit, &submitted);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().rfind("search.backend: ", 0), 0u) << st.error_message().size();
  EXPECT_LE(st.error_message().size(), 4096u);

  v1::RegisterRequest big = Worker(1);
  big.set_hostname(std::string(1 << 20, 'h'));
  v1::RegisterResponse reg;
  st = workers_->Register(Ctx("").get(), big, &reg);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().rfind("hostname: ", 0), 0u) << st.error_message().substr(0, 200);
  EXPECT_LE(st.error_message().size(), 200u);
  big = Worker(1);
  for (int i = 0; i < 100000; ++i) big.add_backends("b");
  EXPECT_EQ(workers_->Register(Ctx("").get(), big, &reg).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  big = Worker(1);
  const v1::Gpu gpu = big.gpus(0);
  for (int i = 0; i < 70000; ++i) *big.add_gpus() = gpu;
  EXPECT_EQ(workers_->Register(Ctx("").get(), big, &reg).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(workers_->Register(Ctx("").get(), Worker(8), &reg).ok());
}

TEST_F(GrpcTest, AWorkerIdIsBoundToTheTokenThatRegisteredIt) {
  TempDir dir;
  CoordinatorOptions o;
  o.user_tokens_file = dir.Write("users", "alice-token alice\n");
  o.worker_tokens_file = dir.Write("workers", "token-a node-a\ntoken-b node-b\n");
  Start(o);
  const search::SearchSpec spec = SmallSpec("bound");
  v1::SubmitSearchResponse submitted;
  ASSERT_TRUE(users_->SubmitSearch(Ctx("alice-token").get(), Submit(spec, FullTable(spec)),
                                   &submitted).ok());
  v1::RegisterResponse reg_a, reg_b;
  ASSERT_TRUE(workers_->Register(Ctx("token-a").get(), Worker(1), &reg_a).ok());
  v1::LeaseTrialRequest lease;
  lease.set_worker_id(reg_a.worker_id());
  lease.set_free_slots(1);
  v1::LeaseTrialResponse leased;
  ASSERT_TRUE(workers_->LeaseTrial(Ctx("token-a").get(), lease, &leased).ok());
  ASSERT_EQ(leased.trials_size(), 1);
  const v1::TrialAssignment& a = leased.trials(0);

  // Token b under a's id: every call is refused.
  v1::LeaseTrialResponse stolen;
  EXPECT_EQ(workers_->LeaseTrial(Ctx("token-b").get(), lease, &stolen).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(reg_a.worker_id());
  v1::HeartbeatResponse hb_out;
  EXPECT_EQ(workers_->Heartbeat(Ctx("token-b").get(), hb, &hb_out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::RegisterRequest again = Worker(1);
  again.set_worker_id(reg_a.worker_id());
  EXPECT_EQ(workers_->Register(Ctx("token-b").get(), again, &reg_b).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportTrialRequest forged;
  forged.set_worker_id(reg_a.worker_id());
  forged.set_trial_id(a.trial_id());
  forged.set_attempt(a.attempt());
  *forged.mutable_result() = a.replay().result();
  forged.mutable_result()->set_tokens_per_s(1e12);
  v1::ReportTrialResponse ack;
  EXPECT_EQ(workers_->ReportTrial(Ctx("token-b").get(), forged, &ack).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Token b under its own id: not the lease of a's trial, so not accepted.
  ASSERT_TRUE(workers_->Register(Ctx("token-b").get(), Worker(1), &reg_b).ok());
  forged.set_worker_id(reg_b.worker_id());
  ASSERT_TRUE(workers_->ReportTrial(Ctx("token-b").get(), forged, &ack).ok());
  EXPECT_FALSE(ack.accepted());

  // An absurd id is refused as such, without echoing it.
  v1::HeartbeatRequest huge;
  huge.set_worker_id(std::string(20000, 'w'));
  grpc::Status st = workers_->Heartbeat(Ctx("token-a").get(), huge, &hb_out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_LT(st.error_message().size(), 200u);

  // The real worker's report counts, and the search shows its figure, not the forged one.
  v1::ReportTrialRequest real = forged;
  real.set_worker_id(reg_a.worker_id());
  *real.mutable_result() = a.replay().result();
  ASSERT_TRUE(workers_->ReportTrial(Ctx("token-a").get(), real, &ack).ok());
  EXPECT_TRUE(ack.accepted());
  v1::GetSearchRequest get;
  get.set_id(submitted.id());
  v1::Search s;
  ASSERT_TRUE(users_->GetSearch(Ctx("alice-token").get(), get, &s).ok());
  for (const auto& t : s.trials()) {
    if (t.id() != a.trial_id()) continue;
    EXPECT_EQ(t.worker_id(), reg_a.worker_id());
    EXPECT_LT(t.result().tokens_per_s(), 1e12);
  }
}

TEST_F(GrpcTest, ShutdownEndsLongPollsAndWatchStreamsPromptly) {
  Start();
  v1::SubmitSearchResponse submitted;
  const auto table = std::map<std::string, v1::ReplayEntry>{{"selective:[]", Entry(10, 1)}};
  ASSERT_TRUE(users_->SubmitSearch(Ctx().get(), Submit(SmallSpec("x"), table), &submitted).ok());
  v1::RegisterResponse reg;
  ASSERT_TRUE(workers_->Register(Ctx().get(), Worker(1), &reg).ok());

  auto long_poll = std::async(std::launch::async, [&] {
    v1::LeaseTrialRequest lease;
    lease.set_worker_id(reg.worker_id());
    lease.set_free_slots(0);  // nothing fits: it waits
    lease.set_wait_s(10);
    v1::LeaseTrialResponse got;
    return workers_->LeaseTrial(Ctx("", 30).get(), lease, &got);
  });
  auto watch = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(30));
    v1::WatchSearchRequest req;
    req.set_id(submitted.id());
    auto reader = users_->WatchSearch(&ctx, req);
    v1::SearchProgress p;
    while (reader->Read(&p)) {
    }
    return reader->Finish();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  coordinator_->Shutdown(std::chrono::seconds(5));
  coordinator_->Wait();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 3.0);
  EXPECT_TRUE(long_poll.get().ok());
  EXPECT_EQ(watch.get().error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GrpcTest, APortInUseIsAnError) {
  Start();
  CoordinatorOptions o;
  o.db_path = ":memory:";
  o.listen = "127.0.0.1:" + std::to_string(coordinator_->port());
  auto second = Coordinator::Create(o);
  ASSERT_TRUE(second.ok());
  absl::Status st = (*second)->Start();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
}

TEST_F(GrpcTest, ServesTlsWhenGivenACertificate) {
  TempDir dir;
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + dir.path() + "/key.pem -out " +
      dir.path() + "/cert.pem > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl cannot make a test certificate";
  CoordinatorOptions o;
  o.tls_cert_file = dir.path() + "/cert.pem";
  o.tls_key_file = dir.path() + "/key.pem";
  o.worker_tokens_file = dir.Write("workers", "worker-token\n");
  Start(o);

  // Plain text is refused by a TLS listener.
  v1::RegisterResponse reg;
  EXPECT_FALSE(workers_->Register(Ctx("worker-token", 3).get(), Worker(1), &reg).ok());

  std::ifstream in(o.tls_cert_file);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  // The certificate names IP 127.0.0.1 too: no name lookup (a machine may lack /etc/hosts).
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator_->port()),
                                     grpc::SslCredentials(ssl));
  auto workers = v1::WorkerService::NewStub(channel);
  ASSERT_TRUE(workers->Register(Ctx("worker-token").get(), Worker(1), &reg).ok());
  EXPECT_EQ(workers->Register(Ctx("wrong").get(), Worker(1), &reg).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

// One user over their request rate is refused with RESOURCE_EXHAUSTED and a one-line
// reason; another user is not slowed down.
TEST_F(GrpcTest, UsersOverTheirRequestRateAreRefused) {
  TempDir dir;
  CoordinatorOptions o;
  o.user_tokens_file = dir.Write("users", "alice-token alice\nbob-token bob\n");
  o.user_rate_limit = 0.01;  // no refill within the test
  o.user_rate_burst = 3;
  Start(o);
  v1::ListSearchesRequest list;
  v1::ListSearchesResponse got;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(users_->ListSearches(Ctx("alice-token").get(), list, &got).ok()) << i;
  }
  grpc::Status over = users_->ListSearches(Ctx("alice-token").get(), list, &got);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(over.error_message().rfind("user alice is over 0.01 requests/s (burst 3); retry in ", 0),
            0u)
      << over.error_message();
  EXPECT_EQ(over.error_message().find('\n'), std::string::npos);
  // Every user call counts, a watch too.
  v1::WatchSearchRequest watch;
  watch.set_id("s-none");
  auto ctx = Ctx("alice-token");
  auto stream = users_->WatchSearch(ctx.get(), watch);
  v1::SearchProgress p;
  EXPECT_FALSE(stream->Read(&p));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(users_->ListSearches(Ctx("bob-token").get(), list, &got).ok());
  // A bad token is refused as such, not counted against anyone.
  EXPECT_EQ(users_->ListSearches(Ctx("nope").get(), list, &got).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(CoordinatorOptionsTest, BadOptionsNameTheOption) {
  CoordinatorOptions o;
  o.db_path = ":memory:";
  o.listen = "nowhere";
  EXPECT_NE(Coordinator::Create(o).status().message().find("listen"), std::string::npos);
  o.listen = "127.0.0.1:0";
  o.max_trial_attempts = 0;
  EXPECT_NE(Coordinator::Create(o).status().message().find("max-attempts"), std::string::npos);
  o.max_trial_attempts = 3;
  o.tls_cert_file = "cert.pem";
  EXPECT_EQ(Coordinator::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.tls_cert_file.clear();
  o.user_tokens_file = "/nonexistent/users";
  EXPECT_NE(Coordinator::Create(o).status().message().find("user-tokens"), std::string::npos);
  o.user_tokens_file.clear();
  o.user_rate_limit = -1;
  EXPECT_NE(Coordinator::Create(o).status().message().find("user-rate-limit"), std::string::npos);
  o.user_rate_limit = 20;
  o.user_rate_burst = 0.5;
  EXPECT_NE(Coordinator::Create(o).status().message().find("user-rate-burst"), std::string::npos);
  o.user_rate_burst = 100;
  o.unserved_search_timeout_s = -1;
  EXPECT_NE(Coordinator::Create(o).status().message().find("unserved-search-timeout"),
            std::string::npos);
}

// ------------------------------------------------------------------------------ metrics page

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST_F(GrpcTest, MetricsPagePassesPromtool) {
  CoordinatorOptions o;
  o.metrics_listen = "127.0.0.1:0";
  Start(o);
  // Some activity: a finished search and an active one with a frontier.
  search::SearchSpec spec = SmallSpec("m");
  spec.search.strategy = search::StrategyKind::kExhaustive;
  spec.search.max_trials = 100;
  v1::SubmitSearchResponse done;
  ASSERT_TRUE(users_->SubmitSearch(Ctx().get(), Submit(spec, FullTable(spec)), &done).ok());
  RunWorker(done.id());
  spec.train.seed = 7;  // another measurement: not from the cache
  v1::SubmitSearchResponse active;
  ASSERT_TRUE(users_->SubmitSearch(Ctx().get(), Submit(spec, FullTable(spec)), &active).ok());

  const std::string response = HttpGet(coordinator_->metrics_port(), "/metrics");
  const auto body_at = response.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos) << response;
  const std::string body = response.substr(body_at + 4);
  for (const char* name :
       {"remat_build_info{version=", "remat_searches{state=\"succeeded\"} 1",
        "remat_searches{state=\"queued\"} 1", "remat_trials_total{status=\"ok\"} ",
        "remat_trial_duration_seconds_bucket", "remat_queue_depth", "remat_trials_leased",
        "remat_workers_connected 1", "remat_gpus{state=\"free\"} 2", "remat_gpus{state=\"busy\"} 0",
        "remat_trials_reused_total",
        "remat_rpc_duration_seconds_count{code=\"OK\",method=\"LeaseTrial\"}"}) {
    EXPECT_NE(body.find(name), std::string::npos) << name << "\n" << body;
  }
  EXPECT_EQ(body.find("search_id=\"" + done.id() + "\""), std::string::npos)
      << "finished searches leave remat_frontier_points";
  EXPECT_NE(body.find("remat_frontier_points{search_id=\"" + active.id() + "\"} 0"),
            std::string::npos);

  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed";
  }
  TempDir dir;
  const std::string page = dir.Write("metrics.txt", body);
  const std::string cmd = "promtool check metrics < " + page + " > " + dir.path() + "/out 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir.path() + "/out");
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << out << "\n" << body;
}

}  // namespace
}  // namespace remat::server
