// Rendering a fixed Search: the readable report, the contract's JSON (keys checked), the SVG and
// progress lines. The fixture carries what the coordinator decides (apply strings, nothing-fits
// message, fragmentation findings, budget in bytes, memory metric); the coordinator's side of
// those is tested in tests/server (search_run_test, search_views_test).
#include "cli/render.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "proto/convert.h"
#include "search/frontier.h"

namespace remat::cli {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

v1::Trial* AddTrial(v1::Search* s, const std::string& policy, v1::TrialStatus status,
                    std::vector<std::pair<uint64_t, uint64_t>> ranks, double step_time_s,
                    const std::string& message = "") {
  v1::Trial* t = s->add_trials();
  t->set_id("t-" + std::to_string(s->trials_size()));
  t->mutable_policy()->set_canonical(policy);
  t->set_status(status);
  t->set_attempts(1);
  v1::TrialResult* r = t->mutable_result();
  r->mutable_policy()->set_canonical(policy);
  r->set_status(status);
  for (size_t i = 0; i < ranks.size(); ++i) {
    v1::RankResult* rr = r->add_ranks();
    rr->set_rank(static_cast<int>(i));
    rr->set_peak_allocated_bytes(ranks[i].first);
    rr->set_peak_reserved_bytes(ranks[i].second);
  }
  if (status == v1::TRIAL_STATUS_OK) {
    r->set_step_time_s(step_time_s);
    r->set_tokens_per_s(4096.0 / step_time_s);
    r->set_loss(10.5);
    r->set_grad_norm(2.25);
  }
  r->set_message(message);
  return t;
}

// The fixture's trials as the coordinator holds them.
std::vector<search::TrialResult> DomainResults(const v1::Search& s) {
  std::vector<search::TrialResult> results;
  for (const auto& t : s.trials()) {
    auto r = proto::FromProto(t.result());
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (r.ok()) results.push_back(*r);
  }
  return results;
}

// A finished search on a budget of 10 GiB (reserved), two ranks per trial.
v1::Search FixedSearch() {
  v1::Search s;
  s.set_id("s-fixed");
  s.set_state(v1::SEARCH_STATE_SUCCEEDED);
  s.mutable_spec()->set_name("fixture");
  s.mutable_spec()->mutable_model()->set_seq_length(4096);
  s.mutable_spec()->mutable_search()->set_memory_metric("reserved");
  s.mutable_spec()->mutable_search()->set_memory_budget_gib(10);
  s.set_memory_budget_bytes(10 * kGiB);
  s.set_memory_metric("reserved");
  AddTrial(&s, "selective:[]", v1::TRIAL_STATUS_OK, {{8 * kGiB, 9 * kGiB}, {7 * kGiB, 8 * kGiB}},
           4.096);  // 1000 tokens/s
  AddTrial(&s, "selective:[core_attn]", v1::TRIAL_STATUS_OK,
           {{11 * kGiB / 2, 6 * kGiB}, {5 * kGiB, 5 * kGiB}}, 4.096 / 0.9);
  AddTrial(&s, "selective:[mlp]", v1::TRIAL_STATUS_OK,
           {{13 * kGiB / 2, 7 * kGiB}, {13 * kGiB / 2, 7 * kGiB}}, 4.096 / 0.8)
      ->mutable_result()
      ->set_reused(true);
  v1::TrialResult* predicted =
      AddTrial(&s, "full:uniform:1", v1::TRIAL_STATUS_OK,
               {{7 * kGiB / 2, 4 * kGiB}, {7 * kGiB / 2, 4 * kGiB}}, 4.096 / 0.7)
          ->mutable_result();
  predicted->set_predicted(true);
  for (int depth : {2, 4}) {
    v1::ProxyMeasurement* p = predicted->add_proxies();
    p->set_num_layers(depth);
    p->set_step_time_s(depth * 0.5);
    p->add_ranks()->set_peak_reserved_bytes(depth * kGiB / 4);
  }
  AddTrial(&s, "full:block:1", v1::TRIAL_STATUS_OOM, {{10 * kGiB + kGiB / 2, 10 * kGiB + kGiB / 2}},
           0, "rank 0: CUDA out of memory");
  AddTrial(&s, "selective:[layernorm]", v1::TRIAL_STATUS_FAILED, {}, 0,
           "rank 1: remat-trial killed by signal 11 (Segmentation fault)");
  // Reserved far above allocated: a fragmentation finding. Its steps spread by 25%: noisy.
  AddTrial(&s, "selective:[core_attn,mlp]", v1::TRIAL_STATUS_OK,
           {{3 * kGiB, 9 * kGiB + kGiB / 2}, {3 * kGiB, 3 * kGiB}}, 4.096 / 0.5)
      ->mutable_result()
      ->set_step_time_spread_s(0.25 * 4.096 / 0.5);
  for (const char* p : {"full:uniform:1", "selective:[core_attn]", "selective:[]"}) {
    s.add_frontier(p);
  }
  s.set_recommendation("selective:[]");
  s.mutable_apply()->set_megatron_bridge(
      "model.recompute_granularity=selective model.recompute_modules=[]");
  s.mutable_apply()->set_megatron_lm_remove("--recompute-granularity --recompute-method");
  s.set_trials_done(7);
  s.set_trials_planned(7);
  // What the coordinator finds (search::DiagnoseFragmentation over the finished trials).
  for (const auto& r : DomainResults(s)) {
    for (const auto& f : search::DiagnoseFragmentation(r, s.memory_budget_bytes())) {
      s.add_fragmentation(f);
    }
  }
  return s;
}

TEST(Render, FixtureFrontierMatchesTheSearchCore) {
  // The fixture must be self-consistent for the tests below to mean anything.
  v1::Search s = FixedSearch();
  std::vector<search::TrialResult> results = DomainResults(s);
  ASSERT_EQ(results.size(), 7u);
  auto frontier = search::ComputeFrontier(results, search::MemoryMetric::kReserved, 10 * kGiB);
  std::vector<std::string> got;
  for (const auto& p : frontier) got.push_back(p.policy.ToString());
  EXPECT_EQ(got, std::vector<std::string>(s.frontier().begin(), s.frontier().end()));
  auto spec = proto::FromProto(s.spec());
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(search::RecommendPolicy(*spec, results)->choice.policy.ToString(), s.recommendation());
  EXPECT_EQ(s.fragmentation_size(), 1);
}

TEST(Render, JsonHasTheContractKeys) {
  auto j = nlohmann::json::parse(ResultJson(FixedSearch()));
  for (const char* key : {"id", "state", "memory_metric", "memory_budget_bytes", "trials",
                          "frontier", "recommendation", "apply"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["id"], "s-fixed");
  EXPECT_EQ(j["state"], "succeeded");
  EXPECT_EQ(j["memory_metric"], "reserved");
  EXPECT_EQ(j["memory_budget_bytes"].get<uint64_t>(), 10 * kGiB);
  ASSERT_EQ(j["trials"].size(), 7u);
  for (const auto& t : j["trials"]) {
    for (const char* key :
         {"policy", "status", "peak_allocated_bytes", "peak_reserved_bytes", "ranks", "step_time_s",
          "tokens_per_s", "loss", "grad_norm", "message"}) {
      EXPECT_TRUE(t.contains(key)) << key;
    }
    for (const auto& r : t["ranks"]) {
      for (const char* key : {"rank", "peak_allocated_bytes", "peak_reserved_bytes"}) {
        EXPECT_TRUE(r.contains(key)) << key;
      }
    }
  }
  const auto& control = j["trials"][0];
  EXPECT_EQ(control["policy"], "selective:[]");
  EXPECT_EQ(control["status"], "ok");
  EXPECT_EQ(control["peak_allocated_bytes"].get<uint64_t>(), 8 * kGiB);  // max over ranks
  EXPECT_EQ(control["peak_reserved_bytes"].get<uint64_t>(), 9 * kGiB);
  EXPECT_EQ(control["ranks"][1]["peak_reserved_bytes"].get<uint64_t>(), 8 * kGiB);
  EXPECT_DOUBLE_EQ(control["tokens_per_s"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(control["loss"].get<double>(), 10.5);
  // Unknown figures are null, not zero: an oom trial has no throughput or loss, a rank that did
  // not report its static bytes has none.
  EXPECT_EQ(j["trials"][4]["status"], "oom");
  EXPECT_TRUE(j["trials"][4]["tokens_per_s"].is_null());
  EXPECT_TRUE(j["trials"][4]["loss"].is_null());
  EXPECT_TRUE(j["trials"][4]["step_time_s"].is_null());
  EXPECT_TRUE(control["ranks"][0]["static_bytes"].is_null());  // the fixture reports none
  EXPECT_TRUE(control["setup_s"].is_null());
  for (const auto& t : j["trials"]) {
    for (const auto& r : t["ranks"]) {
      EXPECT_TRUE(r["static_bytes"].is_null() || r["static_bytes"].get<uint64_t>() > 0);
    }
    EXPECT_TRUE(t["loss"].is_null() || t["loss"].get<double>() != 0) << t.dump();
  }
  EXPECT_EQ(j["trials"][5]["status"], "failed");
  EXPECT_EQ(j["trials"][5]["message"],
            "rank 1: remat-trial killed by signal 11 (Segmentation fault)");
  EXPECT_EQ(j["frontier"],
            nlohmann::json({"full:uniform:1", "selective:[core_attn]", "selective:[]"}));
  EXPECT_EQ(j["recommendation"], "selective:[]");
  EXPECT_EQ(j["apply"]["megatron_bridge"],
            "model.recompute_granularity=selective model.recompute_modules=[]");
  EXPECT_EQ(j["apply"]["megatron_lm"], "");
  EXPECT_EQ(j["apply"]["megatron_lm_remove"], "--recompute-granularity --recompute-method");
  EXPECT_EQ(j["fragmentation"].size(), 1u);
  const auto& proxied = j["trials"][3];
  EXPECT_EQ(proxied["predicted"], true);
  ASSERT_EQ(proxied["proxies"].size(), 2u);
  EXPECT_EQ(proxied["proxies"][1]["num_layers"], 4);
  EXPECT_EQ(proxied["proxies"][1]["ranks"][0]["peak_reserved_bytes"].get<uint64_t>(), kGiB);
  EXPECT_FALSE(control.contains("proxies"));
}

// The warm-up each trial took, near-tie re-measures, the numerics check against the
// control and the versions and spec the search ran with, as the coordinator decided them.
v1::Search SearchWithProvenance() {
  v1::Search s = FixedSearch();
  s.mutable_spec()->mutable_train()->set_precision("bf16");
  s.mutable_spec()->mutable_search()->set_steady_window(3);
  s.mutable_spec()->mutable_search()->set_steady_tolerance(0.05);
  for (v1::Trial& t : *s.mutable_trials()) {
    if (t.status() != v1::TRIAL_STATUS_OK) continue;
    t.mutable_result()->set_warmup_steps_taken(4);
    t.mutable_result()->set_warmup_settled(true);
    t.mutable_result()->mutable_ranks(0)->set_warmup_steps_taken(4);
    for (double w : {0.9, 0.5, 0.41, 0.4}) t.mutable_result()->mutable_ranks(0)->add_warmup_step_times_s(w);
    (*t.mutable_result()->mutable_versions())["remat"] = "0.9.0";
  }
  v1::Trial* core_attn = s.mutable_trials(1);
  core_attn->mutable_result()->set_warmup_steps_taken(8);
  core_attn->mutable_result()->set_warmup_settled(false);
  const std::string off =
      "selective:[mlp]: loss 10.6 vs the control's 10.5 (9.5e-03 relative; tolerance 1.0e-03, bf16)";
  s.mutable_trials(2)->set_numerics_mismatch(off);
  s.add_numerics_mismatches(off);
  s.set_numerics_compared(3);
  s.set_numerics_tolerance(1e-3);
  s.set_numerics_reference("selective:[]");
  v1::Trial* again = s.add_trials();
  *again = s.trials(0);
  again->set_id("t-again");
  again->set_remeasure(true);
  again->set_reason("re-measure: frontier point within 0.5% of selective:[core_attn] (noise band 1.0%)");
  *again->mutable_combined() = again->result();
  again->mutable_combined()->set_tokens_per_s(977);
  (*s.mutable_versions())["remat"] = "0.9.0";
  (*s.mutable_versions())["gpu"] = "NVIDIA H200";
  (*s.mutable_versions())["driver"] = "550.54.15 | 560.1";
  return s;
}

TEST(Render, JsonCarriesWarmupNumericsVersionsAndSpec) {
  const nlohmann::json j = nlohmann::json::parse(ResultJson(SearchWithProvenance()));
  const nlohmann::json& control = j["trials"][0];
  EXPECT_EQ(control["warmup_steps_taken"], 4);
  EXPECT_EQ(control["warmup_settled"], true);
  EXPECT_EQ(control["ranks"][0]["warmup_step_times_s"].size(), 4u);
  EXPECT_TRUE(control["numerics_mismatch"].is_null());
  EXPECT_EQ(control["remeasure"], false);
  EXPECT_EQ(control["versions"]["remat"], "0.9.0");
  EXPECT_EQ(j["trials"][1]["warmup_settled"], false);
  EXPECT_NE(j["trials"][2]["numerics_mismatch"].get<std::string>().find("loss 10.6"),
            std::string::npos);
  EXPECT_TRUE(j["trials"][4]["warmup_steps_taken"].is_null());  // the oom trial measured nothing
  EXPECT_EQ(j["trials"].back()["remeasure"], true);
  EXPECT_EQ(j["trials"].back()["combined"]["tokens_per_s"], 977);
  EXPECT_TRUE(control["combined"].is_null());
  EXPECT_EQ(j["numerics"]["ok"], false);
  EXPECT_EQ(j["numerics"]["compared"], 3);
  EXPECT_DOUBLE_EQ(j["numerics"]["tolerance"].get<double>(), 1e-3);
  EXPECT_EQ(j["numerics"]["mismatches"].size(), 1u);
  EXPECT_EQ(j["numerics"]["reference"], "selective:[]");
  EXPECT_EQ(j["versions"]["gpu"], "NVIDIA H200");
  EXPECT_EQ(j["spec"]["name"], "fixture");
  EXPECT_EQ(j["spec"]["search"]["steady_window"], 3);
}

TEST(Render, ReportMarksUnsettledRemeasuredAndNumericsOff) {
  std::ostringstream out;
  RenderReport(SearchWithProvenance(), out);
  const std::string text = out.str();
  for (const std::string needle :
       {"warm-up unsettled", "re-measure", "NUMERICS OFF", "NUMERICS OFF: selective:[mlp]: loss 10.6",
        "warm-up: 4-8 steps before the measured ones (until the last 3 agreed within 5%)",
        "1 trial(s) reached search.warmup_max_steps unsettled",
        "numerics: 1 of 3 trials DO NOT match the control's loss and grad norm (see notes)",
        "recommendation: selective:[]  (9.00 GiB reserved peak per rank, 977 tokens/s)",
        "(tolerance 1e-03 relative, bf16)", "tokens/s  warm-up", "ran with: remat 0.9.0; driver 550.54.15 | 560.1; gpu NVIDIA H200;"}) {
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in\n" << text;
  }
  // The recommended policy, measured twice, is marked once: on its last trial.
  const size_t first = text.find("<- recommended");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(text.find("<- recommended", first + 1), std::string::npos) << text;
}

TEST(Render, JsonWhenNothingFits) {
  v1::Search s = FixedSearch();
  s.clear_frontier();
  s.clear_recommendation();
  s.clear_apply();
  s.set_memory_budget_bytes(2 * kGiB);
  s.set_message(search::NothingFitsMessage(DomainResults(s), search::MemoryMetric::kReserved,
                                           2 * kGiB));  // the coordinator's
  auto j = nlohmann::json::parse(ResultJson(s));
  EXPECT_TRUE(j["recommendation"].is_null());
  EXPECT_TRUE(j["apply"].is_null());
  EXPECT_NE(j["message"].get<std::string>().find("no policy fits"), std::string::npos);
  EXPECT_NE(j["message"].get<std::string>().find("closest: full:uniform:1"), std::string::npos)
      << j["message"];
}

TEST(Render, ReportShowsTableFrontierRecommendationAndFindings) {
  std::ostringstream out;
  RenderReport(FixedSearch(), out);
  const std::string text = out.str();
  auto has = [&](const std::string& needle) {
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in\n" << text;
  };
  has("search s-fixed (fixture): succeeded, 7 of 7 trials done, budget 10.00 GiB per rank");
  has("alloc GiB");
  has("resv GiB");
  has("tokens/s");
  has("* selective:[core_attn]");
  has("  selective:[mlp]  ");
  has("reused");
  has("predicted from 2 and 4 layers");
  has("<- recommended");
  has("9.00");    // the control's reserved peak, max over ranks
  has("4.0960");  // its step time
  has("1000");
  has("full:block:1 (oom): rank 0: CUDA out of memory");
  has("frontier (reserved memory ascending):");
  has("recommendation: selective:[]");
  has("apply with Megatron Bridge:  model.recompute_granularity=selective "
      "model.recompute_modules=[]");
  has("  after removing (with values): --recompute-granularity --recompute-method\n");
  has("fragmentation:");
  has("selective:[core_attn,mlp]: rank 0 reserved");
  has("noisy: 1 trial(s) whose measured steps spread by more than 10% of the step time (up to "
      "25%)");
  // Only that trial carries the mark (the others' spread is 0).
  EXPECT_EQ(text.find("noisy"), text.find("noisy", text.find("selective:[core_attn,mlp]")));
  // The frontier section lists memory ascending.
  const size_t f = text.find("frontier (");
  EXPECT_LT(text.find("full:uniform:1", f), text.find("selective:[core_attn]", f));
  // The dominated trial carries no frontier mark.
  EXPECT_EQ(text.find("* selective:[mlp]"), std::string::npos);
}

// The recommendation's detail: why the choice fell where it did, and the tied policies.
v1::Search WithDetail() {
  v1::Search s = FixedSearch();
  v1::RecommendationDetail* d = s.mutable_recommendation_detail();
  auto fill = [](v1::RecommendationCandidate* c, const std::string& policy, double tokens,
                 double below, double flops) {
    c->set_policy(policy);
    c->set_tokens_per_s(tokens);
    c->set_below_best(below);
    c->set_tolerance(0.03);
    c->set_recompute_flops(flops);
    c->set_memory_bytes(9 * kGiB);
  };
  fill(d->mutable_choice(), "selective:[]", 1000, 0.02, 0);
  fill(d->mutable_best(), "selective:[core_attn]", 1020, 0, 5e9);
  fill(d->add_tied(), "selective:[]", 1000, 0.02, 0);
  fill(d->add_tied(), "selective:[core_attn]", 1020, 0, 5e9);
  d->set_budget_bytes(10 * kGiB);
  d->set_reason("2 policies within 10.00 GiB are within the measurement noise of the best");
  return s;
}

TEST(Render, ReportShowsWhyAndTheTiedPolicies) {
  std::ostringstream out;
  RenderReport(WithDetail(), out);
  const std::string text = out.str();
  for (const char* needle : {"why: 2 policies within 10.00 GiB are within the measurement noise",
                             "tied within the noise of the best (least recompute first):",
                             "replayed GFLOP/step", "2.0%", "3.0%", "5.0"}) {
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in\n" << text;
  }
  // Without a detail (nothing tied, or an older coordinator) there is no table.
  std::ostringstream plain;
  RenderReport(FixedSearch(), plain);
  EXPECT_EQ(plain.str().find("tied within"), std::string::npos);
}

TEST(Render, JsonCarriesTheRecommendationDetail) {
  auto j = nlohmann::json::parse(ResultJson(WithDetail()));
  const auto& d = j.at("recommendation_detail");
  EXPECT_EQ(d.at("choice"), "selective:[]");
  EXPECT_EQ(d.at("best"), "selective:[core_attn]");
  ASSERT_EQ(d.at("tied").size(), 2u);
  EXPECT_DOUBLE_EQ(d.at("tied")[0].at("below_best").get<double>(), 0.02);
  EXPECT_DOUBLE_EQ(d.at("tied")[1].at("recompute_flops").get<double>(), 5e9);
  EXPECT_NE(d.at("reason").get<std::string>().find("measurement noise"), std::string::npos);
  EXPECT_TRUE(
      nlohmann::json::parse(ResultJson(FixedSearch())).at("recommendation_detail").is_null());
}

TEST(Render, ReportSaysWhyNothingFits) {
  v1::Search s = FixedSearch();
  s.clear_frontier();
  s.clear_recommendation();
  s.set_message("no policy fits the budget of 2.0 GiB; closest: full:uniform:1 at 4.0 GiB");
  std::ostringstream out;
  RenderReport(s, out);
  EXPECT_NE(out.str().find("no recommendation: no policy fits the budget of 2.0 GiB; closest: "
                           "full:uniform:1"),
            std::string::npos)
      << out.str();
  EXPECT_EQ(out.str().find("apply with"), std::string::npos);
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

TEST(Render, SvgPlotsTrialsFrontierOomAndBudget) {
  const std::string svg = ResultSvg(FixedSearch());
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(Count(svg, "class=\"trial\""), 5);  // the ok trials
  EXPECT_EQ(Count(svg, "class=\"oom\""), 1);
  EXPECT_EQ(Count(svg, "class=\"frontier\""), 1);
  EXPECT_EQ(Count(svg, "class=\"budget\""), 1);
  EXPECT_NE(svg.find(">full:block:1 (oom)<"), std::string::npos);
  EXPECT_NE(svg.find(">selective:[] (recommended)<"), std::string::npos);
  EXPECT_NE(svg.find("budget 10 GiB"), std::string::npos);
  // The frontier is a step line: three points, two steps (H then V each), then on to the budget.
  const size_t d = svg.find("class=\"frontier\" d=\"");
  const std::string path = svg.substr(d, svg.find('"', d + 20) - d);
  EXPECT_EQ(Count(path, " H"), 3);
  EXPECT_EQ(Count(path, " V"), 2);
  // Tags balance.
  EXPECT_EQ(Count(svg, "<g"), Count(svg, "</g>"));
  EXPECT_EQ(Count(svg, "<text"), Count(svg, "</text>"));
}

TEST(Render, TinyModelsAreShownInMiBWithTheBudgetOffTheChart) {
  v1::Search s;
  s.set_id("s-tiny");
  s.set_state(v1::SEARCH_STATE_SUCCEEDED);
  s.mutable_spec()->mutable_model()->set_seq_length(4096);
  s.set_memory_budget_bytes(kGiB);
  s.set_memory_metric("reserved");
  AddTrial(&s, "selective:[]", v1::TRIAL_STATUS_OK, {{7 << 20, 7 << 20}}, 2.0);
  AddTrial(&s, "full:uniform:1", v1::TRIAL_STATUS_OK, {{(11 << 20) / 2, (11 << 20) / 2}}, 2.5);
  s.add_frontier("full:uniform:1");
  s.add_frontier("selective:[]");
  s.set_recommendation("selective:[]");
  std::ostringstream out;
  RenderReport(s, out);
  EXPECT_NE(out.str().find("alloc MiB"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("5.50 MiB"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("budget 1.00 GiB per rank"), std::string::npos) << out.str();
  const std::string svg = ResultSvg(s);
  EXPECT_NE(svg.find("peak memory per rank (MiB, reserved"), std::string::npos);
  // One unit on the axis, and the budget in it.
  EXPECT_NE(svg.find("budget 1024 MiB (off the chart, to the right)"), std::string::npos);
  EXPECT_EQ(svg.find("<line class=\"budget\""), std::string::npos);
}

struct DrawnLabel {
  double x0, y0, x1, y1;
  std::string text;
};
// The trial labels of an SVG, with the boxes the renderer reserves for them (12 px font, 6.6 px a
// character, baseline at y).
std::vector<DrawnLabel> Labels(const std::string& svg) {
  std::vector<DrawnLabel> out;
  const std::string open = "<text class=\"label\" x=\"";
  for (size_t p = svg.find(open); p != std::string::npos; p = svg.find(open, p + 1)) {
    const double x = std::stod(svg.substr(p + open.size()));
    const size_t yp = svg.find("y=\"", p) + 3;
    const double y = std::stod(svg.substr(yp));
    const size_t t0 = svg.find('>', p) + 1;
    const std::string text = svg.substr(t0, svg.find("</text>", t0) - t0);
    out.push_back({x, y - 11, x + 6.6 * static_cast<double>(text.size()), y + 2, text});
  }
  return out;
}

TEST(Render, SvgLabelsNeverOverlapAndEveryFrontierPointIsNamed) {
  // Thirty frontier points packed within a few pixels (two far points set the axes): no free spot
  // near most of them.
  v1::Search s;
  s.set_id("s-dense");
  s.set_state(v1::SEARCH_STATE_SUCCEEDED);
  s.mutable_spec()->mutable_model()->set_seq_length(4096);
  s.set_memory_budget_bytes(10 * kGiB);
  s.set_memory_metric("reserved");
  for (int i = 0; i < 30; ++i) {
    const std::string policy = "full:block:" + std::to_string(i + 1);
    const uint64_t mem = 6 * kGiB - static_cast<uint64_t>(i) * (kGiB / 512);
    AddTrial(&s, policy, v1::TRIAL_STATUS_OK, {{mem, mem}}, 4.0 + 0.001 * i);
    s.add_frontier(policy);
  }
  AddTrial(&s, "selective:[]", v1::TRIAL_STATUS_OK, {{9 * kGiB, 9 * kGiB}}, 2.0);
  AddTrial(&s, "full:uniform:1", v1::TRIAL_STATUS_OK, {{2 * kGiB, 2 * kGiB}}, 8.0);
  s.add_frontier("selective:[]");
  s.add_frontier("full:uniform:1");
  s.set_recommendation("full:block:1");
  const std::string svg = ResultSvg(s);
  const std::vector<DrawnLabel> labels = Labels(svg);
  ASSERT_EQ(labels.size(), 32u) << svg;
  for (size_t i = 0; i < labels.size(); ++i) {
    for (size_t j = i + 1; j < labels.size(); ++j) {
      const DrawnLabel& a = labels[i];
      const DrawnLabel& b = labels[j];
      const bool apart = a.x1 < b.x0 || b.x1 < a.x0 || a.y1 < b.y0 || b.y1 < a.y0;
      EXPECT_TRUE(apart) << a.text << " overlaps " << b.text;
    }
  }
  // Those without a free spot sit in a column right of the plot, each with a leader line, and the
  // picture widens to hold them.
  EXPECT_GT(Count(svg, "class=\"leader\""), 0);
  EXPECT_EQ(svg.find("width=\"960\" height"), std::string::npos);
  EXPECT_EQ(Count(svg, "<text"), Count(svg, "</text>"));
}

TEST(Render, SvgDrawsEachPointsMeasuredSpread) {
  v1::Search s = FixedSearch();
  // selective:[] reports its steps: 4.0, 4.096, 4.5 s.
  v1::RankResult* r = s.mutable_trials(0)->mutable_result()->mutable_ranks(0);
  r->set_step_time_s(4.096);
  for (double t : {4.0, 4.096, 4.5}) r->add_step_times_s(t);
  const std::string svg = ResultSvg(s);
  // That one from its steps, selective:[core_attn,mlp] from its step_time_spread_s.
  EXPECT_EQ(Count(svg, "class=\"spread\""), 2) << svg;
}

TEST(Render, SvgDrawsAReMeasuredPolicyOnceWithItsPooledFigures) {
  v1::Search s = FixedSearch();
  const int before = Count(ResultSvg(s), "class=\"trial\"");
  v1::Trial* again = AddTrial(&s, "selective:[core_attn]", v1::TRIAL_STATUS_OK,
                              {{11 * kGiB / 2, 6 * kGiB}, {5 * kGiB, 5 * kGiB}}, 4.0);
  again->set_remeasure(true);
  *again->mutable_combined() = again->result();
  again->mutable_combined()->set_tokens_per_s(1234.5);
  const std::string svg = ResultSvg(s);
  EXPECT_EQ(Count(svg, "class=\"trial\""), before);  // still one point for the policy
}

TEST(Render, SvgEscapesAndSurvivesAnEmptySearch) {
  v1::Search s;
  s.mutable_spec()->set_name("a<b & \"c\"");
  const std::string svg = ResultSvg(s);
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_EQ(Count(svg, "class=\"trial\""), 0);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(Render, ProgressLines) {
  v1::SearchProgress p;
  p.set_id("s-1");
  p.set_state(v1::SEARCH_STATE_RUNNING);
  p.set_trials_done(3);
  p.set_trials_planned(12);
  p.set_trials_running(2);
  p.set_elapsed_s(75);
  p.set_eta_s(200);
  p.set_best_policy("selective:[core_attn]");
  p.set_best_tokens_per_s(7700);
  p.set_best_peak_bytes(61 * kGiB);
  EXPECT_EQ(ProgressLine(p, /*tty=*/false),
            "progress: 3/12 trials done, 2 running, 1m15s elapsed, ETA 3m20s, state running; "
            "best so far: selective:[core_attn] (7700 tokens/s at 61.00 GiB)");
  EXPECT_EQ(ProgressLine(p, /*tty=*/true),
            "[######------------------] 3/12 trials, 2 running, 1m15s elapsed, ETA 3m20s, best "
            "selective:[core_attn] (7700 tokens/s at 61.00 GiB)");
  p.set_trials_planned_revised_from(10);
  EXPECT_NE(ProgressLine(p, false).find("progress: 3/12 (total revised from 10) trials done"),
            std::string::npos);
  EXPECT_NE(ProgressLine(p, true).find(" 3/12 (total revised from 10) trials, "),
            std::string::npos);
  p.clear_best_policy();
  p.set_eta_s(0);
  EXPECT_NE(ProgressLine(p, false).find("ETA ?, state running; no point fits yet"),
            std::string::npos);
}

TEST(Render, ListTable) {
  v1::ListSearchesResponse list;
  v1::SearchSummary* s = list.add_searches();
  s->set_id("s-1");
  s->set_name("llama");
  s->set_owner("alice");
  s->set_state(v1::SEARCH_STATE_RUNNING);
  s->set_trials_done(2);
  s->set_trials_planned(9);
  std::ostringstream out;
  RenderList(list, out);
  EXPECT_NE(out.str().find("s-1  llama  alice  running   2/9      -"), std::string::npos)
      << out.str();
  // Why a search waits is on its row.
  s->set_state(v1::SEARCH_STATE_QUEUED);
  s->set_message("waiting: no connected worker offers command template \"x\"");
  std::ostringstream waiting;
  RenderList(list, waiting);
  EXPECT_NE(waiting.str().find("-  (waiting: no connected worker offers command template \"x\")"),
            std::string::npos)
      << waiting.str();
}


// A layout proxy's trial (search/layout_proxy.h): every rank of a PP 4 layout (2 ranks per
// stage), the stages measured named in proxies[]. The report lists each stage's peak with the
// measured ones starred, and the plot draws the stages' peaks as ticks beside the point.
TEST(Render, LayoutProxyTrialsShowEachPipelineStagesPeak) {
  v1::Search s;
  s.set_id("s-layout");
  s.set_state(v1::SEARCH_STATE_SUCCEEDED);
  s.mutable_spec()->mutable_model()->set_seq_length(4096);
  s.mutable_spec()->mutable_parallel()->set_pipeline_model_parallel_size(4);
  s.set_memory_budget_bytes(80 * kGiB);
  s.set_memory_metric("reserved");
  const uint64_t stage_gib[4] = {57, 52, 49, 48};
  std::vector<std::pair<uint64_t, uint64_t>> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back({stage_gib[r / 2] * kGiB, stage_gib[r / 2] * kGiB});
  v1::TrialResult* r = AddTrial(&s, "selective:[]", v1::TRIAL_STATUS_OK, ranks, 40)->mutable_result();
  r->set_predicted(true);
  for (int stage : {0, 1, 3}) {  // stage 2 interpolated
    v1::ProxyMeasurement* p = r->add_proxies();
    p->set_role("stage " + std::to_string(stage));
    p->set_rank(stage * 2);
    p->set_num_layers(20);
  }
  s.add_frontier("selective:[]");
  s.set_recommendation("selective:[]");
  std::ostringstream out;
  RenderReport(s, out);
  const std::string text = out.str();
  EXPECT_NE(text.find("predicted from 3 stage proxies"), std::string::npos) << text;
  EXPECT_NE(text.find("a layout-proxy prediction"), std::string::npos) << text;
  EXPECT_NE(text.find("per pipeline stage"), std::string::npos) << text;
  EXPECT_NE(text.find("57.00*  52.00*  49.00   48.00*"), std::string::npos) << text;
  const std::string svg = ResultSvg(s);
  EXPECT_EQ(Count(svg, "class=\"stages\""), 1);
  EXPECT_NE(svg.find("stage peaks (layout proxy)"), std::string::npos);
  EXPECT_EQ(Count(svg, "<g"), Count(svg, "</g>"));
}

}  // namespace
}  // namespace remat::cli
