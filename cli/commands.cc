#include "cli/commands.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <fstream>
#include <iostream>
#include <optional>

#include "absl/strings/ascii.h"
#include "cli/client.h"
#include "cli/import_bridge.h"
#include "cli/import_megatron_lm.h"
#include "cli/plan_validate.h"
#include "cli/progress_printer.h"
#include "cli/render.h"
#include "cli/submit_request.h"
#include "common/main_util.h"
#include "common/version.h"
#include "search/limits.h"
#include "search/spec_fields.h"
#include "search/text.h"

namespace remat::cli {
namespace {

using common::Fail;
using common::ReadFile;

// The flags every client command shares.
struct ClientFlags {
  std::string coordinator;
  std::string token_file;
  std::string tls_ca;
  bool tls = false;
  bool munge = false;
  std::string munge_socket;
  double timeout_s = 30;

  void AddTo(CLI::App* app) {
    app->add_option("--coordinator", coordinator,
                    "the coordinator, HOST:PORT (default: env REMAT_COORDINATOR)");
    app->add_option("--token-file", token_file,
                    "file holding your bearer token (default: env REMAT_TOKEN)");
    app->add_flag("--munge", munge,
                  "authenticate with a MUNGE credential of the user running remat instead of a "
                  "token (a coordinator started with --munge-socket)");
    app->add_option("--munge-socket", munge_socket,
                    "with --munge: munged's socket (default: munge's own)");
    app->add_flag("--tls", tls, "connect with TLS (system roots unless --tls-ca)");
    app->add_option("--tls-ca", tls_ca, "PEM file of the CA that signed the coordinator's cert");
    app->add_option("--timeout", timeout_s, "deadline of each call, seconds")
        ->check(CLI::PositiveNumber);
  }

  // Fills `options`; returns an exit code != 0 (after printing the error) for bad flags.
  int Resolve(ClientOptions* options) const {
    options->coordinator = coordinator;
    if (options->coordinator.empty()) {
      if (const char* env = getenv("REMAT_COORDINATOR")) options->coordinator = env;
    }
    if (options->coordinator.empty()) {
      return Fail(2, "--coordinator: required (HOST:PORT, or set REMAT_COORDINATOR)");
    }
    if (!munge_socket.empty() && !munge) return Fail(2, "--munge-socket: only with --munge");
    if (munge && !token_file.empty()) return Fail(2, "--munge: not with --token-file");
    if (!token_file.empty()) {
      auto token = ReadFile(token_file);
      if (!token) return Fail(2, "--token-file: cannot read " + token_file);
      options->token = std::string(absl::StripAsciiWhitespace(*token));
      if (options->token.empty()) return Fail(2, "--token-file: " + token_file + " is empty");
    } else if (const char* env = getenv("REMAT_TOKEN")) {
      options->token = std::string(absl::StripAsciiWhitespace(env));
    }
    options->munge = munge;
    options->munge_socket = munge_socket;
    if (munge) options->token.clear();  // REMAT_TOKEN does not apply
    options->tls = tls || !tls_ca.empty();
    if (!tls_ca.empty()) {
      auto pem = ReadFile(tls_ca);
      if (!pem) return Fail(2, "--tls-ca: cannot read " + tls_ca);
      options->tls_ca_pem = *pem;
    }
    options->timeout_s = timeout_s;
    return 0;
  }
};

int ClientError(const absl::Status& status, const ClientOptions& options) {
  return Fail(ExitCode(status), DescribeError(status, options));
}

// `remat import ...`: the spec on stdout, exit 2 with the reason when the input cannot
// describe a model.
int PrintImport(const search::StatusOr<std::string>& spec) {
  if (!spec.ok()) return Fail(2, std::string(spec.status().message()));
  std::cout << *spec;
  return 0;
}

int RunImportBridge(const std::string& path, const std::vector<std::string>& overrides) {
  // A recipe someone handed over: a regular file of bounded size (not /dev/zero or a FIFO).
  common::FileText file = common::ReadRegularFile(path, search::limits::kMaxImportFileBytes);
  if (!file.text) return Fail(2, "FILE: " + search::QuoteForError(path, 256) + " " + file.error);
  const std::optional<std::string>& text = file.text;
  std::string name = path.substr(path.find_last_of('/') + 1);
  name = name.substr(0, name.find_last_of('.'));
  return PrintImport(ImportBridge(*text, overrides, name));
}

int RunSubmit(const std::string& spec_path, const ClientOptions& options) {
  auto request = BuildSubmitRequest(spec_path);
  if (!request.ok()) return Fail(2, std::string(request.status().message()));
  auto id = RematClient::Connect(options)->Submit(*request);
  if (!id.ok()) return ClientError(id.status(), options);
  std::cout << *id << std::endl;
  return 0;
}

// Writes the SVG plot when asked; returns an exit code.
int WriteSvg(const v1::Search& search, const std::string& svg_path) {
  if (svg_path.empty()) return 0;
  std::ofstream svg(svg_path, std::ios::binary | std::ios::trunc);
  if (!(svg << ResultSvg(search))) return Fail(1, "--svg: cannot write " + svg_path);
  return 0;
}

int RunGet(const std::string& id, bool json, const std::string& svg_path,
           const ClientOptions& options) {
  auto search = RematClient::Connect(options)->Get(id);
  if (!search.ok()) return ClientError(search.status(), options);
  if (int code = WriteSvg(*search, svg_path); code != 0) return code;
  if (json) {
    std::cout << ResultJson(*search);
  } else {
    RenderReport(*search, std::cout);
  }
  return 0;
}

int RunWatch(const std::string& id, const std::string& svg_path, const ClientOptions& options) {
  auto client = RematClient::Connect(options);
  auto search = client->Get(id);
  if (!search.ok()) return ClientError(search.status(), options);
  if (!IsFinal(search->state())) {
    ProgressPrinter printer(std::cout, isatty(STDOUT_FILENO), search->memory_metric());
    absl::Status watched =
        client->Watch(id, [&](const v1::SearchProgress& p) { printer.Update(p); });
    printer.Finish();
    if (!watched.ok()) return ClientError(watched, options);
    search = client->Get(id);
    if (!search.ok()) return ClientError(search.status(), options);
  }
  std::cout << "\n";
  RenderReport(*search, std::cout);
  if (int code = WriteSvg(*search, svg_path); code != 0) return code;
  return search->state() == v1::SEARCH_STATE_SUCCEEDED ? 0 : 1;
}

int RunCancel(const std::string& id, const ClientOptions& options) {
  auto state = RematClient::Connect(options)->Cancel(id);
  if (!state.ok()) return ClientError(state.status(), options);
  std::cout << "search " << id << ": " << StateName(*state) << std::endl;
  return 0;
}

int RunList(int limit, const ClientOptions& options) {
  auto list = RematClient::Connect(options)->List(limit);
  if (!list.ok()) return ClientError(list.status(), options);
  RenderList(*list, std::cout);
  return 0;
}

// Runs the local search with SIGINT/SIGTERM turned into a polite cancel.
int RunSearchWithSignals(LocalSearchOptions options, const LocalSearchRunner& run) {
  common::StopSignals stop_signals;
  std::atomic<bool> interrupted{false};
  stop_signals.OnStop([&](int) { interrupted = true; });
  options.interrupted = &interrupted;
  options.tty = isatty(STDOUT_FILENO);
  int code = run(options, std::cout, std::cerr);
  stop_signals.Finish();
  return code;
}

// `remat import megatron-lm ... -- ARGS`: everything after the `--` is Megatron-LM's, handed
// over unparsed (CLI11 would read its --flags as remat's). Returns those arguments and cuts
// argc before the `--`.
std::vector<std::string> TakeMegatronLmArgs(int& argc, char** argv) {
  std::vector<std::string> mlm_args;
  if (argc >= 3 && std::string(argv[1]) == "import" && std::string(argv[2]) == "megatron-lm") {
    for (int i = 3; i < argc; ++i) {
      if (std::string(argv[i]) == "--") {
        mlm_args.assign(argv + i + 1, argv + argc);
        argc = i;
        break;
      }
    }
  }
  return mlm_args;
}

// Every subcommand's options, and the subcommands (which one parsed says what to run).
struct CliArgs {
  std::string spec_path, policy, id, json_path, svg_path, db_path, gpus, trial_binary;
  std::string templates, work_dir, log_level = "warn";
  std::string megatron_path, python = "python3";
  bool json = false, fields_json = false;
  int limit = 100;
  ClientFlags client;
  std::vector<std::string> mlm_args, import_args, import_settings;
  std::string import_name = "megatron-lm";
  CLI::App *plan, *validate, *fields, *search, *import_bridge, *import_mlm;
  CLI::App *submit, *get, *watch, *cancel, *list;
};

// The commands that need no coordinator: plan, validate, fields and the local search.
void AddLocalCommands(CLI::App& app, CliArgs& a) {
  a.plan = app.add_subcommand("plan", "what the guided search will try, and why");
  a.plan->add_option("SPEC", a.spec_path, "search spec (YAML)")->required();
  a.plan->add_flag("--json", a.json, "the plan as JSON");

  a.validate = app.add_subcommand("validate", "is a policy valid for this model?");
  a.validate->add_option("SPEC", a.spec_path, "search spec (YAML)")->required();
  a.validate->add_option("--policy", a.policy, "e.g. selective:[core_attn] or full:uniform:1")
      ->required();
  a.validate->add_flag("--json", a.json,
                       "the policy's predicted memory per stage and whether it fits, as JSON");

  a.fields = app.add_subcommand(
      "fields", "every spec field: default, values, Megatron's name for it (a Markdown table)");
  a.fields->add_flag("--json", a.fields_json,
                     "each field's Megatron home and default as JSON (what the megatron driver reads)");

  CLI::App* search = a.search = app.add_subcommand(
      "search", "run a whole search on this machine (embedded coordinator and worker)");
  search->add_option("SPEC", a.spec_path, "search spec (YAML)")->required();
  search->add_option("--json", a.json_path, "write the result JSON here");
  search->add_option("--svg", a.svg_path, "write the memory/throughput plot here");
  search->add_option("--db", a.db_path, "keep the coordinator's SQLite database here");
  search->add_option("--gpus", a.gpus, "GPUs to use, e.g. 0,1 (default: all)");
  search->add_option("--trial-binary", a.trial_binary, "remat-trial (default: beside remat)");
  search->add_option("--command-templates", a.templates, "command templates (backend command)");
  search->add_option("--megatron-path", a.megatron_path,
                     "backend megatron: a Megatron-LM checkout (a folder holding megatron/core); "
                     "default: the installed megatron-core");
  search->add_option("--python", a.python,
                     "backend megatron: the Python with torch (default python3)");
  search->add_option("--work-dir", a.work_dir, "keep the worker's trial folders here");
  search->add_option("--log-level", a.log_level, "service logs: trace ... off (default warn)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
}

// `remat import bridge` and `remat import megatron-lm`.
void AddImportCommands(CLI::App& app, CliArgs& a) {
  CLI::App* import = app.add_subcommand(
      "import", "a Megatron Bridge config or Megatron-LM arguments as a remat spec (stdout)");
  import->require_subcommand(1);
  a.import_bridge = import->add_subcommand(
      "bridge", "a Megatron Bridge ConfigContainer YAML, plus Hydra-style KEY=VALUE overrides");
  a.import_bridge->add_option("FILE", a.spec_path, "the ConfigContainer YAML")->required();
  a.import_bridge->add_option("OVERRIDES", a.import_args,
                              "KEY=VALUE (e.g. model.tensor_model_parallel_size=4, "
                              "parallel.data_parallel_size=8, search.memory_budget_gib=70)");
  a.import_mlm = import->add_subcommand(
      "megatron-lm", "Megatron-LM arguments, after --: remat import megatron-lm -- --num-layers 32 ...");
  a.import_mlm->add_option("ARGS", a.import_args, "Megatron-LM's arguments, after --");
  a.import_mlm->add_option(
      "--set", a.import_settings,
      "a remat spec setting SECTION.KEY=VALUE, e.g. parallel.data_parallel_size=8");
  a.import_mlm->add_option("--name", a.import_name, "the spec's name (default megatron-lm)");
}

// The commands that talk to a coordinator: submit, get, watch, cancel, list.
void AddClientCommands(CLI::App& app, CliArgs& a) {
  a.submit = app.add_subcommand("submit", "submit a search to a coordinator");
  a.submit->add_option("SPEC", a.spec_path, "search spec (YAML)")->required();
  a.client.AddTo(a.submit);

  a.get = app.add_subcommand("get", "show a search and its result");
  a.get->add_option("ID", a.id, "search id")->required();
  a.get->add_flag("--json", a.json, "the result JSON");
  a.get->add_option("--svg", a.svg_path, "write the memory/throughput plot here");
  a.client.AddTo(a.get);

  a.watch = app.add_subcommand("watch", "follow a search's progress live");
  a.watch->add_option("ID", a.id, "search id")->required();
  a.watch->add_option("--svg", a.svg_path, "when it ends, write the memory/throughput plot here");
  a.client.AddTo(a.watch);

  a.cancel = app.add_subcommand("cancel", "cancel a search");
  a.cancel->add_option("ID", a.id, "search id")->required();
  a.client.AddTo(a.cancel);

  a.list = app.add_subcommand("list", "list your searches (every user's with an admin token)");
  a.list->add_option("--limit", a.limit, "at most this many")->check(CLI::PositiveNumber);
  a.client.AddTo(a.list);
}

// Parses the command line; an exit code when that is all there is to do (help, version, a
// usage error), nullopt when a command is to run.
std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << "remat " << common::kVersion << std::endl;
    return 0;
  } catch (const CLI::ParseError& e) {
    // A subcommand's --help arrives here too.
    if (e.get_exit_code() == 0) {
      for (CLI::App* sub : app.get_subcommands()) std::cout << sub->help();
      if (app.get_subcommands().empty()) std::cout << app.help();
      return 0;
    }
    return Fail(2, e.what());
  }
  return std::nullopt;
}

// `remat search`: the embedded coordinator and worker, logging to stderr.
int RunLocal(const CliArgs& a, const LocalSearchRunner& local_search) {
  if (!local_search) return Fail(1, "search: this build of remat has no embedded search");
  // The embedded services log to stderr: stdout carries the progress and the result.
  spdlog::set_default_logger(spdlog::stderr_color_mt("remat"));
  spdlog::set_level(spdlog::level::from_str(a.log_level));
  LocalSearchOptions options;
  options.spec_path = a.spec_path;
  options.json_path = a.json_path;
  options.svg_path = a.svg_path;
  options.db_path = a.db_path;
  options.gpus = a.gpus;
  options.trial_binary = a.trial_binary;
  options.command_templates = a.templates;
  options.megatron_path = a.megatron_path;
  options.python = a.python;
  options.work_dir = a.work_dir;
  return RunSearchWithSignals(options, local_search);
}

// Runs the command that parsed.
int Dispatch(CliArgs& a, const LocalSearchRunner& local_search) {
  if (a.plan->parsed()) return RunPlan(a.spec_path, a.json, std::cout, std::cerr);
  if (a.fields->parsed()) {
    std::cout << (a.fields_json ? search::SpecFieldsJson() : search::SpecFieldsMarkdown());
    return 0;
  }
  if (a.validate->parsed()) {
    return RunValidate(a.spec_path, a.policy, a.json, std::cout, std::cerr);
  }
  if (a.import_bridge->parsed()) return RunImportBridge(a.spec_path, a.import_args);
  if (a.import_mlm->parsed()) {
    return PrintImport(ImportMegatronLm(a.mlm_args, a.import_settings, a.import_name));
  }
  if (a.search->parsed()) return RunLocal(a, local_search);
  ClientOptions options;
  if (int code = a.client.Resolve(&options); code != 0) return code;
  if (a.submit->parsed()) return RunSubmit(a.spec_path, options);
  if (a.get->parsed()) return RunGet(a.id, a.json, a.svg_path, options);
  if (a.watch->parsed()) return RunWatch(a.id, a.svg_path, options);
  if (a.cancel->parsed()) return RunCancel(a.id, options);
  if (a.list->parsed()) return RunList(a.limit, options);
  return Fail(2, "no command given (remat --help lists them)");
}

}  // namespace

int RunCli(int argc, char** argv, const LocalSearchRunner& local_search) {
  CLI::App app{
      "remat: finds the best activation-recompute policy for a Megatron job by "
      "measuring it"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("remat ") + common::kVersion);
  CliArgs args;
  args.mlm_args = TakeMegatronLmArgs(argc, argv);
  AddLocalCommands(app, args);
  AddImportCommands(app, args);
  AddClientCommands(app, args);
  if (std::optional<int> code = Parse(app, argc, argv)) return *code;
  return Dispatch(args, local_search);
}

}  // namespace remat::cli
