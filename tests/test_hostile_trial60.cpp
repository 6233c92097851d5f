// Hostile inputs, issue 14: trial 60's findings. Numbers in config messages were still
// pre-formatted (1e-07 for 0.0000001: F1, checked in test_hostile_trial59.cpp's number
// case and here); plan suggested a parallel.dp the batch cannot be split into (F2); --grace
// took more than a week (F3); an output path through a file deeper down was told to "create
// that folder" (F4).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial60";
}  // namespace

TEST_CASE("fixes that work when followed: plan's dp with its batch, a file in an output path, --grace's week",
          "[cli][hostile]") {
  Scratch s(kGroup, "fixes");
  // F2: the suggested dp comes with a batch size it divides, and following it plans
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=a100-80g --set cluster.gpus_per_node=3", s),
                    {"cluster.nodes = 2 with parallel.dp = 3 and train.batch_size = 24"});
  CHECK(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=a100-80g --set cluster.gpus_per_node=3 "
                   "--set cluster.nodes=2 --set parallel.dp=3 --set train.batch_size=24", s).rc == 0);
  // F4: the file the path goes through is named
  s.write("afile", "x");
  expect_user_error(run_troupe("simulate --quiet --trace '" + s.path("afile/sub/t.json") + "'", s),
                    {("goes through the file '" + s.path("afile") + "' as if it were a folder").c_str(),
                     "move that file out of the way"});
  CHECK(slurp(s.path("afile")) == "x");
  // F3: every timeout at most a week (README)
  expect_user_error(run_troupe("launch --nprocs 1 --grace 604801 -- true", s), {"from 0 to 604800 (a week)"});
  CHECK(run_troupe("launch --nprocs 1 --grace 604800 -- true", s).rc == 0);
  // F1: a config value as typed
  expect_user_error(run_troupe("train --config configs/tiny.toml --set fault.heartbeat_s=0.0000001 --run-dir '" +
                                   s.path("r") + "'", s),
                    {"fault.heartbeat_s = 0.0000001;"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.initial_loss_scale=3.5e38 --run-dir '" +
                                   s.path("r") + "'", s),
                    {"train.initial_loss_scale = 3.5e38;"});
  CHECK_FALSE(fs::exists(s.path("r")));
  // trial 61: a value past a bound never prints as the bound; plot given the metrics file
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.timeout_s=604800.0000000001 --run-dir '" +
                                   s.path("r") + "'", s),
                    {"train.timeout_s = 604800.0000000001;"});
  fs::create_directories(s.path("run"));
  s.write("run/metrics.jsonl", "{\"step\":1,\"loss\":2}\n");
  expect_user_error(run_troupe("plot '" + s.path("run/metrics.jsonl") + "'", s),
                    {"is a file; plot takes the run directory that holds metrics.jsonl", ("pass " + s.path("run")).c_str()});
}
