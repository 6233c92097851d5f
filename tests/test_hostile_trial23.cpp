// Hostile inputs, issue 14's twenty-third trial (a fresh reviewer's 134 cases): a token file
// truncated under a run ended it with SIGBUS through its memory mapping (C04, high); a
// user's folder named step-<k> without a manifest in checkpoint.dir was deleted when the
// run wrote snapshot k (K01/K04, high); a filesystem with bytes but no inodes passed the
// free-space checks (P02, P01); and the lows: sequence parallelism without TP, a stop signal
// during a long final validation, plot's advice for extreme losses.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "checkpoint/snapshot.h"
#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial23";
}  // namespace

TEST_CASE("a token file truncated under a run stops it with exit 2 naming the file, not SIGBUS", "[cli][hostile][data]") {
  Scratch s(kGroup, "shrink");
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c") + "'", s).rc == 0);
  std::string bin;
  for (auto& e : fs::recursive_directory_iterator(s.path("c")))
    if (e.path().filename() == "corpus.train.bin") bin = e.path().string();
  REQUIRE_FALSE(bin.empty());
  const Run r = run_and_signal(s, "train --config configs/tiny.toml --set train.steps=100000 --set train.eval_interval=0 "
                                  "--set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path("run") + "'",
                               "step +3/", "truncate -s 1000 '" + bin + "'");
  expect_user_error(r, {"corpus.train.bin' changed while in use", "delete", "no snapshot of this run is on disk"});
  CHECK(r.err.find("wait-for graph") == std::string::npos);
}

TEST_CASE("a step-k folder of a user's files in checkpoint.dir is refused at the start and never deleted",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "userstep");
  fs::create_directories(s.path("ck/step-00000001"));
  s.write("ck/step-00000001/mydata.txt", "precious\n");
  const std::string run = "train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 "
                          "--set train.sample_tokens=0 --set train.eval_interval=0 --set train.eval_batches=1 "
                          "--set data.cache_dir='" + s.path("c") + "' --set checkpoint.dir='" + s.path("ck") + "'";
  expect_user_error(run_troupe(run + " --run-dir '" + s.path("r1") + "'", s),
                    {"holds step-00000001/, which is not a snapshot", "mydata.txt", "move it out of checkpoint.dir"});
  CHECK(slurp(s.path("ck/step-00000001/mydata.txt")) == "precious\n");
  CHECK_FALSE(fs::exists(s.path("r1")));
  // a half-deleted snapshot (snapshot files only, no manifest) is replaced
  fs::remove_all(s.path("ck/step-00000001"));
  fs::create_directories(s.path("ck/step-00000001"));
  s.write("ck/step-00000001/shard-dp0-pp0-tp0.bin", "x");
  const Run r = run_troupe(run + " --run-dir '" + s.path("r2") + "'", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(fs::exists(s.path("ck/step-00000001/manifest.capnp")));
  // one that appears during the run is renamed aside by the writer, not deleted
  fs::create_directories(s.path("tmp"));
  fs::create_directories(s.path("late/step-00000002"));
  s.write("late/step-00000002/mine.txt", "mine\n");
  const std::string kept = troupe::commit_snapshot(s.path("tmp"), s.path("late/step-00000002"));
  CHECK(kept == s.path("late/step-00000002.kept"));
  CHECK(slurp(s.path("late/step-00000002.kept/mine.txt")) == "mine\n");
  CHECK(fs::is_directory(s.path("late/step-00000002")));
}

TEST_CASE("a filesystem with bytes free but no inodes is refused before the run, naming inodes", "[cli][hostile]") {
  Scratch s(kGroup, "inodes");
  const std::string mnt = s.path("mnt"), t = "'" + troupe_bin() + "'";
  const std::string common = " --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=1 --set "
                             "train.sample_tokens=0 --set data.cache_dir='" + s.path("c") + "'";
  const std::string body = "mount -o remount,nr_inodes=6 '" + mnt + "'\n" +
                           "if " + t + " train" + common + " --run-dir '" + mnt + "/run' > /dev/null 2> '" + s.path("a.err") +
                           "'; then echo 0; else echo $?; fi > '" + s.path("a.rc") + "'\n" +
                           "if " + t + " train" + common + " --run-dir '" + s.path("run") + "' --set checkpoint.dir='" + mnt +
                           "/ck' > /dev/null 2> '" + s.path("b.err") + "'; then echo 0; else echo $?; fi > '" + s.path("b.rc") + "'\n" +
                           "ls -A '" + mnt + "' > '" + s.path("ls.txt") + "'";
  std::string why;
  if (!run_on_tmpfs(s, mnt, 64, body, &why)) {
    SUCCEED("no mount namespace here (" << why << "): nothing to check");
    return;
  }
  INFO(slurp(s.path("tmpfs.log")) << slurp(s.path("a.err")) << slurp(s.path("b.err")));
  CHECK(slurp(s.path("a.rc")) == "2\n");
  CHECK(slurp(s.path("a.err")).find("free inodes") != std::string::npos);
  CHECK(slurp(s.path("b.rc")) == "2\n");
  CHECK(slurp(s.path("b.err")).find("free inodes") != std::string::npos);
  CHECK(slurp(s.path("ls.txt")).empty());  // nothing written there
}

TEST_CASE("a stop signal during a long validation ends it at once and saves the step", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "evalstop");
  const auto t0 = std::chrono::steady_clock::now();
  const Run r = run_and_signal(s, "train --config configs/tiny.toml --set train.steps=3 --set train.sample_tokens=0 "
                                  "--set train.eval_batches=100000 --set data.cache_dir='" + s.path("c") +
                                  "' --run-dir '" + s.path("run") + "'",
                               "step +3/3 \\\\| loss", "sleep 0.5; kill -TERM $p");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("validation stopped after") != std::string::npos);
  CHECK(fs::exists(s.path("run/checkpoints/step-00000003/manifest.capnp")));
  CHECK(took < 60);  // (100000 batches would take many minutes)
}

TEST_CASE("plot leaves out values gnuplot cannot scale, naming them, and sequence parallelism without TP is warned about",
          "[cli][hostile]") {
  Scratch s(kGroup, "misc");
  fs::create_directories(s.path("p"));
  s.write("p/metrics.jsonl", "{\"step\":1,\"loss\":1e308,\"lr\":0.001}\n{\"step\":2,\"loss\":-1e308,\"lr\":0.001}\n"
                             "{\"step\":3,\"loss\":5e-324,\"lr\":0.001}\n{\"step\":4,\"loss\":2.5,\"lr\":0.001}\n");
  Run r = run_troupe("plot '" + s.path("p") + "'", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("3 value(s) beyond what gnuplot can scale an axis to (the first: loss 1e+308 at step 1)") !=
        std::string::npos);
  CHECK(fs::file_size(s.path("p/plot.png")) > 0);
  r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 --set "
                 "parallel.sequence_parallel=true --set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path("run") + "'",
                 s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("parallel.sequence_parallel = true does nothing with parallel.tp = 1") != std::string::npos);
}
