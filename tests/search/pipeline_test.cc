// The pipeline layout: Megatron Core's layer split (even, uneven, embedding/loss accounted,
// interleaved chunks) and its 1F1B / interleaved schedules' order and in-flight counts.
#include "search/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "search/spec.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

SearchSpec Layout(int layers, int pp, int vpp = 1, int microbatches = 1) {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = layers;
  s.parallel.pipeline_model_parallel_size = pp;
  if (vpp > 1) s.parallel.virtual_pipeline_model_parallel_size = vpp;
  s.train.global_batch_size = microbatches;
  return s;
}

// [first, first + count) of every chunk of `rank`.
std::vector<std::pair<int, int>> Ranges(const SearchSpec& s, int rank) {
  std::vector<std::pair<int, int>> out;
  for (const StageChunk& c : ChunksOf(s, rank)) {
    out.push_back({c.first_layer, c.first_layer + c.num_layers});
  }
  return out;
}

using R = std::vector<std::pair<int, int>>;

TEST(PipelineTest, EvenSplitGivesContiguousStages) {
  SearchSpec s = Layout(16, 4);
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(Ranges(s, 0), (R{{0, 4}}));
  EXPECT_EQ(Ranges(s, 3), (R{{12, 16}}));
  EXPECT_TRUE(ChunkOf(s, 0, 0).has_embedding);
  EXPECT_FALSE(ChunkOf(s, 0, 0).has_loss);
  EXPECT_TRUE(ChunkOf(s, 3, 0).has_loss);
  EXPECT_EQ(MaxChunkLayers(s), 4);
}

TEST(PipelineTest, VirtualChunksAreLaidOutChunkMajor) {
  // Megatron's own examples (transformer_block.py): 8 layers, 2 stages.
  SearchSpec s = Layout(8, 2, 2, 2);
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(Ranges(s, 0), (R{{0, 2}, {4, 6}}));
  EXPECT_EQ(Ranges(s, 1), (R{{2, 4}, {6, 8}}));
  s.parallel.virtual_pipeline_model_parallel_size = 4;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(Ranges(s, 0), (R{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(Ranges(s, 1), (R{{1, 2}, {3, 4}, {5, 6}, {7, 8}}));
  EXPECT_TRUE(ChunkOf(s, 1, 3).has_loss);
  EXPECT_FALSE(ChunkOf(s, 1, 2).has_loss);
  EXPECT_EQ(MaxChunkLayers(s), 1);
  EXPECT_EQ(StageLayerCount(s, 1), 4);
}

TEST(PipelineTest, UnevenFirstAndLastStages) {
  SearchSpec s = Layout(10, 4);
  s.parallel.num_layers_in_first_pipeline_stage = 1;
  s.parallel.num_layers_in_last_pipeline_stage = 3;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(Ranges(s, 0), (R{{0, 1}}));
  EXPECT_EQ(Ranges(s, 1), (R{{1, 4}}));
  EXPECT_EQ(Ranges(s, 2), (R{{4, 7}}));
  EXPECT_EQ(Ranges(s, 3), (R{{7, 10}}));

  // Interleaved: each round of chunks holds first/V + middle/V + last/V layers (Megatron's
  // get_transformer_layer_offset gives rank 2, chunk 1 the offset 6 + 1 + 2 = 9).
  SearchSpec v = Layout(12, 4, 2, 4);
  v.parallel.num_layers_in_first_pipeline_stage = 2;
  v.parallel.num_layers_in_last_pipeline_stage = 2;
  ASSERT_TRUE(ValidateSpec(v).ok()) << ValidateSpec(v).message();
  EXPECT_EQ(Ranges(v, 0), (R{{0, 1}, {6, 7}}));
  EXPECT_EQ(Ranges(v, 2), (R{{3, 5}, {9, 11}}));
  EXPECT_EQ(Ranges(v, 3), (R{{5, 6}, {11, 12}}));
}

TEST(PipelineTest, EmbeddingAndLossCountAsLayers) {
  SearchSpec s = Layout(14, 4);
  s.parallel.account_for_embedding_in_pipeline_split = true;
  s.parallel.account_for_loss_in_pipeline_split = true;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(Ranges(s, 0), (R{{0, 3}}));
  EXPECT_EQ(Ranges(s, 1), (R{{3, 7}}));
  EXPECT_EQ(Ranges(s, 3), (R{{11, 14}}));

  s.parallel.virtual_pipeline_model_parallel_size = 2;
  s.train.global_batch_size = 4;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(Ranges(s, 0), (R{{0, 1}, {7, 9}}));
  EXPECT_EQ(Ranges(s, 1), (R{{1, 3}, {9, 11}}));
  EXPECT_EQ(Ranges(s, 3), (R{{5, 7}, {13, 14}}));

  // A first stage of the embedding alone is allowed: 3 layers + embedding + loss over 5 stages.
  SearchSpec e = Layout(3, 5);
  e.parallel.account_for_embedding_in_pipeline_split = true;
  e.parallel.account_for_loss_in_pipeline_split = true;
  ASSERT_TRUE(ValidateSpec(e).ok()) << ValidateSpec(e).message();
  EXPECT_EQ(ChunkOf(e, 0, 0).num_layers, 0);
  EXPECT_EQ(ChunkOf(e, 4, 0).num_layers, 0);
  EXPECT_EQ(Ranges(e, 2), (R{{1, 2}}));
}

TEST(PipelineTest, OneFOneBKeepsPipelineDepthMinusRankInFlight) {
  SearchSpec s = Layout(16, 4, 1, 8);
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(WarmupForwards(s, p), 3 - p);
    EXPECT_EQ(MaxInFlight(s, p), 4 - p);
  }
  s.train.global_batch_size = 2;  // fewer micro-batches than stages: all of them in warm-up
  EXPECT_EQ(WarmupForwards(s, 0), 2);
  EXPECT_EQ(MaxInFlight(s, 0), 2);
  EXPECT_EQ(MaxInFlight(s, 3), 1);
  SearchSpec one = Layout(4, 1, 1, 8);  // no pipeline: forward, backward, one at a time
  EXPECT_EQ(MaxInFlight(one, 0), 1);
}

TEST(PipelineTest, InterleavedWarmupFollowsMegatron) {
  SearchSpec s = Layout(16, 4, 2, 8);
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  // (PP - p - 1) x 2 + (VPP - 1) x PP chunk-forwards, then one more in the steady state.
  EXPECT_EQ(WarmupForwards(s, 0), 10);
  EXPECT_EQ(MaxInFlight(s, 0), 11);
  EXPECT_EQ(WarmupForwards(s, 3), 4);
  EXPECT_EQ(MaxInFlight(s, 3), 5);
  s.model.overlap_moe_expert_parallel_comm = true;  // one more forward before the 1F1B steps
  EXPECT_EQ(WarmupForwards(s, 3), 5);
  // Capped at M x VPP.
  SearchSpec few = Layout(16, 4, 2, 4);
  EXPECT_EQ(WarmupForwards(few, 0), 8);
  EXPECT_EQ(MaxInFlight(few, 0), 8);
}

TEST(PipelineTest, InterleavedOrderTakesMicrobatchesInGroupsOfPipelineDepth) {
  // Megatron's docstring: PP 2, VP 2, 4 micro-batches run forwards 0 1 0 1 2 3 2 3 on chunks
  // 0 0 1 1 0 0 1 1.
  SearchSpec s = Layout(8, 2, 2, 4);
  std::vector<std::pair<int, int>> forwards;
  for (const PipelineOp& op : ScheduleOps(s, 1)) {
    if (op.forward) forwards.push_back({op.microbatch, op.chunk});
  }
  EXPECT_EQ(forwards, (R{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}}));
}

// Every (micro-batch, chunk) runs forward once and backward once, the backward after its
// forward, chunks backward in reverse order; the live count never goes negative.
TEST(PipelineTest, EveryScheduleIsComplete) {
  for (int pp : {1, 2, 4}) {
    for (int vpp : {1, 2, 3}) {
      for (int m : {1, 4, 8, 12}) {
        if (vpp > 1 && (pp == 1 || m % pp != 0)) continue;
        SearchSpec s = Layout(pp * vpp * 2, pp, vpp, m);
        ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
        for (int p = 0; p < pp; ++p) {
          std::set<std::pair<int, int>> fwd, bwd;
          std::map<int, int> live;
          const auto ops = ScheduleOps(s, p);
          ASSERT_EQ(ops.size(), 2u * m * vpp);
          for (const PipelineOp& op : ops) {
            const std::pair<int, int> key{op.microbatch, op.chunk};
            if (op.forward) {
              EXPECT_TRUE(fwd.insert(key).second);
              ++live[op.chunk];
            } else {
              EXPECT_TRUE(fwd.count(key)) << "backward before forward";
              EXPECT_TRUE(bwd.insert(key).second);
              // The later chunk of a micro-batch runs backward first.
              for (int c = op.chunk + 1; c < vpp; ++c) EXPECT_TRUE(bwd.count({op.microbatch, c}));
              EXPECT_GE(--live[op.chunk], 0);
            }
          }
          EXPECT_EQ(bwd.size(), static_cast<size_t>(m * vpp));
          EXPECT_GE(MaxInFlight(s, p), 1);
        }
      }
    }
  }
}

TEST(PipelineTest, LastStageHoldsOneMicrobatchOfItsLossChunk) {
  SearchSpec s = Layout(16, 4, 2, 8);
  int most_loss_chunk = 0;
  for (const InFlightState& st : InFlightStates(s, 3)) {
    most_loss_chunk = std::max(most_loss_chunk, st.live_per_chunk[1]);
  }
  EXPECT_EQ(most_loss_chunk, 1);
}

TEST(PipelineTest, RefusesInconsistentLayouts) {
  struct Case {
    const char* field;
    SearchSpec spec;
  };
  std::vector<Case> cases;
  auto add = [&](const char* field, auto edit) {
    SearchSpec s = Layout(16, 4, 1, 8);
    edit(s);
    cases.push_back({field, s});
  };
  add("train.global_batch_size", [](SearchSpec& s) { s.train.global_batch_size = 0; });
  add("train.global_batch_size", [](SearchSpec& s) {
    s.parallel.data_parallel_size = 3;
    s.train.global_batch_size = 8;
  });
  add("parallel.virtual_pipeline_model_parallel_size",
      [](SearchSpec& s) { s.parallel.virtual_pipeline_model_parallel_size = 0; });
  add("parallel.virtual_pipeline_model_parallel_size", [](SearchSpec& s) {
    s.parallel.pipeline_model_parallel_size = 1;
    s.parallel.virtual_pipeline_model_parallel_size = 2;
  });
  add("parallel.virtual_pipeline_model_parallel_size", [](SearchSpec& s) {
    s.parallel.virtual_pipeline_model_parallel_size = 3;
  });  // 4 layers/stage
  add("train.global_batch_size", [](SearchSpec& s) {
    s.parallel.virtual_pipeline_model_parallel_size = 2;
    s.train.global_batch_size = 6;  // not a multiple of PP
  });
  add("parallel.num_layers_in_first_pipeline_stage",
      [](SearchSpec& s) { s.parallel.num_layers_in_first_pipeline_stage = 0; });
  add("parallel.num_layers_in_first_pipeline_stage", [](SearchSpec& s) {
    s.parallel.num_layers_in_first_pipeline_stage = 2;
    s.parallel.account_for_loss_in_pipeline_split = true;
  });
  add("parallel.num_layers_in_first_pipeline_stage", [](SearchSpec& s) {
    s.parallel.num_layers_in_first_pipeline_stage = 3;  // 13 left for 3 stages
  });
  add("parallel.num_layers_in_first_pipeline_stage", [](SearchSpec& s) {
    s.parallel.pipeline_model_parallel_size = 2;
    s.parallel.num_layers_in_first_pipeline_stage = 6;  // 4 left, but no middle stage
    s.parallel.num_layers_in_last_pipeline_stage = 6;
  });
  add("parallel.num_layers_in_last_pipeline_stage", [](SearchSpec& s) {
    s.parallel.virtual_pipeline_model_parallel_size = 2;
    s.parallel.num_layers_in_last_pipeline_stage = 1;
  });
  add("parallel.num_layers_in_first_pipeline_stage", [](SearchSpec& s) {
    s.parallel.pipeline_model_parallel_size = 1;
    s.parallel.num_layers_in_first_pipeline_stage = 16;
  });
  add("model.num_layers",
      [](SearchSpec& s) { s.parallel.account_for_embedding_in_pipeline_split = true; });
  add("parallel.context_parallel_size", [](SearchSpec& s) {
    s.parallel.context_parallel_size = 2;  // unfused attention
  });
  add("model.seq_length", [](SearchSpec& s) {
    s.model.attention_backend = AttentionBackend::kFlash;
    s.parallel.context_parallel_size = 3;
  });
  for (const Case& c : cases) {
    const Status st = ValidateSpec(c.spec);
    EXPECT_EQ(st.message().rfind(std::string(c.field) + ":", 0), 0u)
        << c.field << " -> " << st.message();
  }
}

TEST(PipelineTest, ContextParallelJoinsTheWorldAndTheExpertRule) {
  SearchSpec s = testing::MoeSpec();
  s.model.attention_backend = AttentionBackend::kFlash;
  s.parallel.context_parallel_size = 2;
  s.parallel.data_parallel_size = 2;
  s.parallel.expert_model_parallel_size = 4;  // divides TP x CP x DP = 4
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(s.parallel.WorldSize(), 4);
  s.parallel.expert_model_parallel_size = 8;
  EXPECT_EQ(ValidateSpec(s).message().rfind("parallel.expert_model_parallel_size:", 0), 0u)
      << ValidateSpec(s).message();
}

// The in-flight states come from a bounded prefix of the schedule (whatever the global batch),
// and are exactly those of walking every micro-batch of the step, in the same order (under
// plain 1F1B the first, which holds the most).
TEST(PipelineTest, InFlightStatesOfAShortenedScheduleAreThoseOfTheWholeStep) {
  auto walked = [](const SearchSpec& spec, int pp_rank) {
    std::vector<std::pair<int, std::vector<int>>> states;
    std::vector<int> live(spec.parallel.VirtualChunks(), 0);
    for (const PipelineOp& op : ScheduleOps(spec, pp_rank)) {
      if (op.forward) {
        ++live[op.chunk];
        continue;
      }
      std::pair<int, std::vector<int>> state{op.chunk, live};
      if (std::find(states.begin(), states.end(), state) == states.end()) states.push_back(state);
      --live[op.chunk];
    }
    return states;
  };
  int checked = 0;
  for (int pp : {1, 2, 3, 4, 8}) {
    for (int vpp : {1, 2, 3, 4}) {
      if (vpp > 1 && pp == 1) continue;
      for (int m = 1; m <= 40; ++m) {
        if (vpp > 1 && m % pp != 0) continue;
        for (bool overlap : {false, true}) {
          SearchSpec spec = testing::DenseSpec();
          spec.model.num_layers = pp * vpp * 2;
          spec.parallel.pipeline_model_parallel_size = pp;
          if (vpp > 1) spec.parallel.virtual_pipeline_model_parallel_size = vpp;
          spec.model.overlap_moe_expert_parallel_comm = overlap;
          spec.train.global_batch_size = m;
          ASSERT_EQ(spec.NumMicrobatches(), m);
          for (int p = 0; p < pp; ++p) {
            std::vector<std::pair<int, std::vector<int>>> got;
            for (const InFlightState& s : InFlightStates(spec, p)) {
              got.emplace_back(s.backward_chunk, s.live_per_chunk);
            }
            std::vector<std::pair<int, std::vector<int>>> want = walked(spec, p);
            if (vpp == 1) {
              for (const auto& state : want) EXPECT_LE(state.second[0], want[0].second[0]);
              want.resize(1);
            }
            EXPECT_EQ(got, want) << "pp " << pp << " vpp " << vpp << " m " << m << " rank " << p;
            // ...and the fewest micro-batches with the same states, as the layout proxy runs.
            const int fewest = InFlightMicrobatches(spec, p);
            EXPECT_LE(fewest, m);
            SearchSpec cut = spec;
            cut.train.global_batch_size = fewest;
            std::vector<std::pair<int, std::vector<int>>> cut_states;
            for (const InFlightState& s : InFlightStates(cut, p)) {
              cut_states.emplace_back(s.backward_chunk, s.live_per_chunk);
            }
            EXPECT_EQ(cut_states, want) << "pp " << pp << " vpp " << vpp << " m " << m;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
  // The largest global batch: the same states as a short one of the same layout, at once.
  SearchSpec big = testing::DenseSpec();
  big.model.num_layers = 16;
  big.parallel.pipeline_model_parallel_size = 4;
  big.parallel.virtual_pipeline_model_parallel_size = 4;
  big.train.global_batch_size = 1 << 24;
  SearchSpec small = big;
  small.train.global_batch_size = 64;
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(InFlightStates(big, p).size(), InFlightStates(small, p).size());
    EXPECT_EQ(MaxInFlight(big, p), MaxInFlight(small, p));
  }
}

}  // namespace
}  // namespace remat::search
