// remat-submit-bench: what submitting the largest accepted specs costs everyone else, and what
// a restart with many of them queued costs. Starts rematd as a process (a database in a
// temporary folder), then:
//   1. submits --searches copies of the costliest spec of tests/search/largest_specs.h (MoE,
//      PP 4 x VPP 256, exhaustive) while another thread calls GetSearch on a small search
//      without pause: prints each submit's time and GetSearch's worst and 99th-percentile time;
//   2. kills rematd (SIGKILL) and starts it again on the same database: prints the time until
//      it printed its listening line and until GetSearch answered.
//
//   remat-submit-bench --rematd PATH [--searches N]
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/load/rematd_process.h"
#include "proto/convert.h"
#include "remat/v1/remat.grpc.pb.h"
#include "tests/search/largest_specs.h"

namespace {

using remat::bench::RematdProcess;

namespace v1 = remat::v1;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::unique_ptr<grpc::ClientContext> Ctx(double seconds) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return ctx;
}

}  // namespace

int main(int argc, char** argv) {
  std::string rematd;
  int searches = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rematd") == 0 && i + 1 < argc) {
      rematd = argv[++i];
    } else if (std::strcmp(argv[i], "--searches") == 0 && i + 1 < argc) {
      searches = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: remat-submit-bench --rematd PATH [--searches N]\n");
      return 2;
    }
  }
  if (rematd.empty()) {
    std::fprintf(stderr, "error: --rematd: required\n");
    return 2;
  }
  char dir_template[] = "/tmp/remat-submit-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string db = dir + "/remat.db", log = dir + "/rematd.log";

  RematdProcess coordinator = RematdProcess::Start(rematd, db, log, {"--user-rate-limit", "0"});
  auto channel = grpc::CreateChannel(coordinator.address, grpc::InsecureChannelCredentials());
  auto stub = v1::RematService::NewStub(channel);

  remat::search::SearchSpec small = remat::search::testing::LargestDense();
  small.name = "small";
  small.model.num_layers = 2;
  small.model.hidden_size = 64;
  small.model.num_attention_heads = 4;
  small.model.num_query_groups = 4;
  small.model.ffn_hidden_size = 256;
  small.model.seq_length = 128;
  small.model.vocab_size = 1000;
  small.train.global_batch_size.reset();
  small.search.memory_budget_gib = 80;
  small.search.max_trials = 40;
  // No worker runs them: the searches stay queued (the builtin backend would refuse the largest
  // model for a CPU trial at submit).
  small.search.backend = remat::search::Backend::kCommand;
  small.search.command_template = "bench";
  v1::SubmitSearchRequest small_request;
  *small_request.mutable_spec() = remat::proto::ToProto(small);
  v1::SubmitSearchResponse small_id;
  grpc::Status st = stub->SubmitSearch(Ctx(30).get(), small_request, &small_id);
  if (!st.ok()) {
    std::fprintf(stderr, "error: small search: %s\n", st.error_message().c_str());
    return 1;
  }

  remat::search::SearchSpec big = remat::search::testing::LargestSpecs().back().second;
  big.search.strategy = remat::search::StrategyKind::kExhaustive;
  big.search.backend = remat::search::Backend::kCommand;
  big.search.command_template = "bench";
  v1::SubmitSearchRequest big_request;
  *big_request.mutable_spec() = remat::proto::ToProto(big);

  std::atomic<bool> submitting{true};
  std::vector<double> gets;
  std::thread getter([&] {
    v1::GetSearchRequest get;
    get.set_id(small_id.id());
    while (submitting) {
      v1::Search s;
      const auto t0 = Clock::now();
      if (stub->GetSearch(Ctx(30).get(), get, &s).ok()) gets.push_back(MsSince(t0));
    }
  });
  double worst_submit = 0, total_submit = 0;
  for (int i = 0; i < searches; ++i) {
    v1::SubmitSearchResponse id;
    const auto t0 = Clock::now();
    st = stub->SubmitSearch(Ctx(60).get(), big_request, &id);
    const double ms = MsSince(t0);
    if (!st.ok()) {
      std::fprintf(stderr, "error: submit %d: %s\n", i, st.error_message().c_str());
      break;
    }
    worst_submit = std::max(worst_submit, ms);
    total_submit += ms;
  }
  submitting = false;
  getter.join();
  std::sort(gets.begin(), gets.end());
  const auto pct = [&](double q) {
    return gets.empty() ? 0.0
                        : gets[std::min(gets.size() - 1, static_cast<size_t>(q * gets.size()))];
  };
  std::printf("submit of the largest spec (%s, exhaustive) x %d: mean %.1f ms, worst %.1f ms\n",
              remat::search::testing::LargestSpecs().back().first.c_str(), searches,
              total_submit / std::max(1, searches), worst_submit);
  std::printf(
      "another search's GetSearch meanwhile: %zu calls, median %.2f ms, p99 %.2f ms, "
      "worst %.2f ms\n",
      gets.size(), pct(0.5), pct(0.99), gets.empty() ? 0.0 : gets.back());

  coordinator.Stop(SIGKILL);
  const auto t0 = Clock::now();
  coordinator = RematdProcess::Start(rematd, db, log, {"--user-rate-limit", "0"});
  const double listening_ms = MsSince(t0);
  channel = grpc::CreateChannel(coordinator.address, grpc::InsecureChannelCredentials());
  stub = v1::RematService::NewStub(channel);
  v1::GetSearchRequest get;
  get.set_id(small_id.id());
  double serving_ms = -1;
  for (int tries = 0; tries < 600; ++tries) {
    v1::Search s;
    if (stub->GetSearch(Ctx(30).get(), get, &s).ok()) {
      serving_ms = MsSince(t0);
      break;
    }
  }
  std::printf(
      "restart (SIGKILL, then the same database) with %d such searches queued: "
      "listening after %.0f ms, GetSearch answered after %.0f ms\n",
      searches + 1, listening_ms, serving_ms);
  coordinator.Stop();
  return 0;
}
