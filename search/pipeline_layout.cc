#include "search/pipeline_layout.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <utility>

namespace remat::search {
namespace {

constexpr const char* kField = "parallel.pipeline_model_parallel_layout";
constexpr size_t kMaxItems = size_t{1} << 20;

Status LayoutError(const std::string& why) {
  return InvalidArgument(std::string(kField) + ": " + why);
}

// The repeat count of "*N" at text[at] (at points at the '*'): N and the index after its digits,
// or false when no digits follow (Megatron's patterns need \d+).
bool RepeatAt(const std::string& text, size_t at, size_t* count, size_t* end) {
  if (at >= text.size() || text[at] != '*') return false;
  size_t i = at + 1, n = 0;
  if (i >= text.size() || !std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    n = std::min(n * 10 + static_cast<size_t>(text[i] - '0'), kMaxItems + 1);
  }
  *count = n;
  *end = i;
  return true;
}

// Appends `times` copies of `piece`, refusing an unrolled layout over kMaxItems characters.
Status AppendRepeated(const std::string& piece, size_t times, std::string* out) {
  if (!piece.empty() && times > (kMaxItems - std::min(kMaxItems, out->size())) / piece.size()) {
    return LayoutError("unrolls to more than " + std::to_string(kMaxItems) + " items");
  }
  for (size_t k = 0; k < times; ++k) out->append(piece);
  return OkStatus();
}

// re.sub(r'\(([^)]+)\)\*(\d+)', ...): at each '(' the group runs to the first ')'; a match needs
// a non-empty group and "*N" after it; otherwise the '(' is kept and the scan moves on.
StatusOr<std::string> UnrollGroups(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '(') {
      const size_t close = text.find(')', i + 1);
      size_t count = 0, end = 0;
      if (close != std::string::npos && close > i + 1 && RepeatAt(text, close + 1, &count, &end)) {
        REMAT_SEARCH_RETURN_IF_ERROR(AppendRepeated(text.substr(i + 1, close - i - 1), count, &out));
        i = end;
        continue;
      }
    }
    out.push_back(text[i++]);
  }
  return out;
}

// re.sub(r'(.)\*(\d+)', ...): any character followed by "*N" becomes N copies of it.
StatusOr<std::string> UnrollCharacters(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    size_t count = 0, end = 0;
    if (text[i] != '\n' && RepeatAt(text, i + 1, &count, &end)) {
      REMAT_SEARCH_RETURN_IF_ERROR(AppendRepeated(std::string(1, text[i]), count, &out));
      i = end;
      continue;
    }
    out.push_back(text[i++]);
  }
  return out;
}

LayoutStage Count(const std::string& items) {
  LayoutStage s;
  for (char c : items) {
    if (c == 't') ++s.decoder;
    if (c == 'm') ++s.mtp;
    if (c == 'E') s.embedding = true;
    if (c == 'L') s.loss = true;
  }
  return s;
}

// Megatron's validate_layer_layout over the unrolled stages, PP and the spec's counts.
Status CheckItems(const SearchSpec& spec, const std::vector<std::string>& stages, int pp) {
  std::string flat;
  for (const std::string& s : stages) flat += s;
  if (flat.empty() || flat.front() != 'E') {
    return LayoutError("the first item must be the embedding E");
  }
  if (flat.back() != 'L') return LayoutError("the last item must be the loss L");
  if (std::count(flat.begin(), flat.end(), 'E') != 1) {
    return LayoutError("the embedding E must appear exactly once");
  }
  if (std::count(flat.begin(), flat.end(), 'L') != 1) {
    return LayoutError("the loss L must appear exactly once");
  }
  const long decoders = std::count(flat.begin(), flat.end(), 't');
  if (decoders != spec.model.num_layers) {
    return LayoutError("holds " + std::to_string(decoders) +
                       " transformer layers t, model.num_layers is " +
                       std::to_string(spec.model.num_layers));
  }
  const long mtp = std::count(flat.begin(), flat.end(), 'm');
  if (mtp != MtpLayerCount(spec)) {
    return LayoutError("holds " + std::to_string(mtp) + " MTP layers m, model.mtp_num_layers is " +
                       std::to_string(MtpLayerCount(spec)));
  }
  const size_t first_m = flat.find('m');
  if (first_m != std::string::npos && flat.find('t', first_m) != std::string::npos) {
    return LayoutError("transformer layers t must all come before the MTP layers m");
  }
  if (stages.front().find('E') == std::string::npos) {
    return LayoutError("the embedding E must be in the first stage (Megatron Core builds it there "
                       "whatever the layout says)");
  }
  if (stages.back().find('L') == std::string::npos) {
    return LayoutError("the loss L must be in the last stage (Megatron Core builds it there "
                       "whatever the layout says)");
  }
  const int vpp = static_cast<int>(stages.size()) / pp;
  for (size_t k = 0; k < stages.size(); ++k) {
    const int rank = static_cast<int>(k) % pp, chunk = static_cast<int>(k) / pp;
    const long m = std::count(stages[k].begin(), stages[k].end(), 'm');
    if (m == 0) continue;
    if (chunk != vpp - 1) {
      return LayoutError("MTP layers m must be in the last virtual chunk of their pipeline rank "
                         "(stage " + std::to_string(k) + " is chunk " + std::to_string(chunk) +
                         " of rank " + std::to_string(rank) + ")");
    }
    if (m != mtp) return LayoutError("all the MTP layers m must be in one stage");
    if (rank == 0 && pp > 1) {
      return LayoutError("MTP layers m cannot be on the first pipeline rank");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<std::string>> UnrollLayout(const std::string& text) {
  std::string plain;
  for (char c : text) {
    if (c != ',') plain.push_back(c);
  }
  StatusOr<std::string> groups = UnrollGroups(plain);
  if (!groups.ok()) return groups.status();
  StatusOr<std::string> items = UnrollCharacters(*groups);
  if (!items.ok()) return items.status();
  std::vector<std::string> stages(1);
  for (char c : *items) {
    if (c == '|') {
      stages.emplace_back();
    } else if (c == 'E' || c == 't' || c == 'm' || c == 'L') {
      stages.back().push_back(c);
    } else {
      return LayoutError(std::string("unknown character '") + c +
                         "' (known: E embedding, t transformer layer, m MTP layer, L loss, | "
                         "between stages, (..)*N and x*N repeats, commas)");
    }
  }
  return stages;
}

StatusOr<int> LayoutStageCount(const std::string& text) {
  StatusOr<std::vector<std::string>> stages = UnrollLayout(text);
  if (!stages.ok()) return stages.status();
  return static_cast<int>(stages->size());
}

int MtpLayerCount(const SearchSpec& spec) {
  return std::max(0, spec.model.mtp_num_layers.value_or(0));
}

Status ValidateLayoutField(const SearchSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  if (p.pipeline_model_parallel_layout.empty()) return OkStatus();
  if (p.num_layers_in_first_pipeline_stage || p.num_layers_in_last_pipeline_stage ||
      p.account_for_embedding_in_pipeline_split || p.account_for_loss_in_pipeline_split) {
    return LayoutError(
        "cannot be set with num_layers_in_first_pipeline_stage, "
        "num_layers_in_last_pipeline_stage or account_for_*_in_pipeline_split (Megatron Core "
        "refuses the combination)");
  }
  StatusOr<std::vector<std::string>> stages = UnrollLayout(p.pipeline_model_parallel_layout);
  if (!stages.ok()) return stages.status();
  const int pp = std::max(1, p.pipeline_model_parallel_size);
  const int count = static_cast<int>(stages->size());
  if (count % pp != 0) {
    return LayoutError(std::to_string(count) +
                       " stages, not a multiple of pipeline_model_parallel_size (" +
                       std::to_string(pp) + ")");
  }
  const int vpp = count / pp;
  const int declared = p.virtual_pipeline_model_parallel_size.value_or(1);
  if (vpp != p.VirtualChunks()) {
    return LayoutError(std::to_string(count) + " stages over pipeline_model_parallel_size " +
                       std::to_string(pp) + " mean " + std::to_string(vpp) +
                       " virtual chunks per rank; set parallel.virtual_pipeline_model_parallel_size"
                       " to " + std::to_string(vpp) + " (it is " +
                       (p.virtual_pipeline_model_parallel_size ? std::to_string(declared)
                                                               : std::string("null")) +
                       ")");
  }
  return CheckItems(spec, *stages, pp);
}

std::shared_ptr<const PipelineLayout> LayoutOf(const SearchSpec& spec) {
  const std::string& text = spec.parallel.pipeline_model_parallel_layout;
  if (text.empty()) return nullptr;
  const int pp = std::max(1, spec.parallel.pipeline_model_parallel_size);
  static std::mutex mu;
  static auto* cache =
      new std::map<std::pair<std::string, int>, std::shared_ptr<const PipelineLayout>>();
  const auto key = std::make_pair(text, pp);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  std::shared_ptr<PipelineLayout> layout;
  StatusOr<std::vector<std::string>> stages = UnrollLayout(text);
  if (stages.ok() && stages->size() % pp == 0) {
    layout = std::make_shared<PipelineLayout>();
    layout->pp = pp;
    layout->vpp = static_cast<int>(stages->size()) / pp;
    int offset = 0;
    for (const std::string& s : *stages) {
      layout->stages.push_back(Count(s));
      layout->decoder_offset.push_back(offset);
      offset += layout->stages.back().decoder;
    }
  }
  // Specs in one process use a handful of layouts; an outsized one is kept only while used.
  if (text.size() > 4096 || (layout && layout->stages.size() > 4096)) return layout;
  std::lock_guard<std::mutex> lock(mu);
  if (cache->size() > 64) cache->clear();
  cache->emplace(key, layout);
  return layout;
}

}  // namespace remat::search
