// Every program, given bad input, exits 2 with one "error:" line naming the field, and
// never aborts, hangs or reads for ever (spec and table paths of /dev/zero, FIFOs, folders,
// YAML keys that are lists, duplicate keys, non-UTF-8 text, absurd sizes).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "tests/integration/harness.h"

namespace remat::integration {
namespace {

const std::string kModel =
    "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 128\n"
    "  vocab_size: 512\n";

class BadInputTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = cluster_.dir() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // Exit 2, one line on stderr that starts with `error: ` + `start`, short, and quickly.
  void ExpectRefused(const CommandResult& r, const std::string& start, const std::string& what) {
    EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.err.substr(0, 500);
    EXPECT_EQ(r.err.rfind("error: " + start, 0), 0u) << what << "\n" << r.err.substr(0, 500);
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << what << ": not one line\n"
                                                  << r.err.substr(0, 500);
    EXPECT_LT(r.err.size(), 400u) << what;
  }

  Cluster cluster_;
};

TEST_F(BadInputTest, RematPlanValidateAndSearchRefuseBadSpecs) {
  const std::string fifo = cluster_.dir() + "/fifo.yaml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string table = Write("t.json", "{\"trials\": {}}");
  struct Case {
    std::string path;
    std::string start;
  };
  const std::vector<Case> cases = {
      {Write("list-key.yaml", kModel + "{[a, b]: 1}: 2\n"), "spec: a key must be a plain string"},
      {Write("model-list-key.yaml", kModel + "  ? [a, b]\n  : 1\n"),
       "model: a key must be a plain string"},
      {Write("search-list-key.yaml", kModel + "search:\n  ? {a: 1}\n  : 1\n"),
       "search: a key must be a plain string"},
      {Write("dup.yaml", kModel + "model:\n  num_layers: 4\n"), "model: duplicate key"},
      {"/dev/zero", "spec \"/dev/zero\": is not a regular file"},
      {fifo, "spec \"" + fifo + "\": is not a regular file"},
      {cluster_.dir(), "spec \"" + cluster_.dir() + "\": is not a regular file"},
      {Write("big.yaml", kModel + "name: \"" + std::string(2 << 20, 'n') + "\"\n"),
       "spec \"" + cluster_.dir() + "/big.yaml\": is larger than 1048576 bytes"},
      {Write("utf8.yaml", "name: \"\xFF\xFE\"\n" + kModel), "spec: not valid UTF-8 at line 1"},
      {Write("newline.yaml", kModel + "  normalization: \"a\\nerror: b\"\n"),
       "model.normalization: must be one of LayerNorm, RMSNorm, got \"a\\nerror: b\""},
      {Write("layers.yaml", "model:\n  num_layers: 2147483647\n  hidden_size: 64\n"
                            "  num_attention_heads: 4\n  seq_length: 128\n  vocab_size: 512\n"),
       "model.num_layers: 2147483647 is above remat's limit"},
      {Write("dp.yaml", kModel + "parallel:\n  data_parallel_size: 100000000\n"),
       "parallel.data_parallel_size: 100000000 is above"},
      {Write("steps.yaml", kModel + "search:\n  measure_steps: 2147483647\n"),
       "search.measure_steps: 2147483647 is above"},
      {Write("dense-moe-freq.yaml", kModel + "  moe_layer_freq: [1, 2, 3]\n"),
       "model.moe_layer_freq: needs a mixture-of-experts model"},
  };
  for (const Case& c : cases) {
    ExpectRefused(cluster_.Remat({"plan", c.path, "--json"}, false), c.start, "plan " + c.path);
    ExpectRefused(cluster_.Remat({"validate", c.path, "--policy", "none"}, false), c.start,
                  "validate " + c.path);
    ExpectRefused(cluster_.Remat({"search", c.path}, false), c.start, "search " + c.path);
  }
  // A replay table that is not a regular file: only `search` and `submit` read it.
  const std::string zero_table =
      Write("zero-table.yaml", kModel + "search:\n  backend: replay\n  replay_table: /dev/zero\n");
  ExpectRefused(cluster_.Remat({"search", zero_table}, false),
                "search.replay_table: \"/dev/zero\" is not a regular file", "replay /dev/zero");
  ExpectRefused(cluster_.Remat({"validate", Write("p.yaml", kModel), "--policy",
                                "selective:[core_attn,]"},
                               false),
                "--policy: policy 'selective:[core_attn,]': a recompute module is missing",
                "policy");
  ExpectRefused(cluster_.Remat({"import", "bridge", Write("bridge.yaml", "{[a, b]: 1}: 2\n")},
                               false),
                "model: required", "import bridge");  // the list key is not a key it knows
  ExpectRefused(cluster_.Remat({"import", "bridge", "/dev/zero"}, false),
                "FILE: \"/dev/zero\" is not a regular file", "import zero");
}

#ifdef REMAT_TRIAL_BIN
TEST_F(BadInputTest, RematTrialRefusesBadSpecs) {
  ExpectRefused(cluster_.Run({REMAT_TRIAL_BIN, "--spec", "/dev/zero", "--policy", "none"}),
                "", "remat-trial /dev/zero");
  ExpectRefused(cluster_.Run({REMAT_TRIAL_BIN, "--spec",
                              Write("k.yaml", kModel + "{[a, b]: 1}: 2\n"), "--policy", "none"}),
                "", "remat-trial list key");
  ExpectRefused(cluster_.Run({REMAT_TRIAL_BIN, "--spec", Write("ok.yaml", kModel), "--policy",
                              "selective:[core_attn,]"}),
                "", "remat-trial policy");
}
#endif

TEST_F(BadInputTest, DaemonsRefuseBadFlags) {
  ExpectRefused(cluster_.Run({REMATD_BIN, "--listen", "127.0.0.1:0", "--db",
                              cluster_.dir() + "/x.db", "--lease-timeout", "soon"}),
                "", "rematd --lease-timeout");
  ExpectRefused(cluster_.Run({REMAT_WORKER_BIN, "--coordinator", cluster_.address(),
                              "--plain-slots", "many"}),
                "", "remat-worker --plain-slots");
}

}  // namespace
}  // namespace remat::integration
