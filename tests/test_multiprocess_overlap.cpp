// Overlap changes no bit (issue 17): with parallel.dp_bucket_mb > 0 the DP gradient
// reduce-scatter runs in buckets during the last backward, and the parameter all-gathers of
// each update run on the communication thread while the next step's first forward (which
// waits for each bucket it reaches), an evaluation, a snapshot or a sample go on. Whole jobs
// in one and 2 processes give the bytes of the same job without overlap.
#include <algorithm>
#include <string>
#include <vector>

#include "multiprocess_helpers.h"

using namespace troupe::mptest;

namespace {
// The generated text of a run (train.sample_tokens = 8): stderr from the line announcing it
// to the next log line.
std::string sample_of(const std::string& err) {
  const std::string mark = "sample (8 tokens):\n";
  const size_t a = err.find(mark);
  if (a == std::string::npos) return "(no sample)";
  const size_t b = err.find("\n[", a + mark.size());
  return err.substr(a + mark.size(), b == std::string::npos ? std::string::npos : b - a - mark.size());
}
}  // namespace

TEST_CASE("overlap changes no bit: the DP reduce-scatter during backward and the all-gather during the next forward",
          "[multiprocess][overlap]") {
  // parallel.dp_bucket_mb = 0 (one reduce-scatter after the backward, one all-gather after
  // the update, in one process) is the reference; 0.02 MiB cuts each worker's gradients into
  // dozens of buckets started during the last microbatch's backward (from step 2 on), with
  // 1F1B and with the zero-bubble schedule (buckets started by W actions), and leaves the
  // all-gathers of steps 1 and 2 running into the forward of steps 2 and 3, and those of
  // step 3 into the snapshot, the evaluation and the sample. Losses, validation loss, the
  // step-3 snapshot's shards (values, masters, moments) and the sample must be the same bytes.
  // bf16: the all-gather job also narrows the parameters into the 16-bit values. PP = 1: the
  // tied embedding is reduce-scattered early, its last microbatch's rows once final.
  Scratch s("overlap");
  struct Case {
    std::string name, layout;
    std::vector<int> nprocs;
  };
  const std::vector<Case> cases = {
      {"dp2", "--set parallel.pp=1 --set parallel.tp=1 --set parallel.dp=2", {1, 2}},
      {"dp2pp2-zb", "--set parallel.pp=2 --set parallel.tp=1 --set parallel.dp=2 --set parallel.schedule=zb-h1", {1, 2}},
      {"dp2-bf16", "--set parallel.pp=1 --set parallel.tp=1 --set parallel.dp=2 --set train.precision=bf16", {2}},
      // PP = 1: the tied embedding's reduce-scatter starts at the last head backward
      // (Zero1::tied_early), over a vocabulary split by TP, with fp16's scaling and overflows
      {"dp2tp2-fp16", "--set parallel.pp=1 --set parallel.tp=2 --set parallel.dp=2 --set train.precision=fp16", {2}},
  };
  const std::string sample = " --set train.sample_tokens=8";
  for (const auto& c : cases) {
    const std::string off = c.name + "-off";
    Run ref_run = sh("'" + troupe_bin() + "' " +
                         train_args(s, off, c.layout + sample + " --set parallel.dp_bucket_mb=0 --set train.threads=2"),
                     s, off);
    INFO(c.name << " without overlap: " << errors_first(ref_run.err));
    REQUIRE(ref_run.rc == 0);
    const Outcome ref = read_run(s.path(off));
    REQUIRE(ref.losses.size() == 3);
    REQUIRE(!ref.shards.empty());
    REQUIRE(sample_of(ref_run.err) != "(no sample)");
    for (int n : c.nprocs) {
      const std::string run = c.name + "-on-" + std::to_string(n) + "p";
      const std::string args =
          train_args(s, run, c.layout + sample + " --set parallel.dp_bucket_mb=0.02 --set train.threads=" +
                                 std::to_string(n == 1 ? 2 : 1));
      const std::string trace = s.path(run + ".trace.json");
      Run on = sh(n == 1 ? "'" + troupe_bin() + "' " + args
                         : "'" + troupe_bin() + "' launch --nprocs 2 --grace 15 -- '" + troupe_bin() + "' " + args +
                               " --trace '" + trace + "'",
                  s, run);
      INFO(c.name << " with overlap in " << n << " process(es): " << errors_first(on.err));
      REQUIRE(on.rc == 0);
      check_same_run(read_run(s.path(run)), ref);
      CHECK(sample_of(on.err) == sample_of(ref_run.err));
      if (n == 2 && c.name == "dp2") {  // the trace: buckets on stage 0's comm track, the first during backward
        const auto j = nlohmann::json::parse(slurp(trace));
        int gathers = 0;
        for (int64_t step : {2, 3}) {
          INFO("step " << step);
          double b_end = 0, rs_ready = 1e300;  // the first bucket ready (posted) to reduce-scatter
          int buckets = 0;
          for (auto& e : j["traceEvents"]) {
            if (e["ph"] != "X" || e["args"]["step"] != step) continue;
            const double t0 = e["ts"].get<double>(), t1 = t0 + e["dur"].get<double>();
            if (e["cat"] == "B" && e["tid"] == 0) b_end = std::max(b_end, t1);
            if (e["cat"] == "reduce-scatter" && e["tid"] == 1) ++buckets;
            // (the post time, not the start: under load the communication thread may start it late)
            if (e["cat"] == "reduce-scatter" && e["tid"] == 1 && e["args"].contains("posted_us"))
              rs_ready = std::min(rs_ready, e["args"]["posted_us"].get<double>());
            if (e["cat"] == "all-gather" && e["tid"] == 1) ++gathers;
          }
          CHECK(buckets >= 10);
          CHECK(rs_ready < b_end);
        }
        CHECK(gathers >= 10);  // the all-gathers in buckets too (shown with the step they ended in)
      }
    }
  }
  CHECK(survivors(s) == 0);
}

TEST_CASE("overlap: a process killed with all-gathers in flight recovers in place, bitwise the run without overlap",
          "[multiprocess][overlap]") {
  // A restore (in-place recovery) replaces the values while the survivors' last all-gathers
  // may still run: worker and optimizer wait for them first. DP2 x PP2 over 4 processes,
  // 0.02 MiB buckets, process 3 killed at step 6's start (from peer memory) and process 2
  // in step 6's backward (from the disk's snapshot), against one process without overlap.
  Scratch s("overlap-restart");
  const std::string layout = "--set parallel.pp=2 --set parallel.dp=2 --set train.steps=8 --set checkpoint.interval=2";
  Run straight = sh("'" + troupe_bin() + "' " +
                        train_args(s, "straight", layout + " --set train.threads=2 --set parallel.dp_bucket_mb=0"),
                    s, "straight");
  INFO(errors_first(straight.err));
  REQUIRE(straight.rc == 0);
  auto final_shards = [&](const std::string& run) { return shards_of(s.path(run) + "/checkpoints/step-00000008"); };
  REQUIRE(!final_shards("straight").empty());
  struct Kill {
    std::string name, env, set;
  };
  const std::vector<Kill> kills = {
      {"mem-p3-step6", "TROUPE_FAULT_KILL_RANK=3 TROUPE_FAULT_KILL_STEP=6", "--set checkpoint.memory_interval=1"},
      {"p2-backward6", "TROUPE_FAULT_KILL_RANK=2 TROUPE_FAULT_KILL_STEP=6 TROUPE_FAULT_PHASE=B", ""},
  };
  for (const auto& [name, env, set] : kills) {
    const std::string run = "killed-" + name;
    Run r = sh("env " + env + " '" + troupe_bin() + "' launch --nprocs 4 --grace 15 -- '" + troupe_bin() + "' " +
                   train_args(s, run, layout + " --set train.threads=1 --set parallel.dp_bucket_mb=0.02 " + set),
               s, run, 200);
    INFO(run << ": " << errors_first(r.err));
    REQUIRE(r.rc == 0);
    CHECK(r.err.find("restart 1") != std::string::npos);
    CHECK(losses_by_step(s.path(run)) == losses_by_step(s.path("straight")));
    CHECK(final_shards(run) == final_shards("straight"));
  }
  CHECK(survivors(s) == 0);
}
