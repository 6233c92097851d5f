// Hostile inputs, issue 14's thirty-ninth trial (a fresh reviewer's 118 cases, 23 failed):
// threads the system would not start crashed or hung (H1); a filesystem without file locks
// (ENOLCK) made train wait for itself forever (H2); leading zeros and 0x in command-line
// numbers were read as octal and hex (H3); an export stopped by a signal left its temporary
// file (H4); outputs were renamed into place unsynced (H5).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial39";

bool have_strace() { return shell_status("command -v strace > /dev/null 2>&1") == 0; }
}  // namespace

TEST_CASE("a filesystem without file locks is refused, not waited on", "[cli][hostile][data]") {
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it): cannot inject ENOLCK");
    return;
  }
  Scratch s(kGroup, "enolck");
  // flock(2) fails as on an NFS mount without lockd: the cache lock and the run directory's
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set data.cache_dir='" +
                               s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                           s, 120, "strace -f -qq -o /dev/null -e trace=flock -e inject=flock:error=ENOLCK");
  expect_user_error(r, {"(No locks available): the filesystem it lies on does not support file locks",
                        "on a local disk or a filesystem with locking"});
  CHECK_FALSE(fs::exists(s.path("cache")));  // no folder, no .lock left
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("command-line numbers are decimal: leading zeros and 0x are refused", "[cli][hostile]") {
  Scratch s(kGroup, "octal");
  expect_user_error(run_troupe("simulate --stages 010 --microbatches 16", s), {"'010' has a leading zero"});
  expect_user_error(run_troupe("simulate --stages 2 --microbatches 010", s), {"'010' has a leading zero"});
  expect_user_error(run_troupe("simulate --stages 0x2 --microbatches 4", s), {"'0x2' is not a decimal number"});
  expect_user_error(run_troupe("simulate --stages 2 --microbatches -01", s), {"leading zero"});
  expect_user_error(run_troupe("generate no-such-snapshot --tokens 010", s), {"--tokens", "'010' has a leading zero"});
  expect_user_error(run_troupe("generate no-such-snapshot --seed 0b1", s), {"--seed", "not a decimal number"});
  expect_user_error(run_troupe("generate no-such-snapshot --top-k 09", s), {"--top-k", "'09' has a leading zero"});
  const Run ok = run_troupe("simulate --stages 2 --microbatches 10 --quiet", s);
  INFO(ok.err);
  CHECK(ok.rc == 0);
}

TEST_CASE("a pids cgroup too small for the threads is refused up front", "[cli][hostile]") {
  const std::string cg = "/sys/fs/cgroup/pids/troupe-test-" + std::to_string(::getpid());
  std::error_code ec;
  if (!fs::create_directory(cg, ec)) {
    WARN("skipped: cannot make a cgroup v1 pids group here (" << ec.message() << ")");
    return;
  }
  std::ofstream(cg + "/pids.max") << "6\n";
  Scratch s(kGroup, "cgroup");
  const std::string in_cg = "sh -c 'echo $$ > " + cg + "/cgroup.procs; exec \"$0\" \"$@\"'";
  const Run train = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set data.cache_dir='" +
                                   s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                               s, 60, in_cg);
  const Run prep = run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'", s, 60,
                              in_cg);
  fs::remove(cg, ec);
  expect_user_error(train, {"cgroup lets only", "lower train.threads"});
  expect_user_error(prep, {"cgroup lets only", "lower data.threads"});
  CHECK_FALSE(fs::exists(s.path("run")));
  CHECK_FALSE(fs::exists(s.path("cache")));
}
