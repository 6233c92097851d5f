// Hostile inputs, issue 14: trial 62's findings. The batch-split refusal offered a dp or a
// batch size where no dp or batch size could help (interleaved with a count not a multiple
// of pp: M1), and microbatch counts a schedule file refuses (M2); the vocabulary floor read
// as the number to use (M3); a checkpoint.dir holding another run named a resume that then
// needed its checkpoint.dir too (M4); "--prompt=" took the next argument as its value (M5);
// simulate --trace replaced a run's measured trace.json (M6); and lows: a hexadecimal
// number's example, simulate's counts named by flags not given, an empty --cost item, a
// loss that is a string, plurals, two names for one signal.
#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <string>

#include "cli_helpers.h"
#include "core/interrupt.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial62";
}  // namespace

TEST_CASE("a batch that does not split offers only fixes that work", "[cli][hostile][config]") {
  Scratch s(kGroup, "split");
  const std::string run = " --run-dir '" + s.path("r") + "'";
  const std::string train = "train --config configs/tiny.toml ";
  // M1: interleaved with 3 microbatches and pp = 2: no dp or batch size mends the count
  const Run inter = run_troupe(train + "--set parallel.schedule=interleaved --set parallel.chunks=2 "
                                       "--set parallel.microbatches=3" + run, s);
  expect_user_error(inter, {"use parallel.microbatches in {2, 4, 8, 16}"});
  CHECK(inter.err.find("parallel.dp") == inter.err.find("parallel.dp = 1 replicas"));  // no dp offered
  CHECK(inter.err.find("or train.batch_size") == std::string::npos);
  // M2: a schedule file fixes the count: the batch size is the fix, no microbatch list
  const std::string three = s.write("three.csv", "F0,F1,F2,B0,B1,B2\nF0,B0,F1,B1,F2,B2\n");
  const Run file = run_troupe(train + "--set parallel.schedule='" + three + "' --set parallel.microbatches=3" + run, s);
  expect_user_error(file, {"use train.batch_size = 18 (a multiple of parallel.dp x parallel.microbatches = 3), or a "
                           "schedule file written for another microbatch count"});
  CHECK(file.err.find("microbatches in {") == std::string::npos);
  // 1f1b: every fix named, each one that works (dp: a divisor of batch / microbatches)
  expect_user_error(run_troupe(train + "--set parallel.dp=3" + run, s),
                    {"use parallel.dp in {1, 2, 4}, or train.batch_size = 24 (a multiple of parallel.dp x "
                     "parallel.microbatches = 12)"});
  expect_user_error(run_troupe(train + "--set parallel.microbatches=3" + run, s),
                    {"use parallel.microbatches in {1, 2, 4, 8, 16}, or train.batch_size = 18"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a checkpoint.dir that is another run's folder names the whole resume, which works",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "ckdir");
  const std::string k = s.path("k"), cache = " --set data.cache_dir='" + s.path("cache") + "'";
  const std::string train = "train --config configs/tiny.toml --set train.sample_tokens=0 --set checkpoint.interval=1" + cache;
  const Run first = run_troupe(train + " --set train.steps=1 --set checkpoint.dir='" + k + "' --run-dir '" + k + "'", s);
  INFO(first.err);
  REQUIRE(first.rc == 0);
  const std::string fix = "--run-dir " + k + " --set checkpoint.dir=" + k + " --resume latest";
  expect_user_error(run_troupe(train + " --set train.steps=2 --set checkpoint.dir='" + k + "' --run-dir '" +
                                   s.path("k2") + "' --resume latest", s),
                    {"is the run directory of another troupe run", fix.c_str()});
  CHECK_FALSE(fs::exists(s.path("k2")));
  const Run resumed = run_troupe(train + " --set train.steps=2 " + fix, s);
  INFO(resumed.err);
  CHECK(resumed.rc == 0);
  CHECK(resumed.err.find("resumed from") != std::string::npos);
  CHECK(resumed.err.find("done: 2 steps") != std::string::npos);
  CHECK(first.err.find("done: 1 step,") != std::string::npos);  // (one step, said so)
}

TEST_CASE("an option written --name= has an empty value, not the next argument", "[cli][hostile]") {
  Scratch s(kGroup, "eq");
  // M5: the snapshot is named missing: "--tokens" was not taken as the prompt, nor 3 left over
  expect_user_error(run_troupe("generate '" + s.path("none") + "' --prompt= --tokens 3", s), {"does not exist"});
  expect_user_error(run_troupe("simulate --quiet --trace= --stages 2", s), {"--trace of troupe simulate is empty"});
  CHECK_FALSE(fs::exists(s.path("--stages")));
  // L7: a hexadecimal number is given back in decimal, which the option then takes
  const std::string plan = "plan --config configs/tiny.toml --set cluster.gpu=a100-80g --set cluster.gpus_per_node=2 ";
  expect_user_error(run_troupe(plan + "--tokens 0x10", s), {"write it in decimal: 16"});
  CHECK(run_troupe(plan + "--tokens 16", s).rc == 0);
  // L8: --tokens 0 asks for nothing, said; the days are printed for the tokens as typed
  expect_user_error(run_troupe(plan + "--tokens 0", s), {"--tokens 0 asks for the days to train no tokens"});
  CHECK(run_troupe(plan + "--tokens 1e18", s).rc == 0);
  CHECK(slurp(s.path("stdout.txt")).find("days for 1e18 tokens") != std::string::npos);
}

TEST_CASE("a run's measured trace.json is no output for another command, but a resumed run traces itself",
          "[cli][hostile][trace]") {
  Scratch s(kGroup, "trace");
  const std::string trace = s.path("r/trace.json");
  // the run itself, resumed, may trace into its own folder (its metrics.jsonl is there by then)
  REQUIRE(run_troupe(tiny_train(s, "r", 1), s).rc == 0);
  const Run a = run_troupe(tiny_train(s, "r", 2, " --resume latest --trace '" + trace + "'"), s);
  INFO(a.err);
  REQUIRE(a.rc == 0);
  const std::string measured = slurp(trace);
  REQUIRE_FALSE(measured.empty());
  // M6: simulate would replace what plan --calibrate reads
  expect_user_error(run_troupe("simulate --quiet --trace '" + trace + "'", s),
                    {"is the trace.json of the troupe run", "pass another path"});
  CHECK(slurp(trace) == measured);
  // and again
  const Run b = run_troupe(tiny_train(s, "r", 3, " --resume latest --trace '" + trace + "'"), s);
  INFO(b.err);
  CHECK(b.rc == 0);
  CHECK(slurp(trace) != measured);
}

TEST_CASE("simulate names where its counts came from and takes no empty --cost item, plot skips a string loss, "
          "a signal has one name",
          "[cli][hostile][simulate]") {
  Scratch s(kGroup, "sim");
  // L10: the 2 stages came from the config, not from --stages
  expect_user_error(run_troupe("simulate --quiet --config configs/tiny.toml --schedule interleaved --chunks 3", s),
                    {"2 stages (parallel.pp) x 3 chunk(s) (--chunks) = 6 model chunks"});
  // L11: an empty item between commas
  expect_user_error(run_troupe("simulate --quiet --cost f=1,,b=2", s), {"has an empty item between its commas"});
  // L9: costs as typed, -0 as 0
  const Run r = run_troupe("simulate --quiet --cost f=1e12,b=-0", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(slurp(s.path("stdout.txt")).find("costs f=1e12 b=0 w=0 p2p=0") != std::string::npos);
  // L12: a loss that is a string is an unreadable line, not a step
  fs::create_directories(s.path("p"));
  s.write("p/metrics.jsonl", "{\"step\":1,\"loss\":\"x\"}\n");
  expect_user_error(run_troupe("plot '" + s.path("p") + "' --out '" + s.path("p.png") + "'", s),
                    {"has a \"loss\" that is neither a number nor null"});
  CHECK_FALSE(fs::exists(s.path("p.png")));
  // L13: one name for a signal on every line
  CHECK(troupe::signal_name(SIGTERM) == "SIGTERM");
  CHECK(troupe::signal_name(SIGINT) == "SIGINT");
  CHECK(troupe::signal_name(200) == "signal 200");
}
