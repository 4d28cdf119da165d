// A stand-in for remat-trial in the worker tests: reads the TrialRequest and behaves as the
// request's spec.name says, so a test can make a rank succeed, OOM, crash, exit, or hang.
//
//   ok           writes an ok result (peaks and step time scale with the rank); the message
//                echoes NCCL_NVLS_ENABLE and CUDA_VISIBLE_DEVICES so tests can check the env
//   oom          writes an oom result
//   crash        prints to stderr, then aborts (no result file)
//   exit3        prints to stderr, exits 3 (no result file)
//   hang         starts a grandchild (`sleep 1000`, pid written to grandchild.pid in the
//                working directory), then sleeps forever
//   rank1-crash  rank 1 crashes at once; the other ranks hang
//   rank1-oom    rank 1 writes an oom result and exits 0; the other ranks hang (as a rank whose
//                peer left in the middle of a collective)
//   fifo-result  puts a FIFO (no writer) where the result should be, and its stderr log, then
//                exits 0
//   bad-utf8     writes an ok result whose message holds bytes that are not UTF-8
//   layout-oom   a layout proxy's oom (search/layout_proxy.h): one process speaks for the layout,
//                the stage that ran out of memory is rank 12
// `--version` prints key=value lines.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "remat/v1/remat.pb.h"

namespace {

void Hang() {
  while (true) pause();
}

const char* Env(const char* name) {
  const char* v = getenv(name);
  return v ? v : "<unset>";
}

}  // namespace

int main(int argc, char** argv) {
  std::string request_path, result_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--version") {
      std::cout << "torch=fake-1.0\ncuda=none\nnccl=none\ndevice=cpu\n";
      return 0;
    }
    if (a == "--request" && i + 1 < argc) request_path = argv[++i];
    if (a == "--result" && i + 1 < argc) result_path = argv[++i];
  }
  remat::v1::TrialRequest request;
  std::ifstream in(request_path, std::ios::binary);
  if (!in || !request.ParseFromIstream(&in)) {
    std::cerr << "error: --request: cannot read " << request_path << std::endl;
    return 2;
  }
  const std::string mode = request.spec().name();
  const int rank = request.rank();
  remat::v1::TrialResult result;
  *result.mutable_policy() = request.policy();
  remat::v1::RankResult* rr = result.add_ranks();
  rr->set_rank(rank);

  if (mode == "ok") {
    result.set_status(remat::v1::TRIAL_STATUS_OK);
    rr->set_peak_allocated_bytes(1000 * (rank + 1));
    rr->set_peak_reserved_bytes(2000 * (rank + 1));
    result.set_step_time_s(0.1 * (rank + 1));
    result.set_loss(2.5 + rank);
    result.set_grad_norm(1.5);
    result.set_message(std::string("NCCL_NVLS_ENABLE=") + Env("NCCL_NVLS_ENABLE") +
                       " CUDA_VISIBLE_DEVICES=" + Env("CUDA_VISIBLE_DEVICES") +
                       " world=" + std::to_string(request.world_size()) +
                       " rendezvous=" + request.rendezvous_dir());
  } else if (mode == "fifo-result") {
    std::cerr << "about to leave a FIFO" << std::endl;
    unlink(result_path.c_str());
    if (mkfifo(result_path.c_str(), 0600) != 0) return 1;
    return 0;
  } else if (mode == "bad-utf8") {
    result.set_status(remat::v1::TRIAL_STATUS_OK);
    result.set_step_time_s(0.1);
    result.set_message("MARK");
    std::string bytes = result.SerializeAsString();
    bytes.replace(bytes.find("MARK"), 4, "\xff\xfe\xc3(");  // written past the serializer
    std::ofstream(result_path, std::ios::binary) << bytes;
    return 0;
  } else if (mode == "oom" || (mode == "rank1-oom" && rank == 1)) {
    result.set_status(remat::v1::TRIAL_STATUS_OOM);
    rr->set_failing_request_bytes(1 << 20);
    result.set_message("out of memory: tried to allocate 1 MiB");
  } else if (mode == "layout-oom") {
    result.set_status(remat::v1::TRIAL_STATUS_OOM);
    result.set_predicted(true);
    rr->set_rank(12);
    rr->set_failing_request_bytes(1 << 20);
    result.set_message("layout proxy, stage 3 (rank 12): out of memory");
  } else if (mode == "crash" || (mode == "rank1-crash" && rank == 1)) {
    std::cerr << "starting rank " << rank << "\nfatal: something broke in rank " << rank
              << std::endl;
    abort();
  } else if (mode == "exit3") {
    std::cerr << "error: model.hidden_size: bad value" << std::endl;
    return 3;
  } else if (mode == "hang" || mode == "rank1-crash" || mode == "rank1-oom") {
    pid_t child = fork();
    if (child == 0) {
      execlp("sleep", "sleep", "1000", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::ofstream("grandchild.pid") << child << std::endl;
    Hang();
  } else {
    std::cerr << "fake_remat_trial: unknown mode " << mode << std::endl;
    return 2;
  }
  std::ofstream out(result_path, std::ios::binary);
  if (!result.SerializeToOstream(&out)) return 1;
  return 0;
}
