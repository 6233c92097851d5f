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

TEST_CASE("an export stopped by a signal leaves no temporary file, and outputs are synced", "[cli][hostile]") {
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it): cannot slow the writes");
    return;
  }
  Scratch s(kGroup, "exportstop");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=2 --set "
                     "train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                     s).rc == 0);
  const std::string snap = s.path("run/checkpoints/step-00000002"), out = s.path("m.safetensors");
  // every write(2) slowed by 0.3 s: the temporary file lives long enough to be stopped in
  const int rc = shell_status(
      "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && (strace -f -qq -o /dev/null -e trace=write -e "
      "inject=write:delay_enter=300000 '" + troupe_bin() + "' export '" + snap + "' '" + out + "' 2> '" +
      s.path("err") + "' & sp=$!; for i in $(seq 1 200); do ls '" + out + "'.tmp-* > /dev/null 2>&1 && break; "
      "sleep 0.05; done; kill -TERM $(pgrep -f \"^" + troupe_bin() + " export " + snap + "\"); wait $sp; echo $? > '" +
      s.path("rc") + "')");
  REQUIRE(rc == 0);
  INFO(slurp(s.path("err")));
  CHECK(slurp(s.path("rc")).substr(0, 1) == "2");
  CHECK(slurp(s.path("err")).find("stopped by SIGTERM; nothing was left half-written") != std::string::npos);
  for (const auto& e : fs::directory_iterator(s.path("")))
    CHECK(e.path().filename().string().find("m.safetensors") == std::string::npos);  // no OUT, no OUT.tmp-PID
  // a whole export is flushed to disk before it is renamed into place
  REQUIRE(shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && strace -f -qq -e trace=fsync -o '" +
                       s.path("trace") + "' '" + troupe_bin() + "' export '" + snap + "' '" + out + "' 2> /dev/null") == 0);
  CHECK(slurp(s.path("trace")).find("fsync(") != std::string::npos);
  CHECK(fs::exists(out));
}

TEST_CASE("generate under troupe launch and a deleted current folder name their causes", "[cli][hostile]") {
  Scratch s(kGroup, "causes");
  expect_user_error(run_troupe("launch --nprocs 2 --grace 2 -- '" + troupe_bin() + "' generate no-such-snapshot", s, 60),
                    {"troupe generate runs in one process, not under troupe launch"});
  fs::create_directories(s.path("gone"));
  const int rc = shell_status("cd '" + s.path("gone") + "' && rmdir '" + s.path("gone") + "' && '" + troupe_bin() +
                              "' train --config '" + std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml' --run-dir '" +
                              s.path("run") + "' 2> '" + s.path("err") + "'");
  CHECK(rc == 2);
  CHECK(slurp(s.path("err")).find("the current folder was deleted") != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("threads the system refuses end train and generate with a sentence, not an abort", "[cli][hostile]") {
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it): cannot inject EAGAIN into clone");
    return;
  }
  Scratch s(kGroup, "clone");
  const std::string inject = "strace -f -qq -o /dev/null -e trace=clone,clone3 -e inject=clone,clone3:error=EAGAIN:when=3+";
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=2 --set "
                     "train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("base") + "'",
                     s).rc == 0);
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set data.cache_dir='" +
                                   s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                               s, 60, inject),
                    {"cannot start another thread", "ulimit -u", "pids.max"});
  CHECK_FALSE(fs::exists(s.path("run")));  // nothing of the run is left
  expect_user_error(run_troupe("generate '" + s.path("base/checkpoints/step-00000002") + "' --tokens 3", s, 60, inject),
                    {"cannot start another thread"});
}
