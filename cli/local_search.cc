#include "cli/local_search.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/client.h"
#include "cli/progress_printer.h"
#include "cli/render.h"
#include "cli/submit_request.h"
#include "common/main_util.h"
#include "common/version.h"
#include "proto/convert.h"
#include "search/layout_proxy.h"
#include "search/noise.h"
#include "server/coordinator.h"
#include "worker/slots.h"
#include "worker/worker_daemon.h"
#include "worker/worker_setup.h"

namespace remat::cli {
namespace {

namespace fs = std::filesystem;

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

// A temporary folder removed when this goes out of scope.
class ScratchDir {
 public:
  ScratchDir() {
    std::error_code ec;
    fs::path tmp = fs::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    std::string templ = (tmp / "remat-search-XXXXXX").string();
    if (mkdtemp(templ.data())) path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int Fail(std::ostream& err, int code, const std::string& message) {
  err << "error: " << message << std::endl;
  return code;
}

// The slots of the embedded worker: the selected GPUs (enough for a trial's world), or plain CPU
// slots where the spec runs on CPU or the machine has no GPU. 0, or the exit code (the error
// written to `err`).
int SelectLocalSlots(const search::SearchSpec& spec, const std::string& gpu_list,
                     std::vector<worker::Slot>* slots, std::ostream& err) {
  const int world = search::TrialSlots(spec);
  std::vector<worker::Slot> gpus;
  if (spec.search.device != search::Device::kCpu) gpus = worker::DiscoverGpus();
  if (auto checked = worker::SelectSlots(gpus, gpu_list); !checked.ok()) {
    return Fail(err, 2, std::string(checked.status().message()));
  }
  if (gpus.empty()) {
    if (spec.search.device == search::Device::kCuda) {
      return Fail(err, 1,
                  "search.device is cuda, but this machine has no GPU (nvidia-smi found none)");
    }
    *slots = worker::PlainSlots(world);
    return 0;
  }
  auto selected = worker::SelectSlots(gpus, gpu_list);
  if (!selected.ok()) return Fail(err, 2, std::string(selected.status().message()));
  *slots = *selected;
  if (static_cast<int>(slots->size()) < world) {
    return Fail(err, 1,
                "parallel: a trial of world size " + std::to_string(world) + " needs " +
                    std::to_string(world) + " GPUs; this machine offers " +
                    std::to_string(slots->size()));
  }
  return 0;
}

// The backend the spec asks for (worker/worker_setup.h, shared with remat-worker), set in
// `wopts`. 0, or the exit code (the error written to `err`).
int SetUpLocalBackend(const search::SearchSpec& spec, const LocalSearchOptions& options,
                      worker::WorkerDaemonOptions* wopts, std::ostream& err) {
  worker::BackendFlags backends;
  backends.builtin = spec.search.backend == search::Backend::kBuiltin
                         ? worker::BackendFlags::Builtin::kRequired
                         : worker::BackendFlags::Builtin::kOff;
  backends.trial_binary = options.trial_binary;
  backends.command_templates = options.command_templates;
  backends.megatron = spec.search.backend == search::Backend::kMegatron;
  backends.megatron_path = options.megatron_path;
  backends.python = options.python;
  std::string warning;
  if (absl::Status set_up =
          worker::SetUpBackends(backends, common::SelfDir(), "remat", wopts, &warning);
      !set_up.ok()) {
    return Fail(err, set_up.code() == absl::StatusCode::kInvalidArgument ? 2 : 1,
                std::string(set_up.message()));
  }
  return 0;
}

// Follows search `id` to its end, its progress on `out`; on an interrupt, cancels it. Returns
// the search as it ended.
absl::StatusOr<v1::Search> Follow(RematClient& client, const std::string& id,
                                  const LocalSearchOptions& options, const std::string& metric,
                                  std::ostream& out, std::ostream& err) {
  auto interrupted = [&] { return options.interrupted && options.interrupted->load(); };
  ProgressPrinter printer(out, options.tty, metric);
  absl::Status watched = client.Watch(
      id, [&](const v1::SearchProgress& p) { printer.Update(p); }, interrupted);
  printer.Finish();
  // Should the stream fail, poll until the search is final.
  absl::StatusOr<v1::Search> result = client.Get(id);
  while (!interrupted() && result.ok() && !IsFinal(result->state())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    result = client.Get(id);
  }
  if (interrupted()) {
    err << "error: interrupted; cancelling search " << id << std::endl;
    (void)client.Cancel(id);
    result = client.Get(id);
  }
  return result;
}

// Writes the result JSON and SVG where asked; returns `code`, or 1 when a file cannot be written.
int WriteResultFiles(const v1::Search& result, const LocalSearchOptions& options, int code,
                     std::ostream& out, std::ostream& err) {
  if (!options.json_path.empty()) {
    if (WriteFile(options.json_path, ResultJson(result))) {
      out << "\nwrote " << options.json_path << "\n";
    } else {
      err << "error: --json: cannot write " << options.json_path << std::endl;
      code = 1;
    }
  }
  if (!options.svg_path.empty()) {
    if (WriteFile(options.svg_path, ResultSvg(result))) {
      out << (options.json_path.empty() ? "\n" : "") << "wrote " << options.svg_path << "\n";
    } else {
      err << "error: --svg: cannot write " << options.svg_path << std::endl;
      code = 1;
    }
  }
  return code;
}

}  // namespace

int RunLocalSearch(const LocalSearchOptions& options, std::ostream& out, std::ostream& err) {
  auto fail = [&](int code, const std::string& message) { return Fail(err, code, message); };

  // The spec (and its replay table), checked before anything starts.
  auto request = BuildSubmitRequest(options.spec_path);
  if (!request.ok()) return fail(2, std::string(request.status().message()));
  auto spec = proto::FromProto(request->spec());
  if (!spec.ok()) return fail(2, spec.status().message());

  std::vector<worker::Slot> slots;
  if (int code = SelectLocalSlots(*spec, options.gpus, &slots, err); code != 0) return code;
  // Where the builtin engine's trials will run is known here: search.device auto on a machine
  // without a GPU is the CPU, and the plan is made for it (the memory model adds what only CUDA
  // allocates otherwise). The result's spec says so. Replayed tables keep their device (their
  // figures were measured elsewhere), and a command's device is its own.
  if (spec->search.backend == search::Backend::kBuiltin &&
      spec->search.device == search::Device::kAuto && !slots.front().gpu) {
    spec->search.device = search::Device::kCpu;
    *request->mutable_spec() = proto::ToProto(*spec);
  }
  worker::WorkerDaemonOptions wopts;
  if (int code = SetUpLocalBackend(*spec, options, &wopts, err); code != 0) return code;

  ScratchDir scratch;
  if (scratch.path().empty()) return fail(1, "cannot create a temporary folder");

  // The coordinator.
  server::CoordinatorOptions copts;
  copts.listen = "127.0.0.1:0";
  copts.db_path = options.db_path.empty() ? scratch.path() + "/remat.db" : options.db_path;
  copts.heartbeat_interval_s = 1;
  copts.lease_timeout_s = 60;
  auto coordinator = server::Coordinator::Create(copts);
  if (!coordinator.ok()) return fail(1, "coordinator: " + coordinator.status().ToString());
  absl::Status started = (*coordinator)->Start();
  if (!started.ok()) return fail(1, "coordinator: " + started.ToString());
  const std::string address = (*coordinator)->address();

  // The worker.
  wopts.connection.target = address;
  wopts.slots = slots;
  wopts.work_dir = options.work_dir.empty() ? scratch.path() + "/worker" : options.work_dir;
  wopts.lease_wait_s = 1;
  wopts.backoff_initial_s = 0.05;
  wopts.backoff_max_s = 1;
  auto daemon = worker::WorkerDaemon::Create(wopts);
  if (!daemon.ok()) return fail(1, "worker: " + daemon.status().ToString());
  absl::Status worker_status;
  std::thread worker_thread([&] { worker_status = (*daemon)->Run(); });
  auto stop_all = [&] {
    (*daemon)->Stop();
    worker_thread.join();
    (*coordinator)->Shutdown(std::chrono::seconds(2));
  };

  // Submit and follow.
  ClientOptions client_options;
  client_options.coordinator = address;
  client_options.timeout_s = 60;
  auto client = RematClient::Connect(client_options);
  auto id = client->Submit(*request);
  if (!id.ok()) {
    stop_all();
    return fail(ExitCode(id.status()), DescribeError(id.status(), client_options));
  }
  std::string slot_desc = slots[0].gpu ? std::to_string(slots.size()) + " GPU(s)"
                                       : std::to_string(slots.size()) + " CPU slot(s)";
  out << "search " << *id << " (" << spec->name << "): " << search::Name(spec->search.strategy)
      << " strategy, backend " << search::Name(spec->search.backend) << ", on " << slot_desc
      << " of this machine" << std::endl;
  const std::string routing = search::RoutingNoiseCaution(*spec);
  if (!routing.empty()) out << "note: measurement: " << routing << std::endl;

  auto interrupted = [&] { return options.interrupted && options.interrupted->load(); };
  const absl::StatusOr<v1::Search> result =
      Follow(*client, *id, options, search::Name(spec->search.memory_metric), out, err);
  if (!result.ok()) {
    stop_all();
    return fail(1, DescribeError(result.status(), client_options));
  }

  out << "\n";
  RenderReport(*result, out);
  // The contract: exit 0 whenever the search completes, even when nothing fits or no trial could
  // measure anything (the report and the JSON say why); 1 when it did not complete.
  int code = result->state() == v1::SEARCH_STATE_SUCCEEDED ||
                     result->state() == v1::SEARCH_STATE_FAILED
                 ? 0
                 : 1;
  code = WriteResultFiles(*result, options, code, out, err);
  out << std::flush;
  stop_all();
  if (interrupted()) return 1;
  if (code != 0) {
    err << "error: search " << *id << " did not complete (" << StateName(result->state()) << ")"
        << std::endl;
  }
  return code;
}

}  // namespace remat::cli
