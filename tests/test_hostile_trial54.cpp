// Hostile inputs, issue 14: trial 54's findings. Outputs replaced a run's .lock, so a second
// run got into a running one's folder (high); --run-dir was taken on a folder of data caches,
// which data.cache_dir then refused to every run (medium); TROUPE_FAULT_SIGNAL or _PHASE
// without the kill switches was ignored (low).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial54";
}  // namespace

TEST_CASE("lock files are no outputs, caches are no run directory, a lone fault signal is refused",
          "[cli][hostile]") {
  Scratch s(kGroup, "locks");
  REQUIRE(run_troupe(tiny_train(s, "run", 1), s).rc == 0);
  const std::string snap = s.path("run/checkpoints/step-00000001");
  REQUIRE(fs::exists(s.path("run/.lock")));
  const std::string lock = slurp(s.path("run/.lock"));
  for (const std::string& cmd : {"export '" + snap + "' '" + s.path("run/.lock") + "'",
                                 "simulate --dump '" + s.path("run/checkpoints/.lock") + "'",
                                 "generate '" + snap + "' --tokens 1 --logits-out '" + s.path("run/.lock") + "'"}) {
    const Run r = run_troupe(cmd, s);
    INFO(cmd << "\n" << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find("is a troupe lock file") != std::string::npos);
  }
  CHECK(slurp(s.path("run/.lock")) == lock);
  // the folder of data caches (and the folder above it) is no run directory
  for (const std::string& dir : {s.path("cache"), s.path("")}) {
    const Run r = run_troupe("train --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") +
                                 "' --run-dir '" + dir + "'",
                             s);
    INFO(dir << "\n" << r.err);
    CHECK(r.rc == 2);
    CHECK_FALSE(fs::exists(dir + "/config.toml"));
  }
  expect_user_error(run_troupe(tiny_train(s, "other", 1), s, 120, "TROUPE_FAULT_SIGNAL=abc"),
                    {"TROUPE_FAULT_SIGNAL is set without TROUPE_FAULT_KILL_RANK and TROUPE_FAULT_KILL_STEP"});
  CHECK_FALSE(fs::exists(s.path("other")));
}
