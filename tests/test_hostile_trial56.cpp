// Hostile inputs, issue 14: trial 56's findings. A refused --resume latest ("nothing left to
// train") had already moved a damaged newer snapshot aside (medium); --cost took 0x16 and let
// 1e-400 become 0; the README's bound on timeouts left out data.lock_timeout_s; a --run-dir in
// a loop of links was told to create the folder it points to; a folder of snapshots given as
// --run-dir got a probe file before its refusal.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial56";
}  // namespace

TEST_CASE("a refused resume changes nothing in the folder of snapshots", "[cli][hostile]") {
  Scratch s(kGroup, "resume");
  REQUIRE(run_troupe(tiny_train(s, "run", 2), s).rc == 0);
  const std::string newest = s.path("run/checkpoints/step-00000002");
  for (const auto& e : fs::directory_iterator(newest))
    if (e.path().filename().string().rfind("shard-", 0) == 0) fs::resize_file(e.path(), 10);
  // step 1 is intact and train.steps = 1: nothing left to train, and step 2 stays where it is
  expect_user_error(run_troupe(tiny_train(s, "run", 1, " --resume latest"), s),
                    {"is at step 1 and train.steps = 1: nothing left to train"});
  CHECK(fs::exists(newest + "/manifest.capnp"));
  CHECK_FALSE(fs::exists(newest + ".unreadable"));
  // a folder of snapshots as --run-dir: refused before any file is made in it
  const auto before = fs::last_write_time(s.path("run/checkpoints"));
  expect_user_error(run_troupe(tiny_train(s, "run/checkpoints", 3), s), {"it is a folder of snapshots"});
  CHECK(fs::last_write_time(s.path("run/checkpoints")) == before);
  // a --run-dir in a loop of links: remove it, not "create the folder it points to"
  fs::create_symlink(s.path("l2"), s.path("l1"));
  fs::create_symlink(s.path("l1"), s.path("l2"));
  const Run r = run_troupe(tiny_train(s, "l1", 1), s);
  expect_user_error(r, {"in a loop of links", "remove it (rm "});
  CHECK(r.err.find("create the folder it points to") == std::string::npos);
}

TEST_CASE("simulate takes decimal costs only, and none that underflows to 0", "[cli][hostile]") {
  Scratch s(kGroup, "cost");
  expect_user_error(run_troupe("simulate --quiet --cost f=0x10", s), {"0x numbers are not taken here"});
  expect_user_error(run_troupe("simulate --quiet --cost b=0x1p3", s), {"0x numbers are not taken here"});
  expect_user_error(run_troupe("simulate --quiet --cost f=1e-400", s), {"too small for a double"});
  CHECK(run_troupe("simulate --quiet --cost f=1e-320,b=2", s).rc == 0);  // a subnormal is a number
  CHECK(run_troupe("simulate --quiet --cost f=1.5e0,b=2", s).rc == 0);
  // the README states data.lock_timeout_s's own bound
  CHECK(slurp(std::string(TROUPE_SOURCE_DIR) + "/README.md").find("`data.lock_timeout_s` at most a year") !=
        std::string::npos);
}
