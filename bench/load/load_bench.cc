// remat-load-bench: many simulated workers and many queued trials against one coordinator.
//
// Starts rematd as a separate process (so its CPU time and peak RSS can be read from /proc),
// submits searches (exhaustive strategy over a synthetic replay table, a seed of their own each
// so the results cache does not join them), then runs N simulated workers in this process:
// gRPC callback clients on loopback, no thread per worker, each registering, heartbeating,
// long-polling LeaseTrial, "running" each trial for its replay entry's wall_s and reporting it.
// It stops by itself when every trial is reported (or at --timeout) and prints lease latency,
// trials/s and the coordinator's CPU seconds and peak RSS.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bench/load/rematd_process.h"
#include "proto/convert.h"
#include "remat/v1/remat.grpc.pb.h"
#include "search/rules.h"
#include "search/spec.h"

namespace {

using remat::bench::RematdProcess;
using remat::bench::ScrapeMetrics;
using remat::bench::ServerQuantileMs;

using Clock = std::chrono::steady_clock;
using remat::v1::LeaseTrialRequest;
using remat::v1::LeaseTrialResponse;
namespace v1 = remat::v1;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Options {
  int workers = 1000;
  int trials = 10000;
  int slots = 1;
  int layers = 46;  // dense model: 8 selective + 2 x 46 full policies = 100 per search
  double wall_min_s = 1.0;
  double wall_max_s = 3.0;
  double lease_wait_s = 5;
  double ramp_s = 2;  // workers come online spread over this long
  double timeout_s = 600;
  int connections = 0;  // 0: one per worker
  std::string rematd;
  std::string log_level = "info";
  std::string db;  // "": a file in the temporary folder
};

// One thread running callbacks at given times.
class Timer {
 public:
  Timer() : thread_([this] { Loop(); }) {}
  ~Timer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void At(Clock::time_point t, std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      heap_.push(Item{t, seq_++, std::move(f)});
    }
    cv_.notify_one();
  }

 private:
  struct Item {
    Clock::time_point t;
    uint64_t seq;
    std::function<void()> f;
    bool operator>(const Item& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (heap_.empty()) {
        cv_.wait(lock);
        continue;
      }
      if (heap_.top().t > Clock::now()) {
        cv_.wait_until(lock, heap_.top().t);
        continue;
      }
      auto f = std::move(const_cast<Item&>(heap_.top()).f);
      heap_.pop();
      lock.unlock();
      f();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap_;
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// Latency samples in seconds.
class Samples {
 public:
  void Add(double s) {
    std::lock_guard<std::mutex> lock(mu_);
    v_.push_back(s);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return v_.size();
  }
  double Quantile(double q) {
    std::lock_guard<std::mutex> lock(mu_);
    if (v_.empty()) return 0;
    std::sort(v_.begin(), v_.end());
    size_t i = static_cast<size_t>(q * static_cast<double>(v_.size() - 1) + 0.5);
    return v_[std::min(i, v_.size() - 1)];
  }

 private:
  std::mutex mu_;
  std::vector<double> v_;
};

std::atomic<int64_t> g_inflight{0};  // calls started and not yet completed

template <typename Req, typename Resp>
struct Call {
  Call() { ++g_inflight; }
  ~Call() { --g_inflight; }
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
  Clock::time_point start = Clock::now();
};

class Bench;

struct SimWorker {
  int index = 0;
  v1::WorkerService::Stub* stub = nullptr;
  std::string id;
  std::mutex mu;
  int running = 0;
  bool leasing = false;
  std::set<std::string> running_ids;
};

class Bench {
 public:
  Bench(const Options& o, std::vector<std::unique_ptr<v1::WorkerService::Stub>>* stubs,
        int64_t expected)
      : o_(o), expected_(expected) {
    for (int i = 0; i < o.workers; ++i) {
      auto w = std::make_unique<SimWorker>();
      w->index = i;
      w->stub = (*stubs)[static_cast<size_t>(i) % stubs->size()].get();
      workers_.push_back(std::move(w));
    }
  }

  // Workers come online spread evenly over `ramp_s` (a thousand daemons do not start within
  // the same millisecond; with ramp 0 they do, and the first wave of leases queues).
  void Start() {
    const auto now = Clock::now();
    for (auto& w : workers_) {
      const double at = o_.ramp_s * w->index / static_cast<double>(workers_.size());
      SimWorker* ptr = w.get();
      timer_.At(now + std::chrono::microseconds(static_cast<int64_t>(at * 1e6)),
                [this, ptr] { Register(ptr); });
    }
  }

  // Waits until every trial is reported or the deadline passes; true when all were.
  bool Wait(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [this] { return done_ >= expected_; });
  }

  // No new calls; waits (up to `wait`) for the calls in flight to complete.
  void Stop(Clock::duration wait) {
    stopping_ = true;
    const auto until = Clock::now() + wait;
    while (g_inflight.load() > 0 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  int64_t done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  Samples lease_with_work, lease_empty, report, heartbeat;
  std::atomic<int64_t> errors{0}, rejected{0}, cancels{0}, leased{0};

 private:
  static void Deadline(grpc::ClientContext* ctx, double s) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(s * 1000)));
  }

  void Register(SimWorker* w) {
    auto* call = new Call<v1::RegisterRequest, v1::RegisterResponse>();
    Deadline(&call->ctx, 30);
    call->req.set_hostname("sim-" + std::to_string(w->index));
    for (int i = 0; i < o_.slots; ++i) {
      v1::Gpu* g = call->req.add_gpus();
      g->set_index(i);
      g->set_name("sim-slot");
    }
    (*call->req.mutable_versions())["remat"] = "load-bench";
    call->req.add_backends("replay");
    w->stub->async()->Register(&call->ctx, &call->req, &call->resp,
                               [this, w, call](grpc::Status st) {
                                 if (!st.ok() && !stopping_) {
                                   ++errors;
                                   timer_.At(Clock::now() + std::chrono::milliseconds(500),
                                             [this, w] { Register(w); });
                                 } else if (st.ok()) {
                                   w->id = call->resp.worker_id();
                                   const double hb = call->resp.heartbeat_interval_s();
                                   ScheduleHeartbeat(w, hb);
                                   Lease(w);
                                 }
                                 delete call;
                               });
  }

  void ScheduleHeartbeat(SimWorker* w, double interval_s) {
    // Spread the workers' heartbeats over the interval.
    std::mt19937 rng(static_cast<uint32_t>(w->index));
    const double first = std::uniform_real_distribution<double>(0.1, interval_s)(rng);
    timer_.At(Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(first * 1000)),
              [this, w, interval_s] { Heartbeat(w, interval_s); });
  }

  void Heartbeat(SimWorker* w, double interval_s) {
    if (stopping_) return;
    auto* call = new Call<v1::HeartbeatRequest, v1::HeartbeatResponse>();
    Deadline(&call->ctx, 10);
    call->req.set_worker_id(w->id);
    {
      std::lock_guard<std::mutex> lock(w->mu);
      for (const auto& id : w->running_ids) call->req.add_running_trial_ids(id);
    }
    w->stub->async()->Heartbeat(&call->ctx, &call->req, &call->resp,
                                [this, w, call, interval_s](grpc::Status st) {
                                  heartbeat.Add(Seconds(Clock::now() - call->start));
                                  if (!st.ok()) ++errors;
                                  cancels += call->resp.cancel_trial_ids_size();
                                  delete call;
                                  timer_.At(Clock::now() + std::chrono::milliseconds(
                                                               static_cast<int64_t>(
                                                                   interval_s * 1000)),
                                            [this, w, interval_s] { Heartbeat(w, interval_s); });
                                });
  }

  void Lease(SimWorker* w) {
    int free = 0;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      if (stopping_ || w->leasing || w->running >= o_.slots) return;
      w->leasing = true;
      free = o_.slots - w->running;
    }
    auto* call = new Call<LeaseTrialRequest, LeaseTrialResponse>();
    Deadline(&call->ctx, o_.lease_wait_s + 30);
    call->req.set_worker_id(w->id);
    call->req.set_free_slots(free);
    call->req.set_wait_s(o_.lease_wait_s);
    w->stub->async()->LeaseTrial(
        &call->ctx, &call->req, &call->resp, [this, w, call](grpc::Status st) {
          const double took = Seconds(Clock::now() - call->start);
          {
            std::lock_guard<std::mutex> lock(w->mu);
            w->leasing = false;
            for (const auto& a : call->resp.trials()) {
              ++w->running;
              w->running_ids.insert(a.trial_id());
            }
          }
          if (!st.ok()) {
            ++errors;
            timer_.At(Clock::now() + std::chrono::milliseconds(200), [this, w] { Lease(w); });
            delete call;
            return;
          }
          (call->resp.trials_size() > 0 ? lease_with_work : lease_empty).Add(took);
          leased += call->resp.trials_size();
          for (const auto& a : call->resp.trials()) {
            const auto wall = std::chrono::milliseconds(static_cast<int64_t>(a.replay().wall_s() * 1000));
            timer_.At(Clock::now() + wall, [this, w, a] { Report(w, a); });
          }
          delete call;
          Lease(w);  // more free slots, or the long poll came back empty
        });
  }

  void Report(SimWorker* w, const v1::TrialAssignment& a) {
    auto* call = new Call<v1::ReportTrialRequest, v1::ReportTrialResponse>();
    Deadline(&call->ctx, 30);
    call->req.set_worker_id(w->id);
    call->req.set_trial_id(a.trial_id());
    call->req.set_attempt(a.attempt());
    if (a.replay_found()) {
      *call->req.mutable_result() = a.replay().result();
      call->req.mutable_result()->set_wall_s(a.replay().wall_s());
    } else {
      call->req.mutable_result()->set_status(v1::TRIAL_STATUS_FAILED);
      call->req.mutable_result()->set_message("not in replay table");
    }
    w->stub->async()->ReportTrial(
        &call->ctx, &call->req, &call->resp, [this, w, a, call](grpc::Status st) {
          report.Add(Seconds(Clock::now() - call->start));
          if (!st.ok()) {
            ++errors;  // deliver it again, as a worker would
            if (stopping_) {
              delete call;
              return;
            }
            timer_.At(Clock::now() + std::chrono::milliseconds(200), [this, w, a] { Report(w, a); });
            delete call;
            return;
          }
          if (!call->resp.accepted()) ++rejected;
          {
            std::lock_guard<std::mutex> lock(w->mu);
            --w->running;
            w->running_ids.erase(a.trial_id());
          }
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (call->resp.accepted()) ++done_;
          }
          cv_.notify_all();
          delete call;
          Lease(w);
        });
  }

  Options o_;
  const int64_t expected_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  Timer timer_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t done_ = 0;
};

std::string SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

remat::search::SearchSpec BenchSpec(int layers) {
  remat::search::SearchSpec s;
  s.name = "load-bench";
  s.model.num_layers = layers;
  s.model.hidden_size = 1024;
  s.model.num_attention_heads = 16;
  s.model.seq_length = 2048;
  s.model.vocab_size = 32000;
  s.search.backend = remat::search::Backend::kReplay;
  s.search.replay_table = "synthetic";
  s.search.strategy = remat::search::StrategyKind::kExhaustive;
  s.search.memory_budget_gib = 80;
  return s;
}

int Bad(const std::string& m) {
  std::fprintf(stderr, "error: %s\n", m.c_str());
  return 2;
}

// Reads the flags into `o`; an exit code when the program is to end (help, a bad flag).
std::optional<int> ParseOptions(int argc, char** argv, Options& o) {
  CLI::App app{"remat-load-bench: simulated workers and queued trials against one rematd",
               "remat-load-bench"};
  app.add_option("--workers", o.workers, "simulated workers")->capture_default_str();
  app.add_option("--trials", o.trials, "trials to run (rounded up to whole searches)")
      ->capture_default_str();
  app.add_option("--slots", o.slots, "slots per worker")->capture_default_str();
  app.add_option("--layers", o.layers,
                 "layers of the benchmark model (sets the policies per search: 8 + 2 x layers)")
      ->capture_default_str();
  app.add_option("--wall-min", o.wall_min_s, "shortest replayed trial, seconds")
      ->capture_default_str();
  app.add_option("--wall-max", o.wall_max_s, "longest replayed trial, seconds")
      ->capture_default_str();
  app.add_option("--lease-wait", o.lease_wait_s, "LeaseTrial long-poll wait_s")
      ->capture_default_str();
  app.add_option("--ramp", o.ramp_s, "seconds over which the workers come online")
      ->capture_default_str();
  app.add_option("--connections", o.connections,
                 "gRPC connections shared by the workers (0: one per worker)")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "give up after this many seconds")
      ->capture_default_str();
  app.add_option("--rematd", o.rematd, "rematd binary (default: next to this program)");
  app.add_option("--log-level", o.log_level, "rematd --log-level")->capture_default_str();
  app.add_option("--db", o.db, "rematd --db (default: a file in a temporary folder; :memory: "
                               "takes the disk out of the picture)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (o.workers < 1) return Bad("--workers: must be at least 1");
  if (o.trials < 1) return Bad("--trials: must be at least 1");
  if (o.slots < 1) return Bad("--slots: must be at least 1");
  if (o.wall_min_s < 0 || o.wall_max_s < o.wall_min_s) {
    return Bad("--wall-min/--wall-max: need 0 <= min <= max");
  }
  if (o.rematd.empty()) o.rematd = SelfDir() + "/rematd";
  if (access(o.rematd.c_str(), X_OK) != 0) return Bad("--rematd: cannot run " + o.rematd);
  return std::nullopt;
}

// A thousand workers' connections: no SIGPIPE, as many open files as allowed, and Abseil's
// deadlock detection off (as in rematd).
void PrepareProcess() {
  signal(SIGPIPE, SIG_IGN);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as in rematd
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);
}

// The submission of one search: a replay table with an ok entry for every policy, its figures
// falling with the policy's index (the spec and each entry's wall_s are set per search).
v1::SubmitSearchRequest ReplaySubmission(const std::vector<remat::search::Policy>& policies) {
  v1::SubmitSearchRequest submit;
  int i = 0;
  for (const auto& p : policies) {
    ++i;
    v1::ReplayEntry& e = (*submit.mutable_replay_table()->mutable_trials())[p.ToString()];
    v1::TrialResult* r = e.mutable_result();
    r->set_status(v1::TRIAL_STATUS_OK);
    r->set_step_time_s(0.5 + 0.01 * i);
    r->set_tokens_per_s(2048 / r->step_time_s());
    v1::RankResult* rank = r->add_ranks();
    rank->set_peak_allocated_bytes(static_cast<uint64_t>(60 - 0.3 * i) << 30);
    rank->set_peak_reserved_bytes(static_cast<uint64_t>(62 - 0.3 * i) << 30);
  }
  return submit;
}

// Submits `searches` searches, each with a seed of its own and its wall_s drawn afresh for every
// trial (so trials of different searches do not finish in lock step). False on an error (said).
bool SubmitSearches(const std::string& address, remat::search::SearchSpec spec,
                    v1::SubmitSearchRequest submit, int searches, const Options& o) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> wall(o.wall_min_s, o.wall_max_s);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto users = v1::RematService::NewStub(channel);
  for (int s = 0; s < searches; ++s) {
    spec.train.seed = 1000 + static_cast<uint64_t>(s);
    spec.name = "load-bench-" + std::to_string(s);
    *submit.mutable_spec() = remat::proto::ToProto(spec);
    for (auto& [policy, entry] : *submit.mutable_replay_table()->mutable_trials()) {
      entry.set_wall_s(wall(rng));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SubmitSearchResponse resp;
    grpc::Status st = users->SubmitSearch(&ctx, submit, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "error: SubmitSearch: %s\n", st.error_message().c_str());
      return false;
    }
  }
  return true;
}

// The workers' stubs over `connections` connections of their own (and the channels they use).
struct WorkerStubs {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
};
WorkerStubs ConnectWorkers(const std::string& address, int connections) {
  WorkerStubs w;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    w.channels.push_back(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    w.stubs.push_back(v1::WorkerService::NewStub(w.channels.back()));
  }
  return w;
}

// What the run measured on the coordinator's side.
struct RunFigures {
  double submit_s = 0, run_s = 0;
  int64_t done = 0, expected = 0;
  double cpu_s = 0, peak_mib = 0, rss_mib = 0;
};

// The results: throughput, the latencies the workers saw, the coordinator's CPU and memory
// against the goal, and the coordinator's own view of its latencies (from its /metrics page).
void PrintResults(Bench& bench, const RunFigures& f, const std::string& page) {
  Samples& with_work = bench.lease_with_work;
  const double p50 = with_work.Quantile(0.50) * 1000, p99 = with_work.Quantile(0.99) * 1000;
  std::printf("\nresults\n");
  std::printf("  completed: %lld/%lld trials in %.1f s = %.0f trials/s (searches submitted "
              "in %.1f s)\n",
              static_cast<long long>(f.done), static_cast<long long>(f.expected), f.run_s,
              static_cast<double>(f.done) / f.run_s, f.submit_s);
  std::printf("  lease latency, calls answered with a trial (n=%zu): p50 %.2f ms, p99 %.2f ms, "
              "max %.2f ms\n",
              with_work.size(), p50, p99, with_work.Quantile(1.0) * 1000);
  std::printf("  lease calls answered empty after the long poll: %zu\n", bench.lease_empty.size());
  std::printf("  report latency (n=%zu): p50 %.2f ms, p99 %.2f ms\n", bench.report.size(),
              bench.report.Quantile(0.5) * 1000, bench.report.Quantile(0.99) * 1000);
  std::printf("  heartbeat latency (n=%zu): p50 %.2f ms, p99 %.2f ms\n", bench.heartbeat.size(),
              bench.heartbeat.Quantile(0.5) * 1000, bench.heartbeat.Quantile(0.99) * 1000);
  std::printf("  errors (retried): %lld, reports not accepted: %lld, cancels: %lld\n",
              static_cast<long long>(bench.errors.load()),
              static_cast<long long>(bench.rejected.load()),
              static_cast<long long>(bench.cancels.load()));
  std::printf("  coordinator: CPU %.1f s (user+sys) over %.1f s = %.2f cores; peak RSS %.0f MiB "
              "(now %.0f MiB)\n",
              f.cpu_s, f.run_s + f.submit_s, f.cpu_s / (f.run_s + f.submit_s), f.peak_mib,
              f.rss_mib);
  std::printf("  goal (1,000 workers, 10,000 trials): p99 lease latency < 20 ms: %s; "
              "coordinator < 512 MiB: %s\n",
              p99 < 20 ? "met" : "NOT met", f.peak_mib < 512 ? "met" : "NOT met");
  std::fflush(stdout);
  std::printf("  coordinator's view (remat_rpc_duration_seconds bucket bounds): LeaseTrial p50 "
              "<= %.1f ms, p99 <= %.1f ms; ReportTrial p50 <= %.1f ms, p99 <= %.1f ms\n",
              ServerQuantileMs(page, "LeaseTrial", 0.5), ServerQuantileMs(page, "LeaseTrial", 0.99),
              ServerQuantileMs(page, "ReportTrial", 0.5),
              ServerQuantileMs(page, "ReportTrial", 0.99));
  std::fflush(stdout);
}

// Runs the simulated workers until every trial is reported or the timeout, with progress every
// 5 s; prints the results and stops the coordinator. 0, or 1 on the timeout.
int RunWorkers(const Options& o, RematdProcess& rematd, RunFigures f, double cpu_start) {
  const int connections = o.connections > 0 ? std::min(o.connections, o.workers) : o.workers;
  WorkerStubs workers = ConnectWorkers(rematd.address, connections);
  auto bench = std::make_unique<Bench>(o, &workers.stubs, f.expected);
  const auto t1 = Clock::now();
  bench->Start();
  const auto deadline = t1 + std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  bool finished = false;
  while (!finished && Clock::now() < deadline) {
    finished = bench->Wait(std::min(deadline, Clock::now() + std::chrono::seconds(5)));
    std::printf("  %6.1f s: %lld/%lld trials reported, coordinator RSS %.0f MiB\n",
                Seconds(Clock::now() - t1), static_cast<long long>(bench->done()),
                static_cast<long long>(f.expected), rematd.StatusMiB("VmRSS"));
    std::fflush(stdout);
  }
  f.run_s = Seconds(Clock::now() - t1);
  f.done = bench->done();
  f.cpu_s = rematd.CpuSeconds() - cpu_start;
  f.peak_mib = rematd.StatusMiB("VmHWM");
  f.rss_mib = rematd.StatusMiB("VmRSS");
  // Stop the coordinator first, so long polls in flight end and the workers' calls return.
  PrintResults(*bench, f, rematd.metrics_port ? ScrapeMetrics(rematd.metrics_port) : "");
  const int stopped = rematd.Stop();
  if (stopped != 0) std::printf("  rematd exited %d\n", stopped);
  bench->Stop(std::chrono::seconds(10));
  return finished ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (std::optional<int> code = ParseOptions(argc, argv, o)) return *code;
  PrepareProcess();

  // The searches: exhaustive over every valid policy of the benchmark model.
  remat::search::SearchSpec spec = BenchSpec(o.layers);
  if (auto st = remat::search::ValidateSpec(spec); !st.ok()) return Bad(st.message());
  const auto policies = remat::search::EnumerateValidPolicies(spec);
  const int per_search = static_cast<int>(policies.size());
  const int searches = (o.trials + per_search - 1) / per_search;
  RunFigures f;
  f.expected = static_cast<int64_t>(searches) * per_search;

  char tmpl[] = "/tmp/remat-load-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string db = o.db.empty() ? dir + "/remat.db" : o.db;
  RematdProcess rematd = RematdProcess::Start(
      o.rematd, db, dir + "/rematd.log",
      {"--metrics-listen", "127.0.0.1:0", "--log-level", o.log_level});
  if (rematd.address.empty()) {
    std::fprintf(stderr, "error: rematd did not start (log: %s/rematd.log)\n", dir.c_str());
    rematd.Stop();
    return 1;
  }
  std::printf("remat-load-bench: %d workers x %d slot(s) (online over %.1f s), %lld trials in "
              "%d searches (%d policies each), replayed wall_s %.1f-%.1f s, lease wait_s %.1f\n",
              o.workers, o.slots, o.ramp_s, static_cast<long long>(f.expected), searches,
              per_search, o.wall_min_s, o.wall_max_s, o.lease_wait_s);
  std::printf("coordinator: rematd pid %d (separate process) on %s, db %s, log level %s\n",
              rematd.pid, rematd.address.c_str(),
              o.db.empty() ? (dir + "/remat.db").c_str() : o.db.c_str(), o.log_level.c_str());
  std::fflush(stdout);

  const double cpu_start = rematd.CpuSeconds();
  const auto t0 = Clock::now();
  if (!SubmitSearches(rematd.address, spec, ReplaySubmission(policies), searches, o)) {
    rematd.Stop();
    return 1;
  }
  f.submit_s = Seconds(Clock::now() - t0);
  const int rc = RunWorkers(o, rematd, f, cpu_start);
  std::filesystem::remove_all(dir);
  if (rc != 0) std::fprintf(stderr, "error: timed out after %.0f s\n", o.timeout_s);
  return rc;
}
