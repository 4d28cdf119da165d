#include "proto/convert.h"

#include <string>
#include <type_traits>
#include <vector>

#include "search/policy.h"
#include "search/spec_fields.h"
#include "search/text.h"

namespace remat::proto {
namespace {

using search::InvalidArgument;
using search::Status;
using search::StatusOr;

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// The section message of `spec` that holds field `f`.
const Message& SectionOf(const v1::SearchSpec& spec, const search::FieldInfo& f) {
  const std::string section = f.section;
  if (section == "model") return spec.model();
  if (section == "train") return spec.train();
  if (section == "parallel") return spec.parallel();
  return spec.search();
}
Message* MutableSectionOf(v1::SearchSpec* spec, const search::FieldInfo& f) {
  const std::string section = f.section;
  if (section == "model") return spec->mutable_model();
  if (section == "train") return spec->mutable_train();
  if (section == "parallel") return spec->mutable_parallel();
  return spec->mutable_search();
}

// A MoeLayerFreq field's 0/1 list travels in the next field number (proto/spec_proto_main.cc).
const FieldDescriptor* PatternField(const Message& msg, const search::FieldInfo& f) {
  return msg.GetDescriptor()->FindFieldByNumber(f.proto_number + 1);
}

// Reads one member from its proto field by the member's type; `has` is false when the message
// leaves it unset (the member keeps its default).
template <typename T>
Status ReadMember(const Message& msg, const FieldDescriptor* fd, const search::FieldInfo& f,
                  T* out) {
  const Reflection* r = msg.GetReflection();
  if constexpr (search::IsVector<T>::value) {
    out->clear();
    for (int i = 0; i < r->FieldSize(msg, fd); ++i) {
      if constexpr (std::is_same_v<T, std::vector<int>>) {
        out->push_back(r->GetRepeatedInt32(msg, fd, i));
      } else {
        out->push_back(r->GetRepeatedString(msg, fd, i));
      }
    }
    return search::OkStatus();
  } else if constexpr (std::is_same_v<T, search::MoeLayerFreq>) {
    if (r->HasField(msg, fd)) out->every = r->GetInt32(msg, fd);
    return ReadMember(msg, PatternField(msg, f), f, &out->pattern);
  } else {
    if (fd->has_presence() && !r->HasField(msg, fd)) return search::OkStatus();
    if constexpr (search::IsOptional<T>::value) {
      using V = typename search::IsOptional<T>::Value;
      V v{};
      REMAT_SEARCH_RETURN_IF_ERROR(ReadMember(msg, fd, f, &v));
      if constexpr (std::is_same_v<V, int>) {
        if (v == 0 && search::NullDiffersFromDefault(f)) {
          out->reset();
          return search::OkStatus();
        }
      }
      *out = std::move(v);
      return search::OkStatus();
    } else if constexpr (std::is_same_v<T, int>) {
      *out = r->GetInt32(msg, fd);
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      *out = r->GetUInt64(msg, fd);
    } else if constexpr (std::is_same_v<T, bool>) {
      *out = r->GetBool(msg, fd);
    } else if constexpr (std::is_same_v<T, double>) {
      *out = r->GetDouble(msg, fd);
    } else if constexpr (std::is_same_v<T, std::string>) {
      *out = r->GetString(msg, fd);
    } else {
      static_assert(std::is_enum_v<T>);
      const std::string name = r->GetString(msg, fd);
      auto v = search::ParseEnum<T>(name);
      if (!v) return InvalidArgument(f.Path() + ": unknown value " + search::QuoteForError(name));
      *out = *v;
    }
    return search::OkStatus();
  }
}

// Writes one member into its proto field; an optional without a value is left unset.
template <typename T>
void WriteMember(const T& value, const search::FieldInfo& f, const FieldDescriptor* fd,
                 Message* msg) {
  const Reflection* r = msg->GetReflection();
  if constexpr (search::IsVector<T>::value) {
    for (const auto& v : value) {
      if constexpr (std::is_same_v<T, std::vector<int>>) {
        r->AddInt32(msg, fd, v);
      } else {
        r->AddString(msg, fd, v);
      }
    }
  } else if constexpr (std::is_same_v<T, search::MoeLayerFreq>) {
    r->SetInt32(msg, fd, value.every);
    WriteMember(value.pattern, f, PatternField(*msg, f), msg);
  } else if constexpr (search::IsOptional<T>::value) {
    if (value) {
      WriteMember(*value, f, fd, msg);
    } else if (search::NullDiffersFromDefault(f)) {
      r->SetInt32(msg, fd, 0);
    }
  } else if constexpr (std::is_same_v<T, int>) {
    r->SetInt32(msg, fd, value);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    r->SetUInt64(msg, fd, value);
  } else if constexpr (std::is_same_v<T, bool>) {
    r->SetBool(msg, fd, value);
  } else if constexpr (std::is_same_v<T, double>) {
    r->SetDouble(msg, fd, value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    r->SetString(msg, fd, value);
  } else {
    r->SetString(msg, fd, search::Name(value));
  }
}

search::RankResult RankFromProto(const v1::RankResult& pr) {
  search::RankResult rr;
  rr.rank = pr.rank();
  rr.peak_allocated_bytes = pr.peak_allocated_bytes();
  rr.peak_reserved_bytes = pr.peak_reserved_bytes();
  rr.static_bytes = pr.static_bytes();
  rr.alloc_retries = pr.alloc_retries();
  rr.failing_request_bytes = pr.failing_request_bytes();
  rr.step_time_s = pr.step_time_s();
  rr.step_times_s.assign(pr.step_times_s().begin(), pr.step_times_s().end());
  rr.warmup_steps_taken = pr.warmup_steps_taken();
  rr.warmup_step_times_s.assign(pr.warmup_step_times_s().begin(), pr.warmup_step_times_s().end());
  return rr;
}

void RankToProto(const search::RankResult& rr, v1::RankResult* pr) {
  pr->set_rank(rr.rank);
  pr->set_peak_allocated_bytes(rr.peak_allocated_bytes);
  pr->set_peak_reserved_bytes(rr.peak_reserved_bytes);
  pr->set_static_bytes(rr.static_bytes);
  pr->set_alloc_retries(rr.alloc_retries);
  pr->set_failing_request_bytes(rr.failing_request_bytes);
  pr->set_step_time_s(rr.step_time_s);
  for (double t : rr.step_times_s) pr->add_step_times_s(t);
  pr->set_warmup_steps_taken(rr.warmup_steps_taken);
  for (double t : rr.warmup_step_times_s) pr->add_warmup_step_times_s(t);
}

}  // namespace

StatusOr<search::SearchSpec> FromProto(const v1::SearchSpec& msg) {
  search::SearchSpec spec;
  spec.name = msg.name();
  Status status;
  search::VisitFields(spec, [&](const search::FieldInfo& f, auto& member) {
    if (!status.ok()) return;
    const Message& section = SectionOf(msg, f);
    status = ReadMember(section, section.GetDescriptor()->FindFieldByNumber(f.proto_number), f,
                        &member);
  });
  if (!status.ok()) return status;
  return spec;
}

v1::SearchSpec ToProto(const search::SearchSpec& spec) {
  v1::SearchSpec msg;
  msg.set_name(spec.name);
  search::VisitFields(search::ResolveDefaults(spec),
                      [&](const search::FieldInfo& f, const auto& member) {
                        Message* section = MutableSectionOf(&msg, f);
                        WriteMember(member, f,
                                    section->GetDescriptor()->FindFieldByNumber(f.proto_number),
                                    section);
                      });
  return msg;
}

v1::TrialStatus ToProto(search::TrialStatus status) {
  switch (status) {
    case search::TrialStatus::kOk: return v1::TRIAL_STATUS_OK;
    case search::TrialStatus::kOom: return v1::TRIAL_STATUS_OOM;
    case search::TrialStatus::kFailed: return v1::TRIAL_STATUS_FAILED;
    case search::TrialStatus::kTimeout: return v1::TRIAL_STATUS_TIMEOUT;
    case search::TrialStatus::kInvalid: return v1::TRIAL_STATUS_INVALID;
    case search::TrialStatus::kCancelled: return v1::TRIAL_STATUS_CANCELLED;
  }
  return v1::TRIAL_STATUS_UNSPECIFIED;
}

const char* TrialStatusName(v1::TrialStatus status) {
  if (auto final_status = FromProto(status)) return search::Name(*final_status);
  return status == v1::TRIAL_STATUS_RUNNING ? "running" : "pending";
}

std::optional<search::TrialStatus> FromProto(v1::TrialStatus status) {
  switch (status) {
    case v1::TRIAL_STATUS_OK: return search::TrialStatus::kOk;
    case v1::TRIAL_STATUS_OOM: return search::TrialStatus::kOom;
    case v1::TRIAL_STATUS_FAILED: return search::TrialStatus::kFailed;
    case v1::TRIAL_STATUS_TIMEOUT: return search::TrialStatus::kTimeout;
    case v1::TRIAL_STATUS_INVALID: return search::TrialStatus::kInvalid;
    case v1::TRIAL_STATUS_CANCELLED: return search::TrialStatus::kCancelled;
    default: return std::nullopt;
  }
}

StatusOr<search::TrialResult> FromProto(const v1::TrialResult& msg) {
  search::TrialResult r;
  auto policy = search::ParsePolicy(msg.policy().canonical());
  if (!policy.ok()) return policy.status();
  r.policy = *policy;
  auto status = FromProto(msg.status());
  if (!status) {
    return InvalidArgument("result.status: " + v1::TrialStatus_Name(msg.status()) +
                           " is not a final trial status");
  }
  r.status = *status;
  for (const auto& pr : msg.ranks()) r.ranks.push_back(RankFromProto(pr));
  for (const auto& pm : msg.proxies()) {
    search::ProxyMeasurement m;
    m.num_layers = pm.num_layers();
    m.step_time_s = pm.step_time_s();
    m.role = pm.role();
    if (!m.role.empty()) m.rank = pm.rank();
    for (const auto& pr : pm.ranks()) m.ranks.push_back(RankFromProto(pr));
    r.proxies.push_back(std::move(m));
  }
  r.step_time_s = msg.step_time_s();
  r.step_time_spread_s = msg.step_time_spread_s();
  r.tokens_per_s = msg.tokens_per_s();
  r.model_tflops = msg.model_tflops();
  r.loss = msg.loss();
  r.grad_norm = msg.grad_norm();
  r.setup_s = msg.setup_s();
  r.wall_s = msg.wall_s();
  r.reused = msg.reused();
  r.predicted = msg.predicted();
  r.message = msg.message();
  r.warmup_steps_taken = msg.warmup_steps_taken();
  r.warmup_settled = msg.warmup_settled();
  r.versions.insert(msg.versions().begin(), msg.versions().end());
  r.step_time_low_s = msg.step_time_low_s();
  r.step_time_high_s = msg.step_time_high_s();
  r.noise_target_met = msg.noise_target_met();
  r.measured_steps = msg.measured_steps();
  r.forced_load_balancing = msg.forced_load_balancing();
  return r;
}

v1::TrialResult ToProto(const search::TrialResult& r) {
  v1::TrialResult msg;
  msg.mutable_policy()->set_canonical(r.policy.ToString());
  msg.set_status(ToProto(r.status));
  for (const auto& rr : r.ranks) RankToProto(rr, msg.add_ranks());
  for (const auto& m : r.proxies) {
    auto* pm = msg.add_proxies();
    pm->set_num_layers(m.num_layers);
    pm->set_step_time_s(m.step_time_s);
    if (!m.role.empty()) {
      pm->set_role(m.role);
      pm->set_rank(m.rank);
    }
    for (const auto& rr : m.ranks) RankToProto(rr, pm->add_ranks());
  }
  msg.set_step_time_s(r.step_time_s);
  msg.set_step_time_spread_s(r.step_time_spread_s);
  msg.set_tokens_per_s(r.tokens_per_s);
  msg.set_model_tflops(r.model_tflops);
  msg.set_loss(r.loss);
  msg.set_grad_norm(r.grad_norm);
  msg.set_setup_s(r.setup_s);
  msg.set_wall_s(r.wall_s);
  msg.set_reused(r.reused);
  msg.set_predicted(r.predicted);
  msg.set_message(r.message);
  msg.set_warmup_steps_taken(r.warmup_steps_taken);
  msg.set_warmup_settled(r.warmup_settled);
  msg.mutable_versions()->insert(r.versions.begin(), r.versions.end());
  msg.set_step_time_low_s(r.step_time_low_s);
  msg.set_step_time_high_s(r.step_time_high_s);
  msg.set_noise_target_met(r.noise_target_met);
  msg.set_measured_steps(r.measured_steps);
  msg.set_forced_load_balancing(r.forced_load_balancing);
  return msg;
}

namespace {
void FillCandidate(const search::RecommendationCandidate& c, v1::RecommendationCandidate* out) {
  out->set_policy(c.policy.ToString());
  out->set_memory_bytes(c.memory_bytes);
  out->set_tokens_per_s(c.tokens_per_s);
  out->set_noise(c.noise);
  out->set_recompute_flops(c.recompute_flops);
  out->set_below_best(c.below_best);
  out->set_tolerance(c.tolerance);
}
}  // namespace

v1::RecommendationDetail ToProto(const search::Recommendation& recommendation) {
  v1::RecommendationDetail msg;
  FillCandidate(recommendation.choice, msg.mutable_choice());
  FillCandidate(recommendation.best, msg.mutable_best());
  for (const auto& c : recommendation.tied) FillCandidate(c, msg.add_tied());
  msg.set_budget_bytes(recommendation.budget_bytes);
  msg.set_reason(recommendation.reason);
  return msg;
}

}  // namespace remat::proto
