// Hostile inputs, issue 14's fortieth trial (a fresh reviewer's 80 cases, 11 failed, 0 high):
// a hand-set TROUPE_LAUNCH_ERRDIR silenced later errors (F1); a checkpoint listing that failed
// read as an empty folder (F2); a prepare refused a thread left its cache folder (F3); hex
// floats on the command line (F4); an open-files limit blamed on the port (F5); --top-k's
// range unsaid (F6).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial40";
}  // namespace

TEST_CASE("a hand-set TROUPE_LAUNCH_ERRDIR silences no error", "[cli][hostile][launch]") {
  Scratch s(kGroup, "errdir");
  fs::create_directories(s.path("ed"));
  // its launcher file names an ancestor that is no troupe launch (the test's own shell)
  const std::string env = "env TROUPE_LAUNCH_ERRDIR='" + s.path("ed") + "'";
  std::ofstream(s.path("ed/launcher")) << ::getpid() << "\n";
  for (int i = 0; i < 2; ++i)
    expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=abc", s, 60, env),
                      {"must be an integer, got 'abc'"});
}

TEST_CASE("no-decimal numbers, the top-k range and hex floats are named", "[cli][hostile]") {
  Scratch s(kGroup, "hexfloat");
  expect_user_error(run_troupe("generate no-such-snapshot --temperature 0x1p-1", s), {"'0x1p-1' is not a decimal number"});
  expect_user_error(run_troupe("plan --config configs/gpt3-175b.toml --tokens 0x10", s), {"'0x10' is not a decimal number"});
  expect_user_error(run_troupe("launch --nprocs 1 --grace 0x5 -- /bin/true", s), {"--grace '0x5' is not a number"});
  expect_user_error(run_troupe("generate no-such-snapshot --top-k 2147483648", s), {"from 0 to 2147483647"});
}

TEST_CASE("failing listings, refused threads in prepare and no sockets are named", "[cli][hostile]") {
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it): cannot inject failing system calls");
    return;
  }
  Scratch s(kGroup, "inject");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=1 --set "
                     "train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("base") + "'",
                     s).rc == 0);
  // getdents64 failing (EIO): not "it holds no snapshot"
  expect_user_error(run_troupe("train --config '" + s.path("base/config.toml") + "' --set train.steps=3 --set "
                                   "checkpoint.dir='" + s.path("base/checkpoints") + "' --resume latest --run-dir '" +
                                   s.path("t7") + "'",
                               s, 60, "strace -f -qq -o /dev/null -e trace=getdents64 -e inject=getdents64:error=EIO"),
                    {"cannot list the checkpoint folder", "Input/output error"});
  CHECK_FALSE(fs::exists(s.path("t7")));
  // prepare refused every thread: no cache folder holding only .made
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c1c") + "'", s, 60,
                               "strace -f -qq -o /dev/null -e trace=clone,clone3 -e "
                               "inject=clone,clone3:error=EAGAIN:when=2+"),
                    {"cannot start another thread"});
  CHECK_FALSE(fs::exists(s.path("c1c")));
  // launch with no socket left (EMFILE): the open-files limit, not --coordinator
  expect_user_error(run_troupe("launch --nprocs 2 --grace 2 -- /bin/true", s, 60,
                               "strace -f -qq -o /dev/null -e trace=socket -e inject=socket:error=EMFILE"),
                    {"cannot open a socket", "ulimit -n"});
}

TEST_CASE("a data-cache lock held past data.lock_timeout_s ends the wait and names the holder", "[cli][hostile][data]") {
  if (shell_status("command -v flock > /dev/null 2>&1") != 0) {
    WARN("skipped: flock(1) is not installed (util-linux)");
    return;
  }
  Scratch s(kGroup, "locktimeout");
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'", s).rc == 0);
  std::string key;
  for (const auto& e : fs::directory_iterator(s.path("cache"))) key = e.path().filename().string();
  REQUIRE_FALSE(key.empty());
  fs::remove_all(s.path("cache/" + key));
  fs::create_directories(s.path("cache/" + key));
  // a foreign holder (not troupe) keeps the lock for 8 s
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set data.lock_timeout_s=2 --set "
                           "data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                           s, 60, "{ flock '" + s.path("cache/" + key + "/.lock") + "' sleep 8 & } ; sleep 0.5;");
  expect_user_error(r, {"waited 2 s (data.lock_timeout_s) for process ", "(flock)", ", not troupe, preparing", "raise data.lock_timeout_s"});
  CHECK_FALSE(fs::exists(s.path("run")));
  expect_user_error(run_troupe("train --config configs/tiny.toml --set data.lock_timeout_s=0", s),
                    {"data.lock_timeout_s = 0"});
}

TEST_CASE("a whole number past 2^53 for a real-valued key keeps its size", "[cli][hostile][config]") {
  Scratch s(kGroup, "bigreal");
  // toml++ turned 9007199254740993 into 1e-312 for a double: weight decay silently nothing
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=0 --set "
                               "optim.weight_decay=9007199254740993 --run-dir '" + s.path("run") + "'",
                               s),
                    {"optim.weight_decay = 9007199254740992"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set data.lock_timeout_s=9223372036854775807", s),
                    {"data.lock_timeout_s = 9223372036854775808"});
  CHECK_FALSE(fs::exists(s.path("run")));
}
