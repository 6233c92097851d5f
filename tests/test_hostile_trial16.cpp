// Hostile inputs, issue 14's sixteenth trial (a fresh reviewer's 98 cases): the ten lows it
// left, each now one sentence naming the fix. [[model]] or model = 5 where [model] belongs
// (L1), a symbolic-link loop or a dangling link given as a path (L2), schedule-file errors
// without a fix (L3), plot's reasons for a skipped metrics line (L4), --calibrate given a file
// that is no trace (L5), an empty command after launch's '--' (L6); and the trial's other
// notes: a hex float through --set, an option swallowed as the value of the one before it,
// an output in a folder that takes no new files (/proc), optim.beta1 = 1 quoted.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial16";
}  // namespace

TEST_CASE("a section written as an array of tables or a single value is named as such, with the [section] form",
          "[cli][hostile]") {
  Scratch s(kGroup, "aot");
  const std::string aot = s.write("aot.toml", "[[model]]\nn_layer = 4\n[[model]]\nn_layer = 2\n");
  expect_user_error(run_troupe("train --config '" + aot + "'", s), {"array of tables ([[model]])", "write one [model]"});
  expect_user_error(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet --config '" + aot + "'", s),
                    {"array of tables ([[model]])"});
  const std::string scalar = s.write("scalar.toml", "optim = 5\n");
  expect_user_error(run_troupe("train --config '" + scalar + "'", s), {"'optim'", "a single value", "write one [optim]"});
  const std::string data = s.write("data.toml", "[[data]]\ncorpus = \"x\"\n");
  expect_user_error(run_troupe("train --config '" + data + "'", s), {"[[data]]", "[[data.sources]]"});
  // a section troupe does not have stays an unknown key
  const std::string other = s.write("other.toml", "[[bogus]]\nx = 1\n");
  expect_user_error(run_troupe("train --config '" + other + "'", s), {"unknown config key 'bogus'"});
}

TEST_CASE("a path that is a loop of symbolic links or a link to nothing is called that, not missing", "[cli][hostile]") {
  Scratch s(kGroup, "loop");
  fs::create_symlink(s.path("loop2.toml"), s.path("loop1.toml"));
  fs::create_symlink(s.path("loop1.toml"), s.path("loop2.toml"));
  fs::create_symlink(s.path("nowhere.toml"), s.path("dangling.toml"));
  expect_user_error(run_troupe("train --config '" + s.path("loop1.toml") + "'", s),
                    {"is a loop of symbolic links", "fix or remove the link", "--config"});
  expect_user_error(run_troupe("train --config '" + s.path("dangling.toml") + "'", s),
                    {"is a symbolic link to nothing", "nowhere.toml", "--config"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set data.corpus='" + s.path("loop1.toml") + "'", s),
                    {"source 'corpus'", "is a loop of symbolic links"});
  expect_user_error(run_troupe("export '" + s.path("loop1.toml") + "' '" + s.path("o.safetensors") + "'", s),
                    {"is a loop of symbolic links"});
  // a path that is simply missing still says so
  expect_user_error(run_troupe("train --config '" + s.path("none.toml") + "'", s), {"does not exist", "--config"});
}

TEST_CASE("a schedule file's errors name the fix", "[cli][hostile][schedule]") {
  Scratch s(kGroup, "sched");
  const std::string fix = "simulate --schedule 1f1b --stages P --microbatches M --dump FILE";
  expect_user_error(run_troupe("simulate --quiet --schedule '" + s.write("ragged.csv", "F0,F1,B0,B1\nF0,B0,F1\n") + "'", s),
                    {"stage 1 is missing B1", fix.c_str()});
  expect_user_error(run_troupe("simulate --quiet --schedule '" + s.write("dup.csv", "F0,F0,B0\nF0,B0\n") + "'", s),
                    {"stage 0 repeats F0", fix.c_str()});
  expect_user_error(run_troupe("simulate --quiet --schedule '" + s.write("order.csv", "F0,B0\nB0,F0\n") + "'", s),
                    {"runs B0 before its forward F0", fix.c_str()});
  const std::string three = s.write("three.csv", "F0,B0\nF0,B0\nF0,B0\n");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set parallel.pp=2 --set parallel.schedule='" + three + "'", s),
                    {"has 3 rows (stages) but parallel.pp = 2", "set parallel.pp = 3"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set parallel.pp=3 --set parallel.schedule='" + three + "'", s),
                    {"uses 1 microbatch but parallel.microbatches = 4", "set parallel.microbatches = 1"});
}

TEST_CASE("plot names why a metrics line is skipped: a number out of range, a step that is not a whole number",
          "[cli][hostile][plot]") {
  Scratch s(kGroup, "plot");
  fs::create_directories(s.path("a"));
  s.write("a/metrics.jsonl", "{\"step\":1,\"loss\":1e999}\n{\"step\":\"x\",\"loss\":2}\n{\"step\":2,\"loss\":3}\n"
                             "{\"step\":3,\"loss\":2.5}\n");
  const Run a = run_troupe("plot '" + s.path("a") + "' --out '" + s.path("a.png") + "'", s);
  INFO(a.err);
  CHECK(a.rc == 0);
  CHECK(a.err.find("line 1 holds a number out of range") != std::string::npos);
  CHECK(a.err.find("with 1 more unreadable line(s)") != std::string::npos);  // the "step":"x" line is counted, not silent
  CHECK(a.err.find("a write cut short") == std::string::npos);
  fs::create_directories(s.path("b"));
  s.write("b/metrics.jsonl", "{\"step\":\"x\",\"loss\":2}\n{\"step\":1,\"loss\":2}\n");
  const Run b = run_troupe("plot '" + s.path("b") + "' --out '" + s.path("b.png") + "'", s);
  CHECK(b.rc == 0);
  CHECK(b.err.find("line 1 has a \"step\" that is not a whole number of 0 or more; skipped") != std::string::npos);
  fs::create_directories(s.path("c"));
  s.write("c/metrics.jsonl", "{\"step\":1,\"loss\":1e999}\n{\"step\":2,\"lo");
  expect_user_error(run_troupe("plot '" + s.path("c") + "' --out '" + s.path("c.png") + "'", s),
                    {"line 1 holds a number out of range", "no line holds a step record"});
  CHECK_FALSE(fs::exists(s.path("c.png")));
}

TEST_CASE("plan --calibrate given a file that is no trace says so, launch's empty command is named empty",
          "[cli][hostile]") {
  Scratch s(kGroup, "calib");
  const std::string st = s.write("model.safetensors", std::string("\x10\0\0\0\0\0\0\0{\"a\":1}", 16));
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + st + "'", s),
                    {"is a file but not a Chrome trace", "pass the run directory"});
  expect_user_error(run_troupe("launch --nprocs 2 -- ''", s), {"the command after '--' is an empty string"});
}

TEST_CASE("an option given as the value of the option before it is named, not reported as a stray argument",
          "[cli][hostile]") {
  Scratch s(kGroup, "swallow");
  expect_user_error(run_troupe("train --config configs/tiny.toml --resume --set train.precision=fp32", s),
                    {"--resume of troupe train needs a value after it", "the option --set"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir --set train.steps=2", s),
                    {"--run-dir of troupe train needs a value", "the option --set"});
  CHECK_FALSE(fs::exists(fs::path(TROUPE_SOURCE_DIR) / "--set"));
  // a value that only looks like an option (not one of the command's) is still a value
  const Run r = run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet --trace '" + s.path("--x.json") + "'", s);
  CHECK(r.rc == 0);
}

TEST_CASE("a hex float through --set is refused as in a TOML file, and an output under /proc and beta1 = 1 are named",
          "[cli][hostile]") {
  Scratch s(kGroup, "misc");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.lr=0x1p-3", s),
                    {"'optim.lr'", "must be a number, got '0x1p-3'"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.beta1=1.0", s),
                    {"optim.beta1 = 1 must be in [0, 1)"});
  if (fs::is_directory("/proc/self"))
    expect_user_error(run_troupe("prepare --config configs/tiny.toml --report /proc/version", s),
                      {"cannot write /proc/version", "takes no new file", "--report"});
}
