// Hostile inputs, issue 14: trial 58's findings. Resume refused a changed data.lock_timeout_s
// (a wait's deadline) and cluster.* (troupe plan's only) (F1); the tokenizer refusal showed
// hashes in decimal, the log in hex (F2); a run directory holding two caches named one at a
// time (F3); a dangling output link whose folder is missing was told to pass its target (F5);
// plot drew a negative step (F6). F4 (the log's stop line names the signal) is checked in
// test_hostile_signals.cpp.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "checkpoint/snapshot.h"
#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial58";
}  // namespace

TEST_CASE("run options and cluster keys may differ on resume, a changed tokenizer is named in hex", "[cli][hostile]") {
  using troupe::resume_may_differ;
  for (const char* k : {"data.lock_timeout_s", "data.threads", "cluster.gpu", "cluster.nodes", "fault.timeout_s",
                        "train.tensorboard_dir"})
    CHECK(resume_may_differ(k));
  for (const char* k : {"data.corpus", "model.n_layer", "optim.lr", "train.seed", "data.tokenizer_sample_mb"})
    CHECK_FALSE(resume_may_differ(k));
  Scratch s(kGroup, "resume");
  const std::string corpus = s.write("c.txt", slurp(std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt"));
  const std::string data = " --set data.corpus='" + corpus + "'";
  REQUIRE(run_troupe(tiny_train(s, "run", 2, data), s, 180).rc == 0);
  const Run r = run_troupe(
      tiny_train(s, "run", 3, data + " --resume latest --set data.lock_timeout_s=10 --set cluster.nodes=2"), s, 180);
  INFO(r.err);
  CHECK(r.rc == 0);
  // the corpus changes: the tokenizer's hash, in hex as the log's "data ready" line shows it
  s.write("c.txt", "Zebras quantum widgets. " + slurp(corpus));
  const Run t = run_troupe(tiny_train(s, "run", 5, data + " --resume latest"), s, 180);
  expect_user_error(t, {"was trained with another tokenizer"});
  CHECK(std::regex_search(t.err, std::regex("hash [0-9a-f]{16}, the data now gives [0-9a-f]{16}\\)")));
}

TEST_CASE("a run directory holding two caches names both in one move, and a link's missing folder is named",
          "[cli][hostile]") {
  Scratch s(kGroup, "caches");
  fake_cache(s.path("data/cache/aaa-v512"));
  fake_cache(s.path("data/cache/bbb-v8192"));
  const std::string dest = s.path("data-caches");
  const std::string mv = "mkdir -p " + dest + " && mv " + s.path("data/cache/aaa-v512") + " " +
                         s.path("data/cache/bbb-v8192") + " " + dest + "/";
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir '" + s.path("data") + "'", s),
                    {"holds the prepared data caches", "move the caches out of it", mv.c_str()});
  CHECK_FALSE(fs::exists(s.path("data/config.toml")));
  // the advice works: after it, the run directory holds no cache
  REQUIRE(shell_status(mv) == 0);
  CHECK(fs::exists(dest + "/aaa-v512/meta.json"));
  CHECK(fs::exists(dest + "/bbb-v8192/meta.json"));
  // F5: a dangling link into a missing folder
  fs::create_symlink(s.path("gone/zz.json"), s.path("d.json"));
  const std::string mk = "mkdir -p " + s.path("gone");
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir '" + s.path("r") + "' --trace '" +
                                   s.path("d.json") + "'", s),
                    {"once its folder exists", mk.c_str()});
  CHECK_FALSE(fs::exists(s.path("gone")));
}

TEST_CASE("plot skips a negative step, naming the line", "[cli][hostile]") {
  Scratch s(kGroup, "plot");
  fs::create_directories(s.path("run"));
  fs::create_directories(s.path("neg"));
  s.write("run/metrics.jsonl", "{\"step\":-5,\"loss\":3}\n{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.5}\n");
  const Run r = run_troupe("plot '" + s.path("run") + "' --out '" + s.path("o.png") + "'", s, 60);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("line 1 has a \"step\" that is not a whole number of 0 or more; skipped") != std::string::npos);
  CHECK(slurp(s.path("stdout.txt")).find("(2 step records") != std::string::npos);
  // a file of nothing else is refused
  s.write("neg/metrics.jsonl", "{\"step\":-5,\"loss\":3}\n");
  expect_user_error(run_troupe("plot '" + s.path("neg") + "' --out '" + s.path("n.png") + "'", s, 60),
                    {"line 1 has a \"step\" that is not a whole number of 0 or more"});
  CHECK_FALSE(fs::exists(s.path("n.png")));
}
