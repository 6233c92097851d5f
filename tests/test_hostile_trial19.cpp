// Hostile inputs, issue 14's nineteenth trial (a fresh reviewer's 77 cases): a path written
// with '~' that no shell expanded (K01, K02), a short TROUPE_JOB_SECRET given to launch (E11),
// sequence parallelism's divisibility with a concrete fix (Y05), a run directory whose
// metrics.jsonl is past what plot reads (P11), a run's folder of snapshots given as --run-dir
// (X02).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial19";
}  // namespace

TEST_CASE("a path starting with '~' that no shell expanded is refused, not made into a folder named '~'",
          "[cli][hostile]") {
  Scratch s(kGroup, "tilde");
  const fs::path tilde = fs::path(TROUPE_SOURCE_DIR) / "~";
  const bool was_there = fs::exists(tilde);
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set 'checkpoint.dir=~/ck'", s),
                    {"checkpoint.dir = '~/ck' starts with '~'", "write the full path"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'data.corpus=~/c.txt'", s),
                    {"data.corpus = '~/c.txt' starts with '~'"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir '~/run'", s),
                    {"--run-dir of troupe train is '~/run', which starts with '~'"});
  expect_user_error(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet --trace=~/t.json", s),
                    {"--trace of troupe simulate", "starts with '~'"});
  const std::string cfg = s.write("t.toml", "[data]\ncache_dir = \"~/cache\"\n");
  expect_user_error(run_troupe("prepare --config '" + cfg + "'", s), {"data.cache_dir = '~/cache' starts with '~'"});
  CHECK(fs::exists(tilde) == was_there);
}

TEST_CASE("launch refuses a short TROUPE_JOB_SECRET before any process starts, naming the variable", "[launch][hostile]") {
  Scratch s(kGroup, "secret");
  const Run r = run_troupe("launch --nprocs 2 -- /bin/sh -c 'touch " + s.path("started") + "'", s, 60,
                           "env TROUPE_JOB_SECRET=short");
  expect_user_error(r, {"TROUPE_JOB_SECRET in the environment has 5 characters", "openssl rand -hex 32"});
  CHECK_FALSE(fs::exists(s.path("started")));
}

TEST_CASE("sequence parallelism's token rows that tp does not divide name the seq_len that fits", "[cli][hostile]") {
  Scratch s(kGroup, "sp");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set parallel.tp=2 --set parallel.sequence_parallel=true "
                               "--set parallel.microbatches=16 --set train.seq_len=63", s),
                    {"63 does not divide by 2", "train.seq_len = 62 or 64", "sequence_parallel = false"});
}

TEST_CASE("a run directory that is another run's folder of snapshots, or whose metrics.jsonl is over 1 GiB, is refused",
          "[cli][hostile]") {
  Scratch s(kGroup, "rundir");
  const std::string base = "train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=2 --set "
                           "train.sample_tokens=0 --set data.cache_dir='" + s.path("c") + "'";
  REQUIRE(run_troupe(base + " --run-dir '" + s.path("r") + "'", s).rc == 0);
  expect_user_error(run_troupe(base + " --run-dir '" + s.path("r/checkpoints") + "'", s),
                    {"it is a folder of snapshots, not a run directory", "--resume latest"});
  CHECK_FALSE(fs::exists(s.path("r/checkpoints/config.toml")));
  // (a sparse file: no disk used)
  fs::resize_file(s.path("r/metrics.jsonl"), (3ull << 29));
  expect_user_error(run_troupe(base + " --set train.steps=3 --run-dir '" + s.path("r") + "' --resume latest", s),
                    {"metrics.jsonl of 1.5 GiB", "move it aside"});
  CHECK(fs::file_size(s.path("r/metrics.jsonl")) == (3ull << 29));
}
