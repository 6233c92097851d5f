// Hostile inputs, issue 14's twenty-fourth trial (a fresh reviewer's 178 cases): a second
// SIGTERM during a save emptied a snapshot through the writer's rename and left a
// half-deleted one (SG8); a run stopped by a changed token file pointed at --resume latest
// with no snapshot on disk (C04b); an unreadable peak cache folder stopped the run (U2/U4);
// and the lows: a run directory that is a link to nothing, whole numbers past 2^63 - 1,
// TROUPE_* variables a launch sets read unchecked.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"
#include "core/interrupt.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial24";
}  // namespace

TEST_CASE("a folder its writer claimed for the rename is left alone by a forced stop's cleanup", "[hostile][checkpoint]") {
  Scratch s(kGroup, "claim");
  const std::string a = s.path("step-00000003.tmp-1"), b = s.path("step-00000004.tmp-1");
  fs::create_directories(a);
  fs::create_directories(b);
  s.write("step-00000003.tmp-1/shard-dp0-pp0-tp0.bin", "x");
  s.write("step-00000004.tmp-1/shard-dp0-pp0-tp0.bin", "x");
  troupe::note_partial_dir(a);
  troupe::note_partial_dir(b);
  CHECK(troupe::claim_partial_dir(a));  // a's writer renames it now
  troupe::remove_partial_dirs();        // a second signal: b goes, a stays whole
  CHECK(fs::exists(a + "/shard-dp0-pp0-tp0.bin"));
  CHECK_FALSE(fs::exists(b));
  CHECK_FALSE(troupe::claim_partial_dir(b));  // its writer must not rename what the cleanup took
  troupe::forget_partial_dir(a);
  troupe::forget_partial_dir(b);
  CHECK_FALSE(troupe::partial_dirs_noted());
  CHECK(troupe::claim_partial_dir(s.path("not-noted")));
}

TEST_CASE("a half-deleted snapshot is removed at the start, named, and a link to nothing as --run-dir is named",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "half");
  fs::create_directories(s.path("ck/step-00000001"));
  s.write("ck/step-00000001/shard-dp0-pp0-tp0.bin", "half of a snapshot");
  const std::string run = "train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                          "--set train.eval_interval=0 --set train.eval_batches=1 --set data.cache_dir='" +
                          s.path("c") + "' --set checkpoint.dir='" + s.path("ck") + "'";
  Run r = run_troupe(run + " --run-dir '" + s.path("r1") + "'", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("a snapshot half-deleted (no manifest)") != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("ck/step-00000001")));
  fs::create_symlink(s.path("nowhere"), s.path("dangling"));
  expect_user_error(run_troupe(run + " --run-dir '" + s.path("dangling") + "'", s),
                    {"is a symbolic link to nothing", "or pass --run-dir with another folder"});
}

TEST_CASE("TROUPE_* variables a launch sets are checked, and whole numbers past 2^63 - 1 name the bound",
          "[cli][hostile]") {
  Scratch s(kGroup, "env");
  const std::string run = "train --config configs/tiny.toml --set train.steps=1 --set data.cache_dir='" + s.path("c") +
                          "' --run-dir '" + s.path("r") + "'";
  expect_user_error(run_troupe(run, s, 60, "env TROUPE_RESTART_COUNT=abc"), {"TROUPE_RESTART_COUNT='abc'"});
  expect_user_error(run_troupe(run, s, 60, "env TROUPE_RESPAWN=bogus"), {"TROUPE_RESPAWN='bogus' must be process or job"});
  expect_user_error(run_troupe(run, s, 60, "env TROUPE_FAILURE_TIME=xyz"), {"TROUPE_FAILURE_TIME='xyz'"});
  CHECK_FALSE(fs::exists(s.path("r")));
  expect_user_error(run_troupe("generate x --seed 18446744073709551615", s),
                    {"--seed", "at most 9223372036854775807"});
}

TEST_CASE("a peak cache folder this user cannot read is warned about, the run goes on", "[cli][hostile]") {
  Scratch s(kGroup, "peakperm");
  fs::create_directories(s.path("locked/x"));
  fs::permissions(s.path("locked"), fs::perms::owner_all);
  if (!nobody_can_run()) {
    SUCCEED("no user nobody who can run the binary here: nothing to check");
    return;
  }
  const Run r = run_troupe_as_nobody("plan --config configs/tiny.toml --set cluster.gpu=cpu", s, 60,
                                     "TROUPE_CACHE_DIR=" + s.path("locked/x"));
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("cannot write the peak cache") != std::string::npos);
}

TEST_CASE("TROUPE_EVENT_LOG on a full filesystem is warned about once, the run goes on", "[cli][hostile]") {
  Scratch s(kGroup, "evfull");
  const std::string mnt = s.path("mnt");
  const std::string body = "dd if=/dev/zero of='" + mnt + "/fill' bs=4k count=1000 2>/dev/null || true\n"
                           "if TROUPE_EVENT_LOG='" + mnt + "/ev.jsonl' '" + troupe_bin() + "' train --config configs/tiny.toml "
                           "--set train.steps=2 --set train.sample_tokens=0 --set data.cache_dir='" + s.path("c") +
                           "' --run-dir '" + s.path("run") + "' > /dev/null 2> '" + s.path("err") +
                           "'; then echo 0; else echo $?; fi > '" + s.path("rc") + "'";
  std::string why;
  if (!run_on_tmpfs(s, mnt, 1, body, &why)) {
    SUCCEED("no mount namespace here (" << why << "): nothing to check");
    return;
  }
  const std::string err = slurp(s.path("err"));
  INFO(slurp(s.path("tmpfs.log")) << err);
  CHECK(slurp(s.path("rc")) == "0\n");
  const size_t at = err.find("cannot write to TROUPE_EVENT_LOG");
  CHECK(at != std::string::npos);
  CHECK(err.find("cannot write to TROUPE_EVENT_LOG", at + 1) == std::string::npos);  // once
}
