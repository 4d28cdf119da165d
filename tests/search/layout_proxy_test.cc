// Layout proxies, the pure part: which ranks stand for a layout, the micro-batches a proxy needs,
// the communication model and the result for every rank of the layout.
#include "search/layout_proxy.h"

#include <gtest/gtest.h>

#include "search/pipeline.h"
#include "search/spec.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

SearchSpec Layout(int layers, int tp, int pp, int dp, int vpp, int microbatches) {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = layers;
  s.parallel.tensor_model_parallel_size = tp;
  s.parallel.pipeline_model_parallel_size = pp;
  s.parallel.data_parallel_size = dp;
  if (vpp > 1) s.parallel.virtual_pipeline_model_parallel_size = vpp;
  s.train.global_batch_size = 1LL * microbatches * dp;
  s.search.layout_proxy = true;
  return s;
}

TEST(LayoutProxyTest, AProxyTrialLeasesOneSlot) {
  SearchSpec s = Layout(16, 8, 4, 4, 1, 8);
  EXPECT_EQ(TrialSlots(s), 1);
  s.search.layout_proxy = false;
  EXPECT_EQ(TrialSlots(s), 128);
}

TEST(LayoutProxyTest, EveryStageIsARoleUpToFourStages) {
  const SearchSpec s = Layout(16, 8, 4, 4, 1, 8);
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  const std::vector<ProxyRole> roles = ProxyRoles(s);
  ASSERT_EQ(roles.size(), 4u);
  EXPECT_EQ(roles[0].name, "stage 0 (first)");
  EXPECT_EQ(roles[0].rank, 0);
  EXPECT_EQ(roles[1].name, "stage 1");
  EXPECT_EQ(roles[1].rank, 32);  // TP 8 x DP 4 ranks per stage (Megatron's order tp-cp-ep-dp-pp)
  EXPECT_EQ(roles[3].name, "stage 3 (last)");
  EXPECT_EQ(roles[3].rank, 96);
  EXPECT_EQ(ProxyRoles(Layout(4, 2, 1, 2, 1, 1)).front().name, "stage 0 (only)");
}

TEST(LayoutProxyTest, DeepPipelinesMeasureTheEndsAndTwoMiddles) {
  const SearchSpec s = Layout(128, 8, 16, 8, 1, 64);
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  std::vector<int> stages;
  for (const ProxyRole& r : ProxyRoles(s)) stages.push_back(r.pp_rank);
  EXPECT_EQ(stages, (std::vector<int>{0, 1, 14, 15}));
  // Uneven first and last stages: the middle ones share the rest evenly, so they stay alike.
  SearchSpec uneven = Layout(17, 1, 6, 1, 1, 8);
  uneven.parallel.num_layers_in_first_pipeline_stage = 2;
  uneven.parallel.num_layers_in_last_pipeline_stage = 3;
  ASSERT_TRUE(ValidateSpec(uneven).ok()) << ValidateSpec(uneven).message();
  const std::vector<ProxyRole> roles = ProxyRoles(uneven);
  ASSERT_EQ(roles.size(), 4u);
  EXPECT_EQ(roles[2].pp_rank, 4);
}

TEST(LayoutProxyTest, AMiddleStageWithDenseLayersIsMeasuredApart) {
  // DeepSeek-V3's shape of the problem: the first three layers dense, PP 8. Stage 1 holds two of
  // them; stages 2..6 hold only MoE layers, so stage 1 does not bracket them: 0, 1, 2, 6, 7.
  SearchSpec s = testing::MoeSpec();
  s.model.num_layers = 24;
  s.model.moe_layer_freq.pattern.assign(24, 1);
  for (int l = 0; l < 4; ++l) s.model.moe_layer_freq.pattern[l] = 0;
  s.parallel.pipeline_model_parallel_size = 8;
  s.parallel.tensor_model_parallel_size = 1;
  s.parallel.data_parallel_size = 1;
  s.train.global_batch_size = 16LL * s.train.micro_batch_size;
  s.search.layout_proxy = true;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  std::vector<int> stages;
  for (const ProxyRole& r : ProxyRoles(s)) stages.push_back(r.pp_rank);
  EXPECT_EQ(stages, (std::vector<int>{0, 1, 2, 6, 7}));
  // Every layer MoE: the middle stages are alike again.
  s.model.moe_layer_freq.pattern.assign(24, 1);
  stages.clear();
  for (const ProxyRole& r : ProxyRoles(s)) stages.push_back(r.pp_rank);
  EXPECT_EQ(stages, (std::vector<int>{0, 1, 6, 7}));
}

TEST(LayoutProxyTest, ProxiesRunFewerMicrobatchesWithTheSamePeakStates) {
  // 1F1B on 4 stages keeps at most 4 in flight: 4 micro-batches reach every state of 64.
  SearchSpec s = Layout(16, 1, 4, 1, 1, 64);
  EXPECT_EQ(ProxyMicrobatches(s), 4);
  const SearchSpec run = ProxyRunSpec(s);
  EXPECT_EQ(run.NumMicrobatches(), 4);
  EXPECT_FALSE(run.search.layout_proxy);
  for (int p = 0; p < 4; ++p) EXPECT_EQ(MaxInFlight(run, p), MaxInFlight(s, p));
  // Interleaved: a multiple of PP whose chunk-forwards cover the longest warm-up.
  SearchSpec inter = Layout(80, 8, 4, 4, 5, 128);
  ASSERT_TRUE(ValidateSpec(inter).ok()) << ValidateSpec(inter).message();
  const int m = ProxyMicrobatches(inter);
  EXPECT_EQ(m % 4, 0);
  EXPECT_LT(m, 128);
  const SearchSpec irun = ProxyRunSpec(inter);
  for (int p = 0; p < 4; ++p) EXPECT_EQ(MaxInFlight(irun, p), MaxInFlight(inter, p)) << p;
  // Fewer micro-batches than stages: nothing smaller keeps the states.
  EXPECT_EQ(ProxyMicrobatches(Layout(16, 1, 4, 1, 1, 2)), 2);
}

TEST(LayoutProxyTest, CommunicationTimeFollowsTheRingAndTheLinks) {
  LinkModel links;
  links.gpus_per_node = 8;
  links.nvlink_bytes_per_s = 400e9;
  links.network_bytes_per_s = 50e9;
  links.latency_s = 0;
  // All-reduce of 1 GB over 8 ranks of one node: 2 x 7/8 GB at 400 GB/s.
  CommRecord tp{"tp", CollectiveKind::kAllReduce, {0, 1, 2, 3, 4, 5, 6, 7}, 1e9, 1};
  EXPECT_NEAR(CommSeconds(links, {tp}), 2 * 7.0 / 8 / 400, 1e-12);
  // The same group strided over nodes goes over the network.
  CommRecord dp{"dp", CollectiveKind::kReduceScatter, {0, 8, 16, 24}, 1e9, 1};
  EXPECT_NEAR(CommSeconds(links, {dp}), 3.0 / 4 / 50, 1e-12);
  CommRecord pp{"pp", CollectiveKind::kSendRecv, {0, 32}, 2e8, 10};
  links.latency_s = 1e-5;
  EXPECT_NEAR(CommSeconds(links, {pp}), 2e8 / 50e9 + 10 * 1e-5, 1e-12);
  CommRecord alone{"ep", CollectiveKind::kAllToAll, {3}, 1e9, 1};
  EXPECT_EQ(CommSeconds(links, {alone}), 0);
}

RoleMeasurement Measured(const ProxyRole& role, uint64_t peak, double schedule_s,
                         double optimizer_s) {
  RoleMeasurement m;
  m.role = role;
  m.result.status = TrialStatus::kOk;
  m.result.step_time_s = schedule_s + optimizer_s;
  RankResult r;
  r.rank = role.rank;
  r.peak_allocated_bytes = peak;
  r.peak_reserved_bytes = peak + 100;
  r.static_bytes = 1000;
  m.result.ranks.push_back(r);
  m.schedule_s = schedule_s;
  m.optimizer_s = optimizer_s;
  return m;
}

TEST(LayoutProxyTest, TheCombinedResultListsEveryRankAndInterpolatesMiddleStages) {
  SearchSpec s = Layout(128, 2, 8, 2, 1, 32);  // 32 ranks, 4 per stage
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  const std::vector<ProxyRole> roles = ProxyRoles(s);
  ASSERT_EQ(roles.size(), 4u);  // stages 0, 1, 6, 7
  const int mprime = ProxyMicrobatches(s);
  ASSERT_EQ(mprime, 8);
  std::vector<RoleMeasurement> measured = {
      Measured(roles[0], 9000, 0.8, 0.1), Measured(roles[1], 8000, 0.8, 0.1),
      Measured(roles[2], 3000, 0.8, 0.1), Measured(roles[3], 5000, 1.6, 0.2)};
  const TrialResult r = CombineLayoutProxies(s, measured);
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_TRUE(r.predicted);
  ASSERT_EQ(r.ranks.size(), 32u);
  for (int rank = 0; rank < 32; ++rank) EXPECT_EQ(r.ranks[rank].rank, rank);
  EXPECT_EQ(r.ranks[0].peak_allocated_bytes, 9000u);
  EXPECT_EQ(r.ranks[3].peak_allocated_bytes, 9000u);
  EXPECT_EQ(r.ranks[4].peak_allocated_bytes, 8000u);
  // Stage 3 is 2/5 of the way from stage 1 (8000) to stage 6 (3000).
  EXPECT_EQ(r.ranks[12].peak_allocated_bytes, 6000u);
  EXPECT_EQ(r.ranks[12].peak_reserved_bytes, 6100u);
  EXPECT_EQ(r.ranks[31].peak_allocated_bytes, 5000u);
  EXPECT_EQ(r.PeakAllocatedBytes(), 9000u);
  // The slowest stage's micro-batch (1.6 s / 8) over 32 micro-batches and 7 of fill and drain,
  // then its optimizer step (no traffic recorded).
  EXPECT_NEAR(r.step_time_s, (32 + 7) * 0.2 + 0.2, 1e-9);
  EXPECT_NEAR(r.tokens_per_s, 32.0 * 2 * 4096 / r.step_time_s, 1e-6);
  ASSERT_EQ(r.proxies.size(), 4u);
  EXPECT_EQ(r.proxies[3].role, "stage 7 (last)");
  EXPECT_EQ(r.proxies[3].rank, 28);
  EXPECT_EQ(r.proxies[3].num_layers, 16);
  EXPECT_NE(r.message.find("4 of 8 pipeline stages"), std::string::npos) << r.message;
  EXPECT_EQ(r.loss, 0);  // stand-in collectives make the loss meaningless: not reported
}

TEST(LayoutProxyTest, TrafficAddsToTheMicrobatchOrToTheOptimizer) {
  SearchSpec s = Layout(8, 8, 1, 2, 1, 4);
  const std::vector<ProxyRole> roles = ProxyRoles(s);
  ASSERT_EQ(roles.size(), 1u);
  RoleMeasurement m = Measured(roles[0], 100, 1.0, 0.5);
  // Per proxy step: 4 GB all-reduced in TP (inside the micro-batches), 1.6 GB of gradients
  // all-reduced over DP 2 across nodes (after the last backward). Without a pipeline one
  // micro-batch reaches every in-flight state, so the proxy ran 1 of the step's 4: its TP
  // traffic comes 4 times in the real step, the gradients' once.
  ASSERT_EQ(ProxyMicrobatches(s), 1);
  m.comm = {{"tp", CollectiveKind::kAllReduce, {0, 1, 2, 3, 4, 5, 6, 7}, 4e9, 0},
            {"dp", CollectiveKind::kAllReduce, {0, 8}, 1.6e9, 0}};
  const TrialResult base = CombineLayoutProxies(s, {Measured(roles[0], 100, 1.0, 0.5)});
  const TrialResult r = CombineLayoutProxies(s, {m});
  const double tp_s = 2 * 7.0 / 8 * 4e9 / 360e9, dp_s = 1.6e9 / 45e9;
  EXPECT_NEAR(r.step_time_s - base.step_time_s, 4 * tp_s + dp_s, 1e-9);
  // Overlapped gradient reduction hides the DP traffic.
  s.parallel.overlap_grad_reduce = true;
  EXPECT_NEAR(CombineLayoutProxies(s, {m}).step_time_s - base.step_time_s, 4 * tp_s, 1e-9);
}

TEST(LayoutProxyTest, AStageThatRanOutOfMemoryIsTheLayoutsOom) {
  SearchSpec s = Layout(16, 1, 4, 1, 1, 8);
  const std::vector<ProxyRole> roles = ProxyRoles(s);
  std::vector<RoleMeasurement> measured;
  for (const ProxyRole& role : roles) measured.push_back(Measured(role, 100, 1, 0));
  measured[0].result.status = TrialStatus::kOom;
  measured[0].result.message = "out of memory";
  measured[0].result.ranks[0].failing_request_bytes = 4096;
  const TrialResult r = CombineLayoutProxies(s, measured);
  EXPECT_EQ(r.status, TrialStatus::kOom);
  EXPECT_EQ(r.message, "layout proxy, stage 0 (first) (rank 0): out of memory");
  ASSERT_EQ(r.ranks.size(), 1u);
  EXPECT_EQ(r.ranks[0].failing_request_bytes, 4096u);
}

TEST(LayoutProxyTest, SpecRules) {
  SearchSpec s = Layout(16, 1, 4, 1, 1, 8);
  s.search.backend = Backend::kMegatron;
  EXPECT_EQ(ValidateSpec(s).message(),
            "search.layout_proxy: needs backend builtin (backend megatron runs the real ranks)");
  s.search.backend = Backend::kBuiltin;
  s.search.proxy_layers = {4, 8};  // depth proxies of a layout proxy: each depth a layout proxy
  EXPECT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  s.search.proxy_layers.clear();
  s.search.network_gb_s = 0;
  EXPECT_EQ(ValidateSpec(s).message().rfind("search.network_gb_s:", 0), 0u);
  s.search.network_gb_s = 45;
  s.search.gpus_per_node = 0;
  EXPECT_EQ(ValidateSpec(s).message().rfind("search.gpus_per_node:", 0), 0u);
}

}  // namespace
}  // namespace remat::search
