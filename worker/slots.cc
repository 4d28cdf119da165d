#include "worker/slots.h"

#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/process_runner.h"

namespace remat::worker {

absl::StatusOr<std::vector<Slot>> ParseNvidiaSmiCsv(const std::string& text) {
  std::vector<Slot> slots;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string trimmed(absl::StripAsciiWhitespace(line));
    if (trimmed.empty()) continue;
    std::vector<std::string> fields = absl::StrSplit(trimmed, ',');
    if (fields.size() != 3) {
      return absl::InvalidArgumentError("nvidia-smi: expected 'index, name, memory' in line '" +
                                        trimmed + "'");
    }
    for (auto& f : fields) f = std::string(absl::StripAsciiWhitespace(f));
    Slot slot;
    slot.gpu = true;
    slot.name = fields[1];
    uint64_t mib = 0;
    if (!absl::SimpleAtoi(fields[0], &slot.index) || slot.index < 0) {
      return absl::InvalidArgumentError("nvidia-smi: bad GPU index in line '" + trimmed + "'");
    }
    if (absl::SimpleAtoi(fields[2], &mib)) slot.memory_bytes = mib * 1024ull * 1024ull;
    slots.push_back(slot);
  }
  return slots;
}

std::vector<Slot> DiscoverGpus() {
  std::string out;
  if (!CaptureOutput(
          {"nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"},
          30, &out)) {
    return {};
  }
  auto parsed = ParseNvidiaSmiCsv(out);
  if (!parsed.ok()) return {};
  return *parsed;
}

std::vector<Slot> PlainSlots(int count) {
  std::vector<Slot> slots;
  for (int i = 0; i < count; ++i) {
    Slot s;
    s.index = i;
    s.name = "cpu-slot";
    slots.push_back(s);
  }
  return slots;
}

absl::StatusOr<std::vector<Slot>> SelectSlots(const std::vector<Slot>& gpus,
                                              const std::string& gpus_flag) {
  std::string flag(absl::StripAsciiWhitespace(gpus_flag));
  if (flag.empty()) return gpus.empty() ? PlainSlots(1) : gpus;
  std::vector<int> wanted;
  std::set<int> seen;
  for (absl::string_view part : absl::StrSplit(flag, ',')) {
    std::string item(absl::StripAsciiWhitespace(part));
    int index = -1;
    if (!absl::SimpleAtoi(item, &index) || index < 0) {
      return absl::InvalidArgumentError("--gpus: '" + item +
                                        "' is not a GPU index (write e.g. --gpus 0,1)");
    }
    if (!seen.insert(index).second) {
      return absl::InvalidArgumentError("--gpus: index " + item + " given twice");
    }
    wanted.push_back(index);
  }
  std::vector<Slot> slots;
  if (gpus.empty()) {
    for (int index : wanted) {
      Slot s;
      s.index = index;
      s.name = "cpu-slot";
      slots.push_back(s);
    }
    return slots;
  }
  for (int index : wanted) {
    bool found = false;
    for (const Slot& g : gpus) {
      if (g.index == index) {
        slots.push_back(g);
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError("--gpus: GPU " + std::to_string(index) +
                                        " not found (this machine has " +
                                        std::to_string(gpus.size()) + ")");
    }
  }
  return slots;
}

}  // namespace remat::worker
