// What a trial ran with (trial_runner.h: TrialVersions, EngineVersions): remat's and LibTorch's
// versions and, on a GPU, CUDA's, NCCL's, the driver's and the device's name.
#include <torch/version.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/version.h"
#include "engine/trial_runner.h"

#ifdef REMAT_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace remat::engine {

namespace {

#ifdef REMAT_WITH_CUDA
// The NVIDIA kernel driver's release ("550.54.15"), from the file the driver publishes; else the
// CUDA driver API version the runtime reports; "none" without CUDA.
std::string DriverVersion() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(in, line)) {
    const std::string marker = "Kernel Module";
    const size_t at = line.find(marker);
    if (at != std::string::npos) {
      // "... Kernel Module  550.54.15  ..." or "... Open Kernel Module for x86_64  570.86.15 ...":
      // the first word after the marker that starts with a digit.
      std::istringstream rest(line.substr(at + marker.size()));
      std::string word;
      while (rest >> word) {
        if (std::isdigit(static_cast<unsigned char>(word[0]))) return word;
      }
    }
  }
  int api = 0;
  if (cudaDriverGetVersion(&api) == cudaSuccess && api > 0) {
    return "cuda-api-" + std::to_string(api / 1000) + "." + std::to_string(api % 1000 / 10);
  }
  return "none";
}
#endif

// What the engine runs with on `device` (a CUDA device index, or -1 for the CPU): the CUDA-side
// entries are "none" for the CPU, whatever the build could do.
std::vector<std::pair<std::string, std::string>> VersionsOn(int cuda_device) {
  std::vector<std::pair<std::string, std::string>> v;
  v.emplace_back("remat", common::kVersion);
  v.emplace_back("torch", TORCH_VERSION);
  std::string cuda = "none", nccl = "none", driver = "none", gpu = "none";
  std::string device = "cpu";
#ifdef REMAT_WITH_CUDA
  if (cuda_device >= 0) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
    int version = 0;
    ncclGetVersion(&version);
    nccl = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
           std::to_string(version % 100);
    driver = DriverVersion();
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, cuda_device) == cudaSuccess) gpu = prop.name;
    device = "cuda";
  }
#else
  (void)cuda_device;
#endif
  v.emplace_back("cuda", cuda);
  v.emplace_back("nccl", nccl);
  v.emplace_back("driver", driver);
  v.emplace_back("gpu", gpu);
  v.emplace_back("device", device);
  return v;
}

}  // namespace

std::map<std::string, std::string> TrialVersions(bool on_cuda, int device_index) {
  std::map<std::string, std::string> out;
  for (auto& [key, value] : VersionsOn(on_cuda ? device_index : -1)) out[key] = value;
  const char* alloc_conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  out["allocator_conf"] = alloc_conf != nullptr && *alloc_conf != '\0' ? alloc_conf : "none";
  return out;
}

std::vector<std::pair<std::string, std::string>> EngineVersions() {
  int first_gpu = -1;
#ifdef REMAT_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) first_gpu = 0;
#endif
  return VersionsOn(first_gpu);
}

}  // namespace remat::engine
