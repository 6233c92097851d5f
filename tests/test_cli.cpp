// The `troupe` command as a user meets it: bad input gets one error line naming the
// problem and the fix, exit code 2, no hang (every run under `timeout`), and nothing
// already in the run directory is lost; the tiny job learns (validation loss > 1 nat
// below the unigram entropy).
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
const std::string kSrc = TROUPE_SOURCE_DIR;

using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("cli", name) {}
};

using troupe::test::expect_user_error;
using troupe::test::Run;
using troupe::test::run_troupe;

// The tiny config with the data cache inside the scratch folder.
std::string tiny_config(const Scratch& s, const std::string& extra = "") {
  std::string text = slurp(kSrc + "/configs/tiny.toml");
  text += "\n";
  return s.write("tiny.toml", text);
}

std::string sets(const Scratch& s) {
  return " --set data.cache_dir='" + s.path("cache") + "' --set train.steps=2 --set train.sample_tokens=0";
}

}  // namespace

TEST_CASE("bad config input exits 2 with one line naming the problem", "[cli]") {
  Scratch s("config");
  std::string cfg = tiny_config(s);
  std::string base = "train --config '" + cfg + "' --run-dir '" + s.path("run") + "'" + sets(s);
  expect_user_error(run_troupe(base + " --set train.stepz=3", s), {"train.stepz", "train.steps"});
  s.write("bad.toml", "[train]\nstepz = 3\n");
  expect_user_error(run_troupe("train --config '" + s.path("bad.toml") + "'", s), {"train.stepz"});
  expect_user_error(run_troupe(base + " --set model.n_embd=130", s), {"n_embd", "n_head"});
  expect_user_error(run_troupe(base + " --set parallel.pp=5", s), {"parallel.pp", "n_layer"});
  expect_user_error(run_troupe(base + " --set parallel.microbatches=3", s), {"microbatches", "batch_size"});
  expect_user_error(run_troupe(base + " --set train.seq_len=65", s), {"seq_len", "block_size"});
  expect_user_error(run_troupe("train --config '" + s.path("missing.toml") + "'", s), {"missing.toml"});
  s.write("syntax.toml", "[train\nsteps = 3\n");
  expect_user_error(run_troupe("train --config '" + s.path("syntax.toml") + "'", s), {"line 1"});
  expect_user_error(run_troupe(base + " --set train.steps=abc", s), {"train.steps", "integer"});
  expect_user_error(run_troupe("train --config '" + s.dir.string() + "'", s), {"not a regular file"});
  expect_user_error(run_troupe(base + " --set parallel.schedule=interleaved --set parallel.chunks=2 --set parallel.microbatches=3"
                                  " --set parallel.pp=2 --set train.batch_size=12",
                           s),
                    {"multiple of 2"});
  expect_user_error(run_troupe(base + " --set model.block_size=8192 --set train.seq_len=8192 --set model.n_embd=1024", s),
                    {"GiB", "available"});
  expect_user_error(run_troupe("frobnicate", s), {"unknown command 'frobnicate'"});
  expect_user_error(run_troupe(base + " --set train.precision=fp8", s), {"train.precision", "bf16"});
  expect_user_error(run_troupe(base + " --set train.min_loss_scale=0", s), {"min_loss_scale"});
  expect_user_error(run_troupe(base + " --set train.hysteresis=0", s), {"train.hysteresis"});
  expect_user_error(run_troupe(base + " --set train.initial_loss_scale=1000", s), {"power of two", "1024"});
  s.write("afile", "x");
  expect_user_error(run_troupe(base + " --set checkpoint.dir='" + s.path("afile/ck") + "'", s), {"checkpoint.dir", "afile"});
  expect_user_error(run_troupe(base + " --set checkpoint.dir=/proc/troupe-nope", s), {"checkpoint.dir", "/proc/troupe-nope"});
  // nothing was created by any of the refused runs
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("bad corpus input exits 2 and names the file", "[cli][datasets]") {
  Scratch s("corpus");
  std::string base = "train --config '" + tiny_config(s) + "' --run-dir '" + s.path("run") + "'" + sets(s);
  expect_user_error(run_troupe(base + " --set data.corpus='" + s.path("nope.txt") + "'", s), {"nope.txt"});
  s.write("short.txt", "one short document\n\nanother short document\n");
  expect_user_error(run_troupe(base + " --set data.corpus='" + s.path("short.txt") + "' --set model.vocab_size=300", s),
                    {"split has", "train.seq_len"});
  s.write("empty.txt", "");
  expect_user_error(run_troupe(base + " --set data.corpus='" + s.path("empty.txt") + "'", s), {"empty.txt"});
  s.write("latin1.txt", "caf\xe9 au lait\n\nsecond document\n");
  expect_user_error(run_troupe(base + " --set data.corpus='" + s.path("latin1.txt") + "'", s), {"latin1.txt", "UTF-8"});
}

TEST_CASE("tokenizer/model vocabulary mismatch and bad token files exit 2", "[cli][datasets]") {
  Scratch s("vocab");
  std::string cfg = tiny_config(s);
  // Make the cache (tokenizer of 512 pieces + token files).
  Run ok = run_troupe("tokenize --config '" + cfg + "' --set data.cache_dir='" + s.path("cache") + "'", s);
  INFO(ok.err);
  REQUIRE(ok.rc == 0);
  std::string model, train_bin;
  for (auto& e : fs::recursive_directory_iterator(s.path("cache"))) {
    if (e.path().filename() == "tokenizer.model") model = e.path().string();
    if (e.path().filename() == "corpus.train.bin") train_bin = e.path().string();
  }
  REQUIRE(!model.empty());
  REQUIRE(!train_bin.empty());
  std::string base = "train --config '" + cfg + "' --run-dir '" + s.path("run") + "'" + sets(s);
  expect_user_error(run_troupe(base + " --set data.tokenizer='" + model + "' --set model.vocab_size=1024", s),
                    {"512", "1024"});
  // A token id past the vocabulary in a token file: refused, naming the file.
  {
    std::fstream f(train_bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 2 * 10);  // header is 64 bytes; u16 ids
    uint16_t bad = 60000;
    f.write(reinterpret_cast<const char*>(&bad), 2);
  }
  expect_user_error(run_troupe(base, s), {"train.bin"});
}

TEST_CASE("an unwritable run directory exits 2 and nothing written is lost", "[cli]") {
  Scratch s("rundir");
  std::string cfg = tiny_config(s);
  s.write("a_file", "x");
  expect_user_error(run_troupe("train --config '" + cfg + "' --run-dir '" + s.path("a_file") + "/run'" + sets(s), s),
                    {"a_file", "--run-dir"});
  // A run directory with earlier results: a failing run and a successful run keep them.
  fs::create_directories(s.path("run"));
  s.write("run/config.toml", "# an earlier run\n");
  s.write("run/metrics.jsonl", "{\"step\": 1, \"loss\": 9.0}\n");
  std::string base = "train --config '" + cfg + "' --run-dir '" + s.path("run") + "'" + sets(s);
  expect_user_error(run_troupe(base + " --set data.corpus='" + s.path("nope.txt") + "'", s), {"nope.txt"});
  Run r = run_troupe(base, s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(slurp(s.path("run/config.toml")) == "# an earlier run\n");
  std::string metrics = slurp(s.path("run/metrics.jsonl"));
  CHECK(metrics.rfind("{\"step\": 1, \"loss\": 9.0}\n", 0) == 0);
  CHECK(metrics.find("\"summary\":true") != std::string::npos);
  // a second different config goes beside the first, never over it
  Run r2 = run_troupe(base + " --set train.seed=7", s);
  REQUIRE(r2.rc == 0);
  Run r3 = run_troupe(base + " --set train.seed=8", s);
  REQUIRE(r3.rc == 0);
  int configs = 0;
  for (auto& e : fs::directory_iterator(s.path("run")))
    if (e.path().filename().string().rfind("config-", 0) == 0) ++configs;
  CHECK(configs == 3);  // seeds 0 (the tiny default), 7 and 8
  CHECK(slurp(s.path("run/config.toml")) == "# an earlier run\n");
}

TEST_CASE("the tiny job ends more than 1 nat below the unigram entropy", "[cli][train]") {
  Scratch s("learn");
  std::string cfg = tiny_config(s);
  Run r = run_troupe("train --config '" + cfg + "' --run-dir '" + s.path("run") + "' --set data.cache_dir='" +
                     s.path("cache") + "'",
                 s, 600);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::ifstream in(s.path("run/metrics.jsonl"));
  nlohmann::json summary;
  int steps = 0, evals = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("summary")) summary = j;
    else if (j.contains("val_loss")) ++evals;
    else {
      ++steps;
      CHECK(j["step"].get<int>() == steps);
    }
  }
  REQUIRE(summary.is_object());
  CHECK(steps == 500);
  CHECK(evals == 5);
  double val = summary["val_loss"], uni = summary["unigram_entropy"];
  INFO("val loss " << val << ", unigram entropy " << uni);
  CHECK(val < uni - 1.0);
  CHECK(fs::exists(s.path("run/config.toml")));
}

TEST_CASE("fp16 step records carry skipped and loss_scale, bf16 runs from the command line", "[cli][precision]") {
  Scratch s("fp16");
  std::string cfg = tiny_config(s);
  // Megatron's initial scale 2^32 overflows fp16 on the first steps: skipped, then backed
  // off (hysteresis 2: every second overflow halves the scale)
  Run r = run_troupe("train --config '" + cfg + "' --run-dir '" + s.path("run") + "'" + sets(s) +
                     " --set train.steps=4 --set train.eval_batches=1 --set train.precision=fp16",
                 s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::ifstream in(s.path("run/metrics.jsonl"));
  std::vector<nlohmann::json> steps;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss_scale")) steps.push_back(j);
  }
  REQUIRE(steps.size() == 4);
  CHECK(steps[0]["skipped"] == true);
  CHECK(steps[0]["loss_scale"] == 4294967296.0);
  CHECK(steps[0]["grad_norm"].is_null());
  CHECK(steps[1]["loss_scale"] == 4294967296.0);
  CHECK(steps[2]["loss_scale"] == 2147483648.0);
  Run b = run_troupe("train --config '" + cfg + "' --run-dir '" + s.path("run16") + "'" + sets(s) +
                     " --set train.eval_batches=1 --set train.precision=bf16",
                 s);
  INFO(b.err);
  CHECK(b.rc == 0);
}

TEST_CASE("snapshots from the command line: a writer killed mid-save, resume latest, signals, refusals",
          "[cli][checkpoint]") {
  Scratch s("ckpt");
  std::string cfg = tiny_config(s);
  const std::string common = "train --config '" + cfg + "' --set data.cache_dir='" + s.path("cache") +
                             "' --set train.sample_tokens=0 --set train.eval_interval=0 --set train.eval_batches=1";
  auto losses = [&](const std::string& run) {
    std::map<int, double> m;
    std::ifstream in(s.path(run + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && j.contains("step")) m[j["step"].get<int>()] = j["loss"].get<double>();
    }
    return m;
  };
  // the run that never stops
  Run a = run_troupe(common + " --run-dir '" + s.path("straight") + "' --set train.steps=6", s);
  REQUIRE(a.rc == 0);
  // the writer is killed (SIGKILL, the whole process) while saving step 4: step 2 stays usable
  const std::string kill_cmd = "cd '" + kSrc + "' && TROUPE_FAULT_KILL_IN_SNAPSHOT=4 timeout 120 '" + troupe_bin() +
                               "' " + common + " --run-dir '" + s.path("k2") +
                               "' --set train.steps=6 --set checkpoint.interval=2 > /dev/null 2>&1";
  int st = std::system(kill_cmd.c_str());
  CHECK(WEXITSTATUS(st) != 0);
  CHECK(fs::exists(s.path("k2/checkpoints/step-00000002/manifest.capnp")));
  CHECK_FALSE(fs::exists(s.path("k2/checkpoints/step-00000004")));
  Run r = run_troupe(common + " --run-dir '" + s.path("k2") + "' --set train.steps=6 --set checkpoint.interval=2 --resume latest", s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("resumed from") != std::string::npos);
  CHECK(r.err.find("step-00000002") != std::string::npos);
  auto straight = losses("straight"), resumed = losses("k2");
  for (int step = 3; step <= 6; ++step) {
    INFO("step " << step);
    CHECK(resumed[step] == straight[step]);  // the same bits, via metrics.jsonl's round-trip floats
  }
  // resuming with a different model or optimizer key is refused, naming it; nothing written
  expect_user_error(run_troupe(common + " --run-dir '" + s.path("k2") + "' --set train.steps=8 --set optim.lr=0.01 --resume latest", s),
                    {"optim.lr", "step-00000006"});
  expect_user_error(run_troupe(common + " --run-dir '" + s.path("k2") + "' --set train.steps=6 --resume latest", s),
                    {"train.steps", "nothing left"});
  expect_user_error(run_troupe(common + " --run-dir '" + s.path("k2") + "' --set train.steps=8", s), {"--resume latest"});
  expect_user_error(run_troupe(common + " --run-dir '" + s.path("fresh") + "' --set train.steps=8 --resume latest", s),
                    {"no usable snapshot"});
  CHECK_FALSE(fs::exists(s.path("fresh")));
  expect_user_error(run_troupe(common + " --run-dir '" + s.path("x") + "' --resume '" + s.path("nope") + "'", s),
                    {"nope", "does not exist"});
  // SIGUSR1 (and SIGTERM) mid-run: snapshot the current step, exit 0; the run continues from it
  // (troupe is the direct child of the shell that signals it; timeout guards the whole)
  for (std::string sig : {"USR1", "TERM"}) {
    INFO("SIG" << sig);
    const std::string dir = s.path("sig-" + sig), err = s.path("sig-" + sig + ".err"), rc = s.path("sig-" + sig + ".rc");
    const std::string script = s.write(
        "sig.sh", "'" + troupe_bin() + "' " + common + " --run-dir '" + dir + "' --set train.steps=3000 > /dev/null 2> '" +
                      err + "' &\n" + "pid=$!\ntrap 'kill -9 $pid 2>/dev/null' EXIT\n"
                      "for i in $(seq 1 600); do n=$(grep -c '\"loss\"' '" + dir +
                      "/metrics.jsonl' 2>/dev/null); [ \"${n:-0}\" -ge 3 ] && break; sleep 0.1; done\n"
                      "kill -" + sig + " $pid\nwait $pid\necho $? > '" + rc + "'\n");
    const std::string sig_cmd = "cd '" + kSrc + "' && timeout -s KILL 120 bash '" + script + "'";
    std::system(sig_cmd.c_str());
    INFO(slurp(err));
    CHECK(slurp(rc) == "0\n");
    CHECK(slurp(err).find("stopped by a signal") != std::string::npos);
    Run c = run_troupe(common + " --run-dir '" + dir + "' --set train.steps=" +
                       std::to_string(losses("sig-" + sig).rbegin()->first + 2) + " --resume latest",
                   s);
    INFO(c.err);
    CHECK(c.rc == 0);
  }
}

TEST_CASE("export writes GPT-2's safetensors layout, generate samples from a snapshot", "[cli][checkpoint][export]") {
  Scratch s("export");
  std::string cfg = tiny_config(s);
  Run t = run_troupe("train --config '" + cfg + "' --run-dir '" + s.path("run") + "' --set data.cache_dir='" +
                     s.path("cache") + "' --set train.steps=4 --set checkpoint.interval=4 --set train.sample_tokens=0",
                 s);
  REQUIRE(t.rc == 0);
  const std::string snap = s.path("run/checkpoints/step-00000004");
  Run e = run_troupe("export '" + snap + "' --format safetensors '" + s.path("m.safetensors") + "'", s);
  INFO(e.err);
  REQUIRE(e.rc == 0);
  std::ifstream f(s.path("m.safetensors"), std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  REQUIRE(n < 1000000);
  std::string header(n, ' ');
  f.read(header.data(), (std::streamsize)n);
  auto h = nlohmann::json::parse(header);
  CHECK(h.size() == 2 + 12 * 4 + 2 + 1);  // tensors + __metadata__
  CHECK(h["wte.weight"]["shape"] == nlohmann::json::array({512, 128}));
  CHECK(h["h.0.attn.c_attn.weight"]["shape"] == nlohmann::json::array({128, 384}));  // Conv1D: (in, out)
  CHECK(h["h.3.mlp.c_proj.weight"]["shape"] == nlohmann::json::array({512, 128}));
  CHECK(h["__metadata__"]["n_layer"] == "4");
  uint64_t end = 0;
  for (auto& [k, v] : h.items())
    if (k != "__metadata__") end = std::max<uint64_t>(end, v["data_offsets"][1].get<uint64_t>());
  CHECK(fs::file_size(s.path("m.safetensors")) == 8 + n + end);
  // greedy generation is deterministic; sampling follows the seed
  const std::string gen = "generate '" + snap + "' --prompt 'The Congress' --tokens 8 --temperature 0";
  Run g1 = run_troupe(gen, s);
  std::string out1 = slurp(s.path("stdout.txt"));
  Run g2 = run_troupe(gen, s);
  INFO(g1.err);
  CHECK(g1.rc == 0);
  CHECK(g2.rc == 0);
  CHECK(out1.rfind("The Congress", 0) == 0);
  CHECK(slurp(s.path("stdout.txt")) == out1);
  // bad input
  expect_user_error(run_troupe("export '" + snap + "' --format onnx '" + s.path("x.onnx") + "'", s), {"--format", "safetensors"});
  expect_user_error(run_troupe("export '" + s.path("nope") + "' '" + s.path("x.st") + "'", s), {"nope"});
  expect_user_error(run_troupe("export '" + snap + "' '" + s.path("no/such/dir/x.st") + "'", s), {"no/such/dir does not exist", "create that folder"});
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 0", s), {"--tokens"});
}
