// The CLI's client side without a coordinator: reading specs into requests, error messages and
// exit codes, and the one-line error when the coordinator is unreachable.
#include "cli/client.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/local_search.h"
#include "cli/submit_request.h"

namespace remat::cli {
namespace {

std::string Example(const std::string& name) {
  return std::string(REMAT_SOURCE_DIR) + "/examples/" + name;
}

TEST(SubmitRequest, ReadsTheReplayTableTheSpecNames) {
  auto request = BuildSubmitRequest(Example("replay/llama3-8b-h100.yaml"));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->spec().search().backend(), "replay");
  EXPECT_GT(request->replay_table().trials_size(), 3);
  ASSERT_TRUE(request->replay_table().trials().count("selective:[]"));
  const auto& control = request->replay_table().trials().at("selective:[]");
  EXPECT_EQ(control.result().status(), v1::TRIAL_STATUS_OK);
  EXPECT_GT(control.result().ranks(0).peak_reserved_bytes(), 0u);
  // Defaults are resolved before sending.
  EXPECT_TRUE(request->spec().train().has_micro_batch_size());
}

TEST(SubmitRequest, BadSpecNamesTheField) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "remat-cli-bad-spec.yaml").string();
  std::ofstream(path) << "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"
                         "  seq_length: 16\n  vocab_size: 32\n  hiden_dropout: 0.1\n";
  auto request = BuildSubmitRequest(path);
  ASSERT_FALSE(request.ok());
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(request.status().message().find("model.hiden_dropout"), std::string::npos)
      << request.status().message();
  std::filesystem::remove(path);
  EXPECT_FALSE(BuildSubmitRequest("/nonexistent/spec.yaml").ok());
}

TEST(ClientErrors, MessagesAndExitCodes) {
  ClientOptions o;
  o.coordinator = "10.0.0.1:7000";
  o.timeout_s = 5;
  EXPECT_EQ(DescribeError(absl::UnavailableError("connection refused"), o),
            "cannot reach coordinator at 10.0.0.1:7000: connection refused");
  EXPECT_EQ(DescribeError(absl::DeadlineExceededError("x"), o),
            "cannot reach coordinator at 10.0.0.1:7000: no answer within 5 s (--timeout)");
  EXPECT_NE(DescribeError(absl::UnauthenticatedError("missing token"), o)
                .find("refused the request: unauthenticated: missing token"),
            std::string::npos);
  EXPECT_EQ(DescribeError(absl::InvalidArgumentError("model.hidden_size: must be positive"), o),
            "model.hidden_size: must be positive");
  EXPECT_EQ(ExitCode(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCode(absl::InvalidArgumentError("")), 2);
  EXPECT_EQ(ExitCode(absl::NotFoundError("")), 2);
  EXPECT_EQ(ExitCode(absl::UnavailableError("")), 1);
  EXPECT_EQ(ExitCode(absl::UnauthenticatedError("")), 1);
  EXPECT_EQ(ExitCode(absl::PermissionDeniedError("")), 1);
}

// Runs the CLI in-process, composed as remat's main composes it, capturing stdout and stderr.
int Cli(std::vector<std::string> args, std::string* out, std::string* err) {
  args.insert(args.begin(), "remat");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream o, e;
  auto* old_out = std::cout.rdbuf(o.rdbuf());
  auto* old_err = std::cerr.rdbuf(e.rdbuf());
  int code = RunCli(static_cast<int>(argv.size()), argv.data(), RunLocalSearch);
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  *out = o.str();
  *err = e.str();
  return code;
}

TEST(Cli, UnreachableCoordinatorIsOneReadableLine) {
  std::string out, err;
  EXPECT_EQ(Cli({"list", "--coordinator", "127.0.0.1:1", "--timeout", "5"}, &out, &err), 1);
  EXPECT_EQ(err.rfind("error: cannot reach coordinator at 127.0.0.1:1: ", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(Cli, BadArgumentsExitTwo) {
  std::string out, err;
  unsetenv("REMAT_COORDINATOR");
  EXPECT_EQ(Cli({"get", "s-1"}, &out, &err), 2);
  EXPECT_EQ(err, "error: --coordinator: required (HOST:PORT, or set REMAT_COORDINATOR)\n");
  EXPECT_EQ(Cli({"frobnicate"}, &out, &err), 2);
  EXPECT_EQ(err.rfind("error: ", 0), 0u);
  EXPECT_EQ(Cli({"submit", "/nonexistent/spec.yaml", "--coordinator", "127.0.0.1:1"}, &out, &err),
            2);
  EXPECT_EQ(err.rfind("error: spec \"/nonexistent/spec.yaml\": cannot be read", 0), 0u) << err;
  EXPECT_EQ(Cli({"search", Example("replay/llama3-8b-h100.yaml"), "--gpus", "x"}, &out, &err), 2)
      << err;
  EXPECT_EQ(Cli({"get", "s-1", "--coordinator", "127.0.0.1:1", "--token-file", "/nonexistent"},
                &out, &err),
            2);
  EXPECT_EQ(err, "error: --token-file: cannot read /nonexistent\n");
  EXPECT_EQ(Cli({"list", "--coordinator", "127.0.0.1:1", "--munge-socket", "/run/m"}, &out, &err),
            2);
  EXPECT_EQ(err, "error: --munge-socket: only with --munge\n");
  EXPECT_EQ(Cli({"list", "--coordinator", "127.0.0.1:1", "--munge", "--token-file", "/x"}, &out,
                &err),
            2);
  EXPECT_EQ(err, "error: --munge: not with --token-file\n");
}

// --munge with no munged to ask: the call is not made, and the error says why (exit 1).
TEST(Cli, MungeWithoutMungedSaysWhy) {
  std::string out, err;
  EXPECT_EQ(Cli({"list", "--coordinator", "127.0.0.1:1", "--munge", "--munge-socket",
                 "/nonexistent/munge.socket"},
                &out, &err),
            1);
  EXPECT_NE(err.find("--munge: no credential: munge"), std::string::npos) << err;
}

// remat_cli links neither the coordinator nor the worker: `remat search` needs the runner that
// remat's main (the composition root) hands it.
TEST(Cli, SearchWithoutTheComposedRunnerIsRefused) {
  std::string arg0 = "remat", arg1 = "search", arg2 = Example("replay/llama3-8b-h100.yaml");
  char* argv[] = {arg0.data(), arg1.data(), arg2.data()};
  std::ostringstream e;
  auto* old_err = std::cerr.rdbuf(e.rdbuf());
  const int code = RunCli(3, argv);
  std::cerr.rdbuf(old_err);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(e.str(), "error: search: this build of remat has no embedded search\n");
}

TEST(Cli, HelpExitsZero) {
  std::string out, err;
  EXPECT_EQ(Cli({"--help"}, &out, &err), 0);
  EXPECT_NE(out.find("search"), std::string::npos);
  EXPECT_NE(out.find("submit"), std::string::npos);
}

}  // namespace
}  // namespace remat::cli
