#include "proto/convert.h"

#include <string>

#include "search/policy.h"

namespace remat::proto {
namespace {

using search::InvalidArgument;
using search::Status;
using search::StatusOr;

// Reads an optional enum-valued string field through `parse`, naming the field on failure.
template <typename E, typename Parse>
Status ReadEnum(bool has, const std::string& value, const char* field, Parse parse, E* out) {
  if (!has) return search::OkStatus();
  auto parsed = parse(value);
  if (!parsed) return InvalidArgument(std::string(field) + ": unknown value '" + value + "'");
  *out = *parsed;
  return search::OkStatus();
}

StatusOr<search::ModelSpec> ModelFromProto(const v1::ModelSpec& p) {
  search::ModelSpec m;
  m.num_layers = p.num_layers();
  m.hidden_size = p.hidden_size();
  m.num_attention_heads = p.num_attention_heads();
  m.seq_length = p.seq_length();
  m.vocab_size = p.vocab_size();
  if (p.has_num_query_groups()) m.num_query_groups = p.num_query_groups();
  if (p.has_ffn_hidden_size()) m.ffn_hidden_size = p.ffn_hidden_size();
  if (p.has_kv_channels()) m.kv_channels = p.kv_channels();
  if (p.has_gated_linear_unit()) m.gated_linear_unit = p.gated_linear_unit();
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(p.has_normalization(), p.normalization(),
                                        "model.normalization", search::ParseNormalization,
                                        &m.normalization));
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(p.has_attention_backend(), p.attention_backend(),
                                        "model.attention_backend", search::ParseAttentionBackend,
                                        &m.attention_backend));
  if (p.has_attention_dropout()) m.attention_dropout = p.attention_dropout();
  if (p.has_hidden_dropout()) m.hidden_dropout = p.hidden_dropout();
  if (p.has_attention_softmax_in_fp32()) m.attention_softmax_in_fp32 = p.attention_softmax_in_fp32();
  if (p.has_add_bias_linear()) m.add_bias_linear = p.add_bias_linear();
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(
      p.has_position_embedding_type(), p.position_embedding_type(),
      "model.position_embedding_type", search::ParsePositionEmbedding,
      &m.position_embedding_type));
  if (p.has_share_embeddings_and_output_weights()) {
    m.share_embeddings_and_output_weights = p.share_embeddings_and_output_weights();
  }
  if (p.has_multi_latent_attention()) m.multi_latent_attention = p.multi_latent_attention();
  if (m.multi_latent_attention && !p.has_normalization()) {
    m.normalization = search::Normalization::kRMSNorm;  // MLATransformerConfig's default
  }
  if (p.has_q_lora_rank()) {  // 0 is null: no q compression; unset keeps the default 512
    m.q_lora_rank = p.q_lora_rank() == 0 ? std::nullopt : std::optional<int>(p.q_lora_rank());
  }
  if (p.has_kv_lora_rank()) m.kv_lora_rank = p.kv_lora_rank();
  if (p.has_qk_head_dim()) m.qk_head_dim = p.qk_head_dim();
  if (p.has_qk_pos_emb_head_dim()) m.qk_pos_emb_head_dim = p.qk_pos_emb_head_dim();
  if (p.has_v_head_dim()) m.v_head_dim = p.v_head_dim();
  if (p.has_num_moe_experts()) m.num_moe_experts = p.num_moe_experts();
  if (p.has_moe_router_topk()) m.moe_router_topk = p.moe_router_topk();
  if (p.has_moe_ffn_hidden_size()) m.moe_ffn_hidden_size = p.moe_ffn_hidden_size();
  if (p.has_moe_shared_expert_intermediate_size()) {
    m.moe_shared_expert_intermediate_size = p.moe_shared_expert_intermediate_size();
  }
  if (p.has_moe_grouped_gemm()) m.moe_grouped_gemm = p.moe_grouped_gemm();
  if (p.has_moe_layer_freq()) m.moe_layer_freq = p.moe_layer_freq();
  m.moe_layer_pattern.assign(p.moe_layer_pattern().begin(), p.moe_layer_pattern().end());
  if (p.has_moe_shared_expert_overlap()) m.moe_shared_expert_overlap = p.moe_shared_expert_overlap();
  if (p.has_overlap_moe_expert_parallel_comm()) {
    m.overlap_moe_expert_parallel_comm = p.overlap_moe_expert_parallel_comm();
  }
  if (p.has_experimental_attention_variant()) {
    m.experimental_attention_variant = p.experimental_attention_variant();
  }
  if (p.has_cpu_offloading()) m.cpu_offloading = p.cpu_offloading();
  if (p.has_distribute_saved_activations()) {
    m.distribute_saved_activations = p.distribute_saved_activations();
  }
  if (p.has_fp8()) m.fp8 = p.fp8();
  if (p.has_fp8_recipe()) m.fp8_recipe = p.fp8_recipe();
  if (p.has_cuda_graph_impl()) m.cuda_graph_impl = p.cuda_graph_impl();
  m.cuda_graph_scope.assign(p.cuda_graph_scope().begin(), p.cuda_graph_scope().end());
  if (p.has_cpu_offloading_num_layers()) {
    m.cpu_offloading_num_layers = p.cpu_offloading_num_layers();
  }
  return m;
}

v1::ModelSpec ModelToProto(const search::ModelSpec& m) {
  v1::ModelSpec p;
  p.set_num_layers(m.num_layers);
  p.set_hidden_size(m.hidden_size);
  p.set_num_attention_heads(m.num_attention_heads);
  p.set_seq_length(m.seq_length);
  p.set_vocab_size(m.vocab_size);
  p.set_num_query_groups(m.EffectiveQueryGroups());
  p.set_ffn_hidden_size(m.EffectiveFfnHiddenSize());
  p.set_kv_channels(m.EffectiveKvChannels());
  p.set_gated_linear_unit(m.gated_linear_unit);
  p.set_normalization(search::Name(m.normalization));
  p.set_attention_backend(search::Name(m.attention_backend));
  p.set_attention_dropout(m.attention_dropout);
  p.set_hidden_dropout(m.hidden_dropout);
  p.set_attention_softmax_in_fp32(m.attention_softmax_in_fp32);
  p.set_add_bias_linear(m.add_bias_linear);
  p.set_position_embedding_type(search::Name(m.position_embedding_type));
  p.set_share_embeddings_and_output_weights(m.share_embeddings_and_output_weights);
  p.set_multi_latent_attention(m.multi_latent_attention);
  if (m.multi_latent_attention) p.set_q_lora_rank(m.q_lora_rank.value_or(0));
  p.set_kv_lora_rank(m.kv_lora_rank);
  p.set_qk_head_dim(m.qk_head_dim);
  p.set_qk_pos_emb_head_dim(m.qk_pos_emb_head_dim);
  p.set_v_head_dim(m.v_head_dim);
  if (m.num_moe_experts) {
    p.set_num_moe_experts(*m.num_moe_experts);
    p.set_moe_ffn_hidden_size(m.EffectiveMoeFfnHiddenSize());
  }
  p.set_moe_router_topk(m.moe_router_topk);
  if (m.moe_shared_expert_intermediate_size) {
    p.set_moe_shared_expert_intermediate_size(*m.moe_shared_expert_intermediate_size);
  }
  p.set_moe_grouped_gemm(m.moe_grouped_gemm);
  p.set_moe_layer_freq(m.moe_layer_freq);
  for (int v : m.moe_layer_pattern) p.add_moe_layer_pattern(v);
  p.set_moe_shared_expert_overlap(m.moe_shared_expert_overlap);
  p.set_overlap_moe_expert_parallel_comm(m.overlap_moe_expert_parallel_comm);
  if (m.experimental_attention_variant) {
    p.set_experimental_attention_variant(*m.experimental_attention_variant);
  }
  p.set_cpu_offloading(m.cpu_offloading);
  p.set_distribute_saved_activations(m.distribute_saved_activations);
  // Only what differs from the defaults, so that older specs keep their cache keys.
  if (!m.fp8.empty()) p.set_fp8(m.fp8);
  if (m.fp8_recipe != search::ModelSpec().fp8_recipe) p.set_fp8_recipe(m.fp8_recipe);
  if (m.HasCudaGraphs()) p.set_cuda_graph_impl(m.cuda_graph_impl);
  for (const std::string& s : m.cuda_graph_scope) p.add_cuda_graph_scope(s);
  if (m.cpu_offloading_num_layers != 0) {
    p.set_cpu_offloading_num_layers(m.cpu_offloading_num_layers);
  }
  return p;
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
  auto model = ModelFromProto(msg.model());
  if (!model.ok()) return model.status();
  spec.model = std::move(model).value();

  const auto& t = msg.train();
  if (t.has_micro_batch_size()) spec.train.micro_batch_size = t.micro_batch_size();
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(t.has_precision(), t.precision(), "train.precision",
                                        search::ParsePrecision, &spec.train.precision));
  if (t.has_use_distributed_optimizer()) {
    spec.train.use_distributed_optimizer = t.use_distributed_optimizer();
  }
  if (t.has_seed()) spec.train.seed = t.seed();
  if (t.has_global_batch_size()) spec.train.global_batch_size = t.global_batch_size();

  const auto& p = msg.parallel();
  auto& sp = spec.parallel;
  if (p.has_tensor_model_parallel_size()) sp.tensor_model_parallel_size = p.tensor_model_parallel_size();
  if (p.has_pipeline_model_parallel_size()) {
    sp.pipeline_model_parallel_size = p.pipeline_model_parallel_size();
  }
  if (p.has_sequence_parallel()) sp.sequence_parallel = p.sequence_parallel();
  if (p.has_expert_model_parallel_size()) sp.expert_model_parallel_size = p.expert_model_parallel_size();
  if (p.has_data_parallel_size()) sp.data_parallel_size = p.data_parallel_size();
  if (p.has_virtual_pipeline_model_parallel_size()) {
    sp.virtual_pipeline_model_parallel_size = p.virtual_pipeline_model_parallel_size();
  }
  if (p.has_context_parallel_size()) sp.context_parallel_size = p.context_parallel_size();
  if (p.has_num_layers_in_first_pipeline_stage()) {
    sp.num_layers_in_first_pipeline_stage = p.num_layers_in_first_pipeline_stage();
  }
  if (p.has_num_layers_in_last_pipeline_stage()) {
    sp.num_layers_in_last_pipeline_stage = p.num_layers_in_last_pipeline_stage();
  }
  if (p.has_account_for_embedding_in_pipeline_split()) {
    sp.account_for_embedding_in_pipeline_split = p.account_for_embedding_in_pipeline_split();
  }
  if (p.has_account_for_loss_in_pipeline_split()) {
    sp.account_for_loss_in_pipeline_split = p.account_for_loss_in_pipeline_split();
  }
  if (p.has_overlap_grad_reduce()) sp.overlap_grad_reduce = p.overlap_grad_reduce();
  if (p.has_overlap_param_gather()) sp.overlap_param_gather = p.overlap_param_gather();

  const auto& s = msg.search();
  auto& so = spec.search;
  if (s.has_memory_budget_gib()) so.memory_budget_gib = s.memory_budget_gib();
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(s.has_memory_metric(), s.memory_metric(),
                                        "search.memory_metric", search::ParseMemoryMetric,
                                        &so.memory_metric));
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(s.has_strategy(), s.strategy(), "search.strategy",
                                        search::ParseStrategyKind, &so.strategy));
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(s.has_objective(), s.objective(), "search.objective",
                                        search::ParseObjective, &so.objective));
  if (s.has_memory_headroom_gib()) so.memory_headroom_gib = s.memory_headroom_gib();
  if (s.has_max_trials()) so.max_trials = s.max_trials();
  if (s.has_warmup_steps()) so.warmup_steps = s.warmup_steps();
  if (s.has_warmup_max_steps()) so.warmup_max_steps = s.warmup_max_steps();
  if (s.has_steady_window()) so.steady_window = s.steady_window();
  if (s.has_steady_tolerance()) so.steady_tolerance = s.steady_tolerance();
  if (s.has_measure_steps()) so.measure_steps = s.measure_steps();
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(s.has_backend(), s.backend(), "search.backend",
                                        search::ParseBackend, &so.backend));
  if (s.has_replay_table()) so.replay_table = s.replay_table();
  if (s.has_command_template()) so.command_template = s.command_template();
  REMAT_SEARCH_RETURN_IF_ERROR(ReadEnum(s.has_device(), s.device(), "search.device",
                                        search::ParseDevice, &so.device));
  if (s.has_trial_timeout_s()) so.trial_timeout_s = s.trial_timeout_s();
  so.proxy_layers.assign(s.proxy_layers().begin(), s.proxy_layers().end());
  if (s.has_layout_proxy()) so.layout_proxy = s.layout_proxy();
  if (s.has_gpus_per_node()) so.gpus_per_node = s.gpus_per_node();
  if (s.has_nvlink_gb_s()) so.nvlink_gb_s = s.nvlink_gb_s();
  if (s.has_network_gb_s()) so.network_gb_s = s.network_gb_s();
  return spec;
}

v1::SearchSpec ToProto(const search::SearchSpec& spec) {
  v1::SearchSpec msg;
  msg.set_name(spec.name);
  *msg.mutable_model() = ModelToProto(spec.model);
  auto* t = msg.mutable_train();
  t->set_micro_batch_size(spec.train.micro_batch_size);
  t->set_precision(search::Name(spec.train.precision));
  t->set_use_distributed_optimizer(spec.train.use_distributed_optimizer);
  t->set_seed(spec.train.seed);
  if (spec.train.global_batch_size) t->set_global_batch_size(*spec.train.global_batch_size);
  auto* p = msg.mutable_parallel();
  p->set_tensor_model_parallel_size(spec.parallel.tensor_model_parallel_size);
  p->set_pipeline_model_parallel_size(spec.parallel.pipeline_model_parallel_size);
  p->set_sequence_parallel(spec.parallel.sequence_parallel);
  p->set_expert_model_parallel_size(spec.parallel.expert_model_parallel_size);
  p->set_data_parallel_size(spec.parallel.data_parallel_size);
  const auto& par = spec.parallel;
  if (par.virtual_pipeline_model_parallel_size) {
    p->set_virtual_pipeline_model_parallel_size(*par.virtual_pipeline_model_parallel_size);
  }
  p->set_context_parallel_size(par.context_parallel_size);
  if (par.num_layers_in_first_pipeline_stage) {
    p->set_num_layers_in_first_pipeline_stage(*par.num_layers_in_first_pipeline_stage);
  }
  if (par.num_layers_in_last_pipeline_stage) {
    p->set_num_layers_in_last_pipeline_stage(*par.num_layers_in_last_pipeline_stage);
  }
  p->set_account_for_embedding_in_pipeline_split(par.account_for_embedding_in_pipeline_split);
  p->set_account_for_loss_in_pipeline_split(par.account_for_loss_in_pipeline_split);
  if (par.overlap_grad_reduce) p->set_overlap_grad_reduce(true);
  if (par.overlap_param_gather) p->set_overlap_param_gather(true);
  auto* s = msg.mutable_search();
  const auto& so = spec.search;
  s->set_memory_budget_gib(so.memory_budget_gib);
  s->set_memory_metric(search::Name(so.memory_metric));
  s->set_strategy(search::Name(so.strategy));
  s->set_objective(search::Name(so.objective));
  s->set_memory_headroom_gib(so.memory_headroom_gib);
  s->set_max_trials(so.max_trials);
  s->set_warmup_steps(so.warmup_steps);
  s->set_warmup_max_steps(so.warmup_max_steps);
  s->set_steady_window(so.steady_window);
  s->set_steady_tolerance(so.steady_tolerance);
  s->set_measure_steps(so.measure_steps);
  s->set_backend(search::Name(so.backend));
  s->set_replay_table(so.replay_table);
  s->set_command_template(so.command_template);
  s->set_device(search::Name(so.device));
  s->set_trial_timeout_s(so.trial_timeout_s);
  for (int d : so.proxy_layers) s->add_proxy_layers(d);
  if (so.layout_proxy) s->set_layout_proxy(true);
  s->set_gpus_per_node(so.gpus_per_node);
  s->set_nvlink_gb_s(so.nvlink_gb_s);
  s->set_network_gb_s(so.network_gb_s);
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
