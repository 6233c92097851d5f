// Hostile inputs, issue 14's twentieth trial (a fresh reviewer's 102 cases): a user's file in a
// killed writer's unfinished snapshot folder was deleted with it (F20); folders that belong
// to something else given as checkpoint.dir or --tensorboard (C02, C03, C04); simulate's
// flags named as flags (B11); a binary file as --config (G02); a 64-bit overflow in TOML
// (B05); a damaged cached tokenizer (F06); a link to a terminal as an output (F11).
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <utime.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial20";

std::string tiny_args(const Scratch& s, const std::string& run) {
  return "train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=2 --set train.sample_tokens=0 "
         "--set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path(run) + "'";
}
}  // namespace

TEST_CASE("a killed writer's unfinished snapshot folder loses only its snapshot files, not a user's file in it",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "unfinished");
  const std::string d = s.path("ck/step-00000002.tmp-999999999");
  fs::create_directories(d);
  s.write("ck/step-00000002.tmp-999999999/notes.txt", "mine\n");
  s.write("ck/step-00000002.tmp-999999999/shard-dp0-pp0-tp0.bin", "half");
  utimbuf old{std::time(nullptr) - 3600, std::time(nullptr) - 3600};
  REQUIRE(::utime(d.c_str(), &old) == 0);
  const Run r = run_troupe(tiny_args(s, "run") + " --set checkpoint.dir='" + s.path("ck") + "'", s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(slurp(d + "/notes.txt") == "mine\n");
  CHECK_FALSE(fs::exists(d + "/shard-dp0-pp0-tp0.bin"));
  const std::string log = slurp(s.path("run/train.log"));
  CHECK(log.find("kept the folder: it holds notes.txt") != std::string::npos);
}

TEST_CASE("checkpoint.dir and --tensorboard that belong to something else are refused", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "roles");
  REQUIRE(run_troupe(tiny_args(s, "r"), s).rc == 0);
  expect_user_error(run_troupe(tiny_args(s, "r2") + " --set checkpoint.dir='" + s.path("r") + "'", s),
                    {"is the run directory of another troupe run", "--resume latest"});
  CHECK_FALSE(fs::exists(s.path("r2")));
  expect_user_error(run_troupe(tiny_args(s, "r3") + " --tensorboard '" + s.path("r/checkpoints") + "'", s),
                    {"holds snapshots", "event files alone"});
  fs::create_directories(s.path("data"));
  fs::copy_file(fs::path(TROUPE_SOURCE_DIR) / "tests/data/tiny_corpus.txt", s.path("data/corpus.txt"));
  expect_user_error(run_troupe(tiny_args(s, "r4") + " --set data.corpus='" + s.path("data/corpus.txt") +
                                   "' --set checkpoint.dir='" + s.path("data") + "'", s),
                    {"holds this run's input", "a folder for snapshots alone"});
  CHECK_FALSE(fs::exists(s.path("data/.lock")));
  // the run's own run directory as checkpoint.dir stays valid, resumed too
  REQUIRE(run_troupe(tiny_args(s, "own") + " --set checkpoint.dir='" + s.path("own") + "'", s).rc == 0);
  const Run again = run_troupe("train --config configs/tiny.toml --set train.steps=4 --set checkpoint.interval=2 --set "
                               "train.sample_tokens=0 --set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path("own") +
                               "' --set checkpoint.dir='" + s.path("own") + "' --resume latest", s);
  INFO(again.err);
  CHECK(again.rc == 0);
}

TEST_CASE("simulate names its flags, a binary --config and a 64-bit overflow say so, an output linked to a terminal",
          "[cli][hostile]") {
  Scratch s(kGroup, "msgs");
  expect_user_error(run_troupe("simulate --schedule interleaved --stages 3 --microbatches 4 --chunks 2 --quiet", s),
                    {"--microbatches must be a multiple of 3", "use --microbatches 3 or 6, or --schedule 1f1b"});
  s.write("bin.toml", std::string("[model]\0\x01\x02", 10));
  expect_user_error(run_troupe("simulate --quiet --config '" + s.path("bin.toml") + "'", s), {"is not text", "NUL bytes"});
  s.write("big.toml", "[train]\nsteps = 9223372036854775808\n");
  expect_user_error(run_troupe("train --config '" + s.path("big.toml") + "'", s),
                    {"TOML integers are 64-bit", "write a smaller number"});
  fs::create_symlink("/dev/null", s.path("null.json"));
  expect_user_error(run_troupe("simulate --quiet --trace '" + s.path("null.json") + "'", s),
                    {"is a symbolic link (to /dev/null)", "not to terminals, pipes or devices"});
}

TEST_CASE("a damaged tokenizer.model in the data cache names the folder's fix, not data.tokenizer's", "[cli][hostile][data]") {
  Scratch s(kGroup, "tok");
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c") + "'", s).rc == 0);
  std::string folder;
  for (auto& e : fs::directory_iterator(s.path("c")))
    if (e.is_directory()) folder = e.path().string();
  REQUIRE_FALSE(folder.empty());
  std::ofstream(folder + "/tokenizer.model", std::ios::trunc) << std::string(3000, 'x');
  const Run r = run_troupe(tiny_args(s, "run"), s);
  expect_user_error(r, {"is damaged", "is not a SentencePiece model", "delete that folder"});
  CHECK(r.err.find("point data.tokenizer") == std::string::npos);
}

TEST_CASE("an OpenMP variable libgomp cannot read is refused in one sentence", "[cli][hostile]") {
  Scratch s(kGroup, "omp");
  for (const char* env : {"OMP_NUM_THREADS=0", "OMP_WAIT_POLICY=sometimes", "GOMP_SPINCOUNT=lots"}) {
    const Run r = run_troupe("simulate --quiet --schedule 1f1b --stages 2 --microbatches 4", s, 60, std::string("env ") + env);
    INFO(env);
    expect_user_error(r, {"environment variable", "fix or unset it"});
    // libgomp's own warning, once: troupe does not start itself again
    CHECK(r.err.find("libgomp: Invalid value") == r.err.rfind("libgomp: Invalid value"));
  }
  // valid ones run
  CHECK(run_troupe("simulate --quiet --schedule 1f1b --stages 2 --microbatches 4", s, 60,
                   "env OMP_NUM_THREADS=2,1 OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10k").rc == 0);
}
