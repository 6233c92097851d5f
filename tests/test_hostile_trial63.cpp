// Hostile inputs, issue 14: trial 63's findings. /dev/stdout as an output was called a
// link to a missing file, with "rm /dev/stdout" (F1); a snapshot named for another step was
// told to take a name already taken (F2); plan --calibrate's recipe for a missing run left
// out its mkdir (F3); a checkpoint.dir holding a run without snapshots was told to resume it
// (F4); and lows: 1e-400 in a file blamed on digits, a link to a folder called a device,
// positional arguments by their internal names, a number called a name, simulate blaming
// flags for a config's counts, --set's blanks around dots and its 32-bit bound unnamed.
#include <catch2/catch.hpp>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "actors/intruders.h"
#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial63";
}  // namespace

TEST_CASE("an output that is a stream or a link to a folder is named as such", "[cli][hostile]") {
  Scratch s(kGroup, "streams");
  for (const char* out : {"/dev/stdout", "/dev/stderr", "/proc/self/fd/1", "/dev/fd/2"}) {
    INFO(out);
    const Run r = run_troupe(std::string("simulate --quiet --dump ") + out, s);
    expect_user_error(r, {"leads to a stream a process has open", "(or --dump - to print the schedule)"});
    CHECK(r.err.find("rm ") == std::string::npos);
  }
  expect_user_error(run_troupe("simulate --quiet --trace /dev/stdout", s), {"leads to a stream a process has open"});
  CHECK(fs::exists("/dev/stdout"));
  fs::create_directories(s.path("folder"));
  fs::create_symlink(s.path("folder"), s.path("dirlink"));
  expect_user_error(run_troupe("simulate --quiet --trace '" + s.path("dirlink") + "'", s),
                    {"is a symbolic link to the folder", ("e.g. " + s.path("folder") + "/out.json").c_str()});
  CHECK(fs::is_empty(s.path("folder")));
}

TEST_CASE("a snapshot named for another step is told a name that is free", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "names");
  REQUIRE(run_troupe(tiny_train(s, "r", 1), s).rc == 0);
  const std::string snap = s.path("r/checkpoints/step-00000001");
  REQUIRE(fs::is_directory(snap));
  fs::create_directories(s.path("ck"));
  fs::copy(snap, s.path("ck/step-00000001"));
  fs::copy(snap, s.path("ck/step-00000030"));
  expect_user_error(run_troupe(tiny_train(s, "r2", 2, " --resume '" + s.path("ck/step-00000030") + "'"), s),
                    {"holds step 1, not the step its name says", "remove it: its right name is taken"});
  fs::remove_all(s.path("ck/step-00000001"));
  expect_user_error(run_troupe(tiny_train(s, "r2", 2, " --resume '" + s.path("ck/step-00000030") + "'"), s),
                    {"holds step 1, not the step its name says", "or name it step-00000001"});
  CHECK_FALSE(fs::exists(s.path("r2")));
}

TEST_CASE("advice for a run to calibrate from or to resume works when followed", "[cli][hostile][plan]") {
  Scratch s(kGroup, "advice");
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("new") + "'", s),
                    {"mkdir -p D && troupe train --config FILE --run-dir D --trace D/trace.json, then --calibrate D"});
  // a run's folder with no snapshot: no "continue that run"
  fs::create_directories(s.path("done"));
  s.write("done/config.toml", "[train]\nsteps = 1\n");
  s.write("done/metrics.jsonl", "{\"step\":1,\"loss\":5}\n");
  const Run r = run_troupe(tiny_train(s, "r", 1, " --set checkpoint.dir='" + s.path("done") + "'"), s);
  expect_user_error(r, {"is the run directory of another troupe run", "(that run left no snapshot to continue from)"});
  CHECK(r.err.find("--resume latest") == std::string::npos);
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("config values: an underflow is named as one, --set takes blanks around dots and names the 32-bit bound",
          "[cli][hostile][config]") {
  Scratch s(kGroup, "values");
  const std::string run = " --run-dir '" + s.path("r") + "'";
  const std::string tiny = s.write("lr.toml", "[optim]\nlr = 1e-400\n");
  expect_user_error(run_troupe("train --config '" + tiny + "'" + run, s),
                    {"optim.lr = 1e-400 (read as 0: it is below the smallest number a double holds"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'train . steps=-1'" + run, s),
                    {"train.steps = -1 must be >= 0"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2147483648" + run, s),
                    {"a 32-bit integer (at most 2147483647)"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("arguments are named as the help spells them, and simulate says which counts its config gave",
          "[cli][hostile]") {
  Scratch s(kGroup, "names2");
  const std::string ctl = "\"$(printf '/tmp/a\\001b')\"";  // (sh has no $'...')
  expect_user_error(run_troupe("export x " + ctl, s), {"the OUT argument of troupe export holds a control"});
  expect_user_error(run_troupe("export " + ctl + " x.st", s), {"the SNAPSHOT_DIR argument of troupe export"});
  expect_user_error(run_troupe("plot " + ctl, s), {"the RUN_DIR argument of troupe plot"});
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --tokens ' 5'", s),
                    {"a value with a blank at either end"});
  const std::string cfg = s.write("int.toml", "[parallel]\nschedule = \"interleaved\"\nchunks = 2\npp = 2\nmicrobatches = 3\n");
  expect_user_error(run_troupe("simulate --quiet --config '" + cfg + "'", s),
                    {"must be a multiple of 2 (got 3)",
                     ("(schedule, stages, microbatches, chunks from " + cfg + "'s [parallel]; the flags override them)").c_str()});
  CHECK(run_troupe("simulate --quiet --config '" + cfg + "' --microbatches 4", s).rc == 0);
}

TEST_CASE("refusals counted inside the log's window are said when the log ends", "[hostile][launch]") {
  std::ostringstream os;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(os);
  auto before = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("t", sink));
  {
    troupe::RateLimitedLog log(60);
    CHECK(log.warn("dropped a message"));
    CHECK_FALSE(log.warn("dropped a message"));
    CHECK_FALSE(log.warn("dropped a message"));
    CHECK(log.total() == 3);
  }  // (its end says the two not logged)
  spdlog::set_default_logger(before);
  const std::string out = os.str();
  INFO(out);
  CHECK(out.find("control plane: dropped a message\n") != std::string::npos);
  CHECK(out.find("control plane: 2 more like \"dropped a message\" in the last 0 s (3 in all)") != std::string::npos);
}
