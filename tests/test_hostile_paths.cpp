// Hostile inputs, tenth trial (review 14j): paths and limits. No output option writes into a
// troupe snapshot (the one --resume reads, or any other run's); a stack limit troupe cannot
// run under is refused with a sentence, not a SIGSEGV; --resume given a run directory or
// its checkpoints folder names the snapshot to pass; a huge manifest is damaged, and skipped
// by --resume latest; a torn last line of metrics.jsonl is neither glued to the next record
// nor a reason for plot to refuse the run.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using troupe::test::expect_user_error;
using troupe::test::Run;
using troupe::test::run_troupe;
using troupe::test::shell_status;
using troupe::test::slurp;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("hostile-paths", name) {}
};

// train on the tiny config with the scratch's data cache, no sample, no evaluation
std::string tiny(const Scratch& s) {
  return "train --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") +
         "' --set train.sample_tokens=0 --set train.eval_interval=0 --set train.eval_batches=1 ";
}

// A run directory `name` of 4 steps with snapshots at steps 2 and 4.
std::string make_base(const Scratch& s, const std::string& name) {
  const Run r = run_troupe(tiny(s) + "--set train.steps=4 --set checkpoint.interval=2 --run-dir '" + s.path(name) + "'",
                           s, 300);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  REQUIRE(fs::exists(s.path(name + "/checkpoints/step-00000004/manifest.capnp")));
  return s.path(name);
}

bool has_line(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }
}  // namespace

TEST_CASE("an output path inside a snapshot (the one --resume reads, or any other) is refused before anything is written",
          "[cli][hostile]") {
  Scratch s("outsnap");
  // a snapshot as far as paths go: these refusals come before any snapshot is read
  const std::string snap = s.path("base/checkpoints/step-00000004");
  fs::create_directories(snap);
  const std::string manifest = s.write("base/checkpoints/step-00000004/manifest.capnp", "a manifest");
  const std::string shard = s.write("base/checkpoints/step-00000004/shard-dp0-pp0-tp0.bin", "a shard");
  const std::string args = tiny(s) + "--set train.steps=6 --run-dir '" + s.path("r") + "' ";
  // H2: the run's own outputs into the snapshot it resumes from
  expect_user_error(run_troupe(args + "--resume '" + snap + "' --trace '" + manifest + "'", s, 60),
                    {"--trace", snap.c_str(), "pass a path outside"});
  expect_user_error(
      run_troupe(args + "--resume '" + snap + "' --trace '" + s.path("t.json") + "' --trace-png '" + shard + "'", s, 60),
      {"--trace-png", "pass a path outside"});
  expect_user_error(run_troupe(args + "--resume '" + snap + "' --tensorboard '" + snap + "'", s, 60),
                    {"--tensorboard", snap.c_str()});
  // M4: into another run's snapshot, without --resume
  expect_user_error(run_troupe(args + "--trace '" + manifest + "'", s, 60), {"--trace", "lies inside the snapshot"});
  expect_user_error(run_troupe(args + "--tensorboard '" + snap + "'", s, 60), {"--tensorboard", "is the snapshot"});
  expect_user_error(run_troupe(args + "--tensorboard '" + snap + "/tb'", s, 60),
                    {"--tensorboard", "lies inside the snapshot"});
  expect_user_error(run_troupe("simulate --stages 2 --microbatches 2 --quiet --trace '" + manifest + "'", s, 60),
                    {"--trace", "lies inside the snapshot"});
  expect_user_error(run_troupe("simulate --stages 2 --microbatches 2 --quiet --png '" + shard + "'", s, 60),
                    {"--png", "lies inside the snapshot"});
  expect_user_error(run_troupe("simulate --stages 2 --microbatches 2 --dump '" + snap + "/s.txt'", s, 60),
                    {"--dump", "lies inside the snapshot"});
  fs::create_directories(s.path("plotrun"));
  std::ofstream(s.path("plotrun/metrics.jsonl")) << "{\"step\":1,\"loss\":5.0,\"lr\":0.001}\n";
  expect_user_error(run_troupe("plot '" + s.path("plotrun") + "' --out '" + shard + "'", s, 60),
                    {"--out", "lies inside the snapshot"});
  // a snapshot still being written (no manifest yet) in a checkpoints folder is one too
  const std::string writing = s.path("base/checkpoints/step-00000006.tmp-12345");
  fs::create_directories(writing);
  expect_user_error(run_troupe(args + "--trace '" + writing + "/t.json'", s, 60), {"--trace", "step-00000006.tmp-12345"});
  CHECK(slurp(manifest) == "a manifest");
  CHECK(slurp(shard) == "a shard");
  CHECK(fs::is_empty(writing));
  size_t entries = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(snap)) ++entries;
  CHECK(entries == 2);
  CHECK_FALSE(fs::exists(s.path("r")));
  CHECK_FALSE(fs::exists(s.path("t.json")));
  // a folder merely named like a snapshot, outside any folder of snapshots, is not one
  fs::create_directories(s.path("mine/step-1"));
  const Run ok = run_troupe("simulate --stages 2 --microbatches 2 --quiet --trace '" + s.path("mine/step-1/t.json") + "'",
                            s, 60);
  INFO(ok.err);
  CHECK(ok.rc == 0);
}

TEST_CASE("a stack limit (ulimit -s) under 256 KiB is refused with one sentence, not a SIGSEGV", "[cli][hostile]") {
  Scratch s("stack");
  // (not lower than 32 KiB: at 16 KiB the dynamic loader itself crashes now and then, about 2%
  // of starts, before any of troupe's code runs)
  for (const char* kib : {"32", "128"}) {
    expect_user_error(run_troupe("--version", s, 60, std::string("ulimit -s ") + kib + " &&"),
                      {"ulimit -s", "256 KiB", "raise it"});
    const Run r = run_troupe(tiny(s) + "--set train.steps=2 --run-dir '" + s.path("r") + "'", s, 120,
                             std::string("ulimit -s ") + kib + " &&");
    expect_user_error(r, {"the stack limit (ulimit -s) is", kib});
    CHECK_FALSE(fs::exists(s.path("r")));
  }
  // at the floor, the threads (which glibc gives the stack limit as their stack size) run a
  // pipeline with two stages
  const Run ok = run_troupe(tiny(s) + "--set train.steps=2 --run-dir '" + s.path("r256") + "'", s, 300, "ulimit -s 256 &&");
  INFO(ok.err);
  CHECK(ok.rc == 0);
  CHECK(fs::exists(s.path("r256/metrics.jsonl")));
}

TEST_CASE("train --resume given a run directory or its checkpoints folder names the snapshot to pass", "[cli][hostile]") {
  Scratch s("resumedir");
  const std::string base = make_base(s, "base");
  const std::string args = tiny(s) + "--set train.steps=6 --run-dir '" + s.path("r") + "' ";
  const std::string newest = base + "/checkpoints/step-00000004";
  const Run rd = run_troupe(args + "--resume '" + base + "'", s, 120);
  expect_user_error(rd, {"is a run directory", newest.c_str(), ("--run-dir " + base + " --resume latest").c_str()});
  CHECK_FALSE(has_line(rd.err, "interrupted"));
  const Run ck = run_troupe(args + "--resume '" + base + "/checkpoints'", s, 120);
  expect_user_error(ck, {"is a folder of snapshots", newest.c_str(), "--resume latest"});
  CHECK_FALSE(has_line(ck.err, "interrupted"));
  // a manifest that is a FIFO: not a regular file (as generate and export say), not "interrupted"
  fs::create_directories(s.path("fifo"));
  fs::copy(newest, s.path("fifo/step-00000004"));
  fs::remove(s.path("fifo/step-00000004/manifest.capnp"));
  REQUIRE(::mkfifo(s.path("fifo/step-00000004/manifest.capnp").c_str(), 0600) == 0);
  const Run ff = run_troupe(args + "--resume '" + s.path("fifo/step-00000004") + "'", s, 60);
  expect_user_error(ff, {"not a regular file"});
  CHECK_FALSE(has_line(ff.err, "interrupted"));
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a huge manifest.capnp is damaged, not out of memory, and --resume latest skips it", "[cli][hostile]") {
  Scratch s("hugemanifest");
  const std::string base = make_base(s, "base");
  const std::string manifest = base + "/checkpoints/step-00000004/manifest.capnp";
  REQUIRE(shell_status("truncate -s 100G '" + manifest + "'") == 0);  // sparse
  const Run one = run_troupe(tiny(s) + "--set train.steps=6 --run-dir '" + s.path("r") + "' --resume '" + base +
                                 "/checkpoints/step-00000004'",
                             s, 120);
  expect_user_error(one, {"manifest.capnp is damaged", "64 MiB", "use another snapshot"});
  CHECK_FALSE(has_line(one.err, "out of memory"));
  const Run latest = run_troupe(tiny(s) + "--set train.steps=6 --run-dir '" + base + "' --resume latest", s, 300);
  INFO(latest.err);
  CHECK(latest.rc == 0);
  CHECK(has_line(latest.err, "skipped damaged snapshot " + base + "/checkpoints/step-00000004"));
  CHECK(has_line(slurp(base + "/metrics.jsonl"), "step-00000002\",\"step\":2}"));
  // kept out of the way of the continuing run's own step 4 and its retention
  CHECK(has_line(latest.err, "moved aside to " + base + "/checkpoints/step-00000004.unreadable"));
  CHECK(fs::exists(base + "/checkpoints/step-00000004.unreadable/manifest.capnp"));
}

TEST_CASE("a torn last line of metrics.jsonl: the resumed run starts a new line, plot skips the torn one",
          "[cli][hostile]") {
  Scratch s("tornline");
  const std::string base = make_base(s, "base");
  const std::string metrics = base + "/metrics.jsonl";
  std::string text = slurp(metrics);
  REQUIRE(text.size() > 60);
  text.resize(text.size() - 30);  // a power loss in the middle of the last record
  while (text.back() == '}' || text.back() == '\n') text.pop_back();
  std::ofstream(metrics, std::ios::binary | std::ios::trunc) << text;
  const Run r = run_troupe(tiny(s) + "--set train.steps=6 --run-dir '" + base + "' --resume latest", s, 300);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(has_line(r.err, "was cut short"));
  // every line but the torn one is whole JSON, the resume marker among them
  std::istringstream lines(slurp(metrics));
  int torn = 0, marker = 0, n = 0;
  for (std::string l; std::getline(lines, l);) {
    ++n;
    if (l.find("\"resumed_from\"") != std::string::npos) ++marker;
    if (l.empty() || l.back() != '}') ++torn;
  }
  CHECK(torn == 1);
  CHECK(marker == 1);
  if (shell_status("command -v gnuplot > /dev/null 2>&1") != 0) {
    WARN("plot part skipped: gnuplot is not installed (scripts/setup.sh installs it)");
    return;
  }
  const Run p = run_troupe("plot '" + base + "' --out '" + s.path("p.png") + "'", s, 120);
  INFO(p.err);
  CHECK(p.rc == 0);
  CHECK(has_line(p.err, "warning: " + metrics + " line "));
  CHECK(has_line(p.err, "skipped"));
  CHECK(fs::file_size(s.path("p.png")) > 0);
}

TEST_CASE("plot of a run directory holding two fresh runs draws the last one and says so", "[cli][hostile]") {
  if (shell_status("command -v gnuplot > /dev/null 2>&1") != 0) {
    WARN("skipped: gnuplot is not installed (scripts/setup.sh installs it)");
    return;
  }
  Scratch s("tworuns");
  fs::create_directories(s.path("run"));
  std::string text;
  for (int k = 1; k <= 5; ++k) text += "{\"step\":" + std::to_string(k) + ",\"loss\":" + std::to_string(6 - k) + ".0}\n";
  text += "{\"steps\":5,\"summary\":true}\n";  // line 6: the first run ends
  for (int k = 1; k <= 3; ++k) text += "{\"step\":" + std::to_string(k) + ",\"loss\":" + std::to_string(7 - k) + ".0}\n";
  s.write("run/metrics.jsonl", text);
  const Run p = run_troupe("plot '" + s.path("run") + "' --out '" + s.path("p.png") + "'", s, 120);
  INFO(p.err);
  CHECK(p.rc == 0);
  CHECK(has_line(p.err, "holds 2 runs"));
  CHECK(has_line(p.err, "from line 7"));
  CHECK(has_line(slurp(s.path("stdout.txt")), "(3 step records"));
  // a resume after the summary (train.steps raised) continues the same run
  s.write("run/metrics.jsonl", text.substr(0, text.find("{\"step\":1,", 10)) +
                                   "{\"resumed_from\":\"x/step-00000005\",\"step\":5}\n{\"step\":6,\"loss\":0.5}\n");
  const Run r = run_troupe("plot '" + s.path("run") + "' --out '" + s.path("p.png") + "'", s, 120);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK_FALSE(has_line(r.err, "holds 2 runs"));
  CHECK(has_line(slurp(s.path("stdout.txt")), "(6 step records"));
}

TEST_CASE("a preparation waiting for another one's lock names the holder's pid and that it is stopped",
          "[cli][hostile]") {
  Scratch s("lockholder");
  const std::string prep = "'" + troupe::test::troupe_bin() +
                           "' prepare --config configs/tiny.toml --set model.vocab_size=1500 --set data.cache_dir='" +
                           s.path("cache") + "'";
  // A holds the lock (its pid written in .lock) and is stopped; B waits for it
  const std::string script = "cd '" + std::string(TROUPE_SOURCE_DIR) + "'\n" + prep + " > /dev/null 2> '" +
                             s.path("a.err") + "' & A=$!\necho $A > '" + s.path("a.pid") +
                             "'\ni=0; until grep -qs . '" + s.path("cache") +
                             "'/*/.lock || [ $i -ge 2400 ]; do sleep 0.05; i=$((i+1)); done\nkill -STOP $A\n"
                             "timeout 8 " + prep + " > /dev/null 2> '" + s.path("b.err") + "'\necho $? > '" +
                             s.path("b.rc") + "'\nkill -CONT $A\nwait $A\necho $? > '" + s.path("a.rc") + "'\n";
  s.write("locks.sh", script);
  REQUIRE(shell_status("timeout 300 sh '" + s.path("locks.sh") + "'") == 0);
  const std::string pid = slurp(s.path("a.pid")).substr(0, slurp(s.path("a.pid")).find('\n'));
  INFO("a: " << slurp(s.path("a.err")) << "\nb: " << slurp(s.path("b.err")));
  CHECK(slurp(s.path("a.rc")) == "0\n");
  CHECK(has_line(slurp(s.path("b.err")), "waiting for pid " + pid + " preparing "));
  CHECK(has_line(slurp(s.path("b.err")), "; it is stopped"));
  CHECK(has_line(slurp(s.path("b.err")), "kill -CONT " + pid));
  CHECK(slurp(s.path("b.rc")) == "124\n");
}

TEST_CASE("train.initial_loss_scale = inf is refused saying the scale must be finite", "[cli][hostile]") {
  Scratch s("infscale");
  expect_user_error(run_troupe(tiny(s) + "--set train.precision=fp16 --set train.initial_loss_scale=inf --run-dir '" +
                                   s.path("r") + "'",
                               s, 60),
                    {"train.initial_loss_scale = inf", "need finite numbers"});
  CHECK_FALSE(fs::exists(s.path("r")));
}
