// Hostile inputs, issue 14's twenty-first trial (a fresh reviewer's 58 cases): a data cache
// folder that is a symbolic link to a user's folder had its files replaced (F17, high); a run
// directory among the run's data (F01); CPU affinity (taskset) counted as the machine's cores
// (Z06); a mistyped required option reported as missing (A10); OMP_PLACES / OMP_PROC_BIND
// libgomp cannot read (P11); an output path through a file (Y05); --resume latest after a
// run resumed from an earlier snapshot took the left line's later step (X10); a run directory
// holding the --config file (F02).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial21";
}  // namespace

TEST_CASE("a data cache folder that is a symbolic link is refused, the folder it points to untouched", "[cli][hostile][data]") {
  Scratch s(kGroup, "cachelink");
  // the folder name tiny's preparation uses, found by preparing once elsewhere
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("probe") + "'", s).rc == 0);
  std::string key;
  for (auto& e : fs::directory_iterator(s.path("probe")))
    if (e.is_directory()) key = e.path().filename().string();
  REQUIRE_FALSE(key.empty());
  fs::create_directories(s.path("mine"));
  s.write("mine/report.json", "my report\n");
  fs::create_directories(s.path("c"));
  fs::create_directory_symlink(s.path("mine"), s.path("c/" + key));
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c") + "'", s),
                    {"is a symbolic link", "remove the link"});
  CHECK(slurp(s.path("mine/report.json")) == "my report\n");
  CHECK_FALSE(fs::exists(s.path("mine/meta.json")));
}

TEST_CASE("a run directory holding the run's data, a mistyped required option, an output path through a file",
          "[cli][hostile]") {
  Scratch s(kGroup, "misc");
  fs::create_directories(s.path("d"));
  fs::copy_file(fs::path(TROUPE_SOURCE_DIR) / "tests/data/tiny_corpus.txt", s.path("d/corpus.txt"));
  expect_user_error(run_troupe("train --config configs/tiny.toml --set data.corpus='" + s.path("d/corpus.txt") +
                               "' --run-dir '" + s.path("d") + "'", s),
                    {"holds this run's input", "pass a new folder"});
  CHECK_FALSE(fs::exists(s.path("d/config.toml")));
  expect_user_error(run_troupe("train --confg configs/tiny.toml", s), {"troupe train has no option --confg"});
  s.write("afile", "x");
  expect_user_error(run_troupe("simulate --quiet --trace '" + s.path("afile/t.json") + "'", s),
                    {"afile is a file, not a folder"});
}

TEST_CASE("OMP_PLACES and OMP_PROC_BIND libgomp cannot read are refused, valid ones run", "[cli][hostile]") {
  Scratch s(kGroup, "omp");
  expect_user_error(run_troupe("simulate --quiet", s, 60, "env OMP_PLACES=nonsense"), {"OMP_PLACES='nonsense'"});
  expect_user_error(run_troupe("simulate --quiet", s, 60, "env OMP_PROC_BIND=sideways"), {"OMP_PROC_BIND='sideways'"});
  CHECK(run_troupe("simulate --quiet", s, 60, "env OMP_PROC_BIND=spread,close OMP_PLACES='cores(2)'").rc == 0);
}

TEST_CASE("train.threads past the CPUs this process may use (taskset) is warned about with that count", "[cli][hostile]") {
  Scratch s(kGroup, "affinity");
  if (std::system("taskset -c 0 true >/dev/null 2>&1") != 0) {
    SUCCEED("no taskset here: nothing to check");
    return;
  }
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.threads=4 --set "
                           "train.sample_tokens=0 --set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path("run") + "'",
                           s, 120, "taskset -c 0");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("exceeds the 1 core(s) this process may use") != std::string::npos);
}

TEST_CASE("a run directory removed while the run goes on is warned about once", "[cli][hostile]") {
  Scratch s(kGroup, "removed");
  const std::string run = s.path("run");
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c") + "'", s).rc == 0);
  // (dash: no $'..'; the wait for the first record is bounded, 30 s)
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && timeout 120 '" + troupe_bin() +
                          "' train --config configs/tiny.toml --set train.steps=150 --set train.sample_tokens=0 --set "
                          "data.cache_dir='" + s.path("c") + "' --run-dir '" + run + "' > /dev/null 2> '" +
                          s.path("err.txt") + "' & pid=$!; i=0; while [ ! -s '" + run + "/metrics.jsonl' ] && [ $i -lt 300 ]; "
                          "do sleep 0.1; i=$((i+1)); done; rm -rf '" + run + "'; wait $pid";
  const int rc = shell_status(cmd);
  const std::string err = slurp(s.path("err.txt"));
  INFO(err);
  CHECK(rc == 0);
  const size_t first = err.find("was removed during the run");
  CHECK(first != std::string::npos);
  CHECK(err.find("was removed during the run", first + 1) == std::string::npos);
}

TEST_CASE("a run resumed from an earlier snapshot sets the later steps aside: --resume latest continues it",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "line");
  const std::string common = "train --config configs/tiny.toml --set data.cache_dir='" + s.path("c") +
                             "' --set train.sample_tokens=0 --set train.eval_interval=0 --set train.eval_batches=1 "
                             "--set checkpoint.keep_last=5 --run-dir '" + s.path("run") + "'";
  const std::string ck = s.path("run/checkpoints/");
  REQUIRE(run_troupe(common + " --set train.steps=4 --set checkpoint.interval=2", s).rc == 0);
  REQUIRE(fs::exists(ck + "step-00000004/manifest.capnp"));
  // back to step 2, one step on: step 3 is this run's; step 4 is the line it left
  Run r = run_troupe(common + " --set train.steps=3 --set checkpoint.interval=1 --resume '" + ck + "step-00000002'", s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("is set aside as") != std::string::npos);
  CHECK(fs::exists(ck + "step-00000003/manifest.capnp"));
  CHECK_FALSE(fs::exists(ck + "step-00000004"));
  CHECK(fs::exists(ck + "step-00000004.superseded/manifest.capnp"));  // kept, not deleted
  Run l = run_troupe(common + " --set train.steps=5 --set checkpoint.interval=1 --resume latest", s);
  INFO(l.err);
  REQUIRE(l.rc == 0);
  CHECK(l.err.find("resumed from " + ck + "step-00000003") != std::string::npos);
  // the set-aside snapshot still loads by name (here: nothing left to train, refused as such)
  expect_user_error(run_troupe(common + " --set train.steps=4 --resume '" + ck + "step-00000004.superseded'", s),
                    {"nothing left to train"});
  // but a copy whose name says another step is refused
  fs::copy(ck + "step-00000003", s.path("step-00000007"), fs::copy_options::recursive);
  expect_user_error(run_troupe(common + " --set train.steps=9 --resume '" + s.path("step-00000007") + "'", s),
                    {"holds step 3, not the step its name says"});
}

TEST_CASE("a run directory holding the --config file is refused, the run directory config.toml resumes", "[cli][hostile]") {
  Scratch s(kGroup, "cfgdir");
  fs::create_directories(s.path("configs"));
  fs::copy_file(fs::path(TROUPE_SOURCE_DIR) / "configs/tiny.toml", s.path("configs/tiny.toml"));
  const std::string corpus = (fs::path(TROUPE_SOURCE_DIR) / "tests/data/tiny_corpus.txt").string();
  const std::string sets = " --set data.corpus='" + corpus + "' --set data.cache_dir='" + s.path("c") +
                           "' --set train.sample_tokens=0 --set train.eval_interval=0 --set train.eval_batches=1";
  expect_user_error(run_troupe("train --config '" + s.path("configs/tiny.toml") + "' --run-dir '" + s.path("configs") +
                               "'" + sets + " --set train.steps=1", s),
                    {"holds this run's config file", "pass a new folder"});
  CHECK_FALSE(fs::exists(s.path("configs/metrics.jsonl")));
  // the config a run saves in its run directory is what a resume passes
  REQUIRE(run_troupe("train --config '" + s.path("configs/tiny.toml") + "' --run-dir '" + s.path("run") + "'" + sets +
                         " --set train.steps=1 --set checkpoint.interval=1", s).rc == 0);
  Run r = run_troupe("train --config '" + s.path("run/config.toml") + "' --run-dir '" + s.path("run") + "'" + sets +
                         " --set train.steps=2 --resume latest", s);
  INFO(r.err);
  CHECK(r.rc == 0);
}
