// What of FP8 the builtin engine runs (search/fp8_support.h), through BuiltinBackendProblem: the
// Transformer Engine layer's tensorwise and delayed recipes in e4m3 and hybrid; every other FP8
// setting refused with one line naming its field.

#include "search/fp8_support.h"

#include <gtest/gtest.h>

#include <string>

#include "search/spec.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

SearchSpec TeFp8(const char* format, const char* recipe) {
  SearchSpec s = testing::DenseSpec();
  s.model.transformer_impl = TransformerImpl::kTransformerEngine;
  s.model.attention_backend = AttentionBackend::kFlash;
  s.model.fp8 = format;
  s.model.fp8_recipe = recipe;
  s.search.device = Device::kAuto;
  return s;
}

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(Fp8SupportTest, TensorwiseAndDelayedRunUnderTransformerEngine) {
  for (const char* format : {"e4m3", "hybrid"}) {
    for (const char* recipe : {"tensorwise", "delayed"}) {
      SearchSpec s = TeFp8(format, recipe);
      ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
      EXPECT_EQ(BuiltinBackendProblem(s), "") << format << " " << recipe;
      s.search.device = Device::kCuda;
      EXPECT_EQ(BuiltinBackendProblem(s), "") << format << " " << recipe;
    }
  }
  SearchSpec off = testing::DenseSpec();  // FP8 off: nothing to say, whatever else is set
  EXPECT_EQ(Fp8BuiltinProblem(off), "");
}

TEST(Fp8SupportTest, WhatTheEngineDoesNotRunIsRefusedNamingTheField) {
  struct Case {
    const char* field;
    const char* why;
    void (*change)(SearchSpec&);
  };
  const Case cases[] = {
      {"model.fp8:", "search.device is cpu", [](SearchSpec& s) { s.search.device = Device::kCpu; }},
      {"model.fp8:", "transformer_impl",
       [](SearchSpec& s) { s.model.transformer_impl = TransformerImpl::kLocal; }},
      {"model.fp8_recipe:", "Blackwell", [](SearchSpec& s) { s.model.fp8_recipe = "mxfp8"; }},
      {"model.fp8_recipe:", "blockwise", [](SearchSpec& s) { s.model.fp8_recipe = "blockwise"; }},
      {"model.fp8_recipe:", "custom", [](SearchSpec& s) { s.model.fp8_recipe = "custom"; }},
      {"train.fp8_param_gather:", "FP8 parameters",
       [](SearchSpec& s) { s.train.fp8_param_gather = true; }},
      {"model.fp8:", "mixture-of-experts",
       [](SearchSpec& s) {
         s.model.num_moe_experts = 8;
         s.model.moe_router_topk = 2;
         s.model.add_bias_linear = false;
       }},
      {"model.fp8:", "divisible by 16", [](SearchSpec& s) { s.model.seq_length = 1000; }},
      {"model.fp8:", "sequence_parallel",
       [](SearchSpec& s) {
         s.parallel.tensor_model_parallel_size = 2;
         s.parallel.sequence_parallel = true;
       }},
  };
  for (const Case& c : cases) {
    SearchSpec s = TeFp8("hybrid", "tensorwise");
    c.change(s);
    const std::string problem = BuiltinBackendProblem(s);
    EXPECT_TRUE(StartsWith(problem, c.field)) << c.why << ": " << problem;
    EXPECT_NE(problem.find(c.why), std::string::npos) << problem;
    EXPECT_EQ(problem.find('\n'), std::string::npos) << problem;
  }
  // Tensor parallelism without sequence parallelism runs.
  SearchSpec tp = TeFp8("hybrid", "delayed");
  tp.parallel.tensor_model_parallel_size = 2;
  EXPECT_EQ(Fp8BuiltinProblem(tp), "");
}

}  // namespace
}  // namespace remat::search
