// Hostile inputs, issue 14's forty-second trial (a fresh reviewer's 126 cases, 10 failed): a
// .lock symbolic link in the data cache was written through (its target got troupe's pid);
// plot waited without a deadline for a gnuplot that hangs, and called a failing one's exit
// "an empty picture"; the last words of a job past fault.max_restarts named no cause; a dead
// flock(1) pid was named as the lock holder; 1e400 was "not a number"; a TOML array given to
// a string key (data.special_tokens=["<a>"]) was taken as the string ["<a>"].
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial42";

// The one cache folder name a tiny run prepares under `cache_dir` (prepared there first).
std::string tiny_cache_key(const Scratch& s, const std::string& cache_dir) {
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + cache_dir + "'", s).rc == 0);
  std::string key;
  for (const auto& e : fs::directory_iterator(cache_dir)) key = e.path().filename().string();
  REQUIRE_FALSE(key.empty());
  fs::remove_all(cache_dir + "/" + key);
  return key;
}
}  // namespace

TEST_CASE("symbolic links among a data cache's own files are refused, never written through", "[cli][hostile][data]") {
  Scratch s(kGroup, "cachelink");
  const std::string key = tiny_cache_key(s, s.path("probe"));
  const std::string victim = s.write("victim", "precious\n");
  for (const char* name : {".lock", ".made"}) {
    const std::string cache = s.path(std::string("c") + name);
    fs::create_directories(cache + "/" + key);
    fs::create_symlink(victim, cache + "/" + key + "/" + name);
    const Run r = run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + cache + "'", s);
    INFO(name << ": " << r.err);
    if (std::string(name) == ".lock") {
      expect_user_error(r, {"/.lock' is a symbolic link (to '", "does not write through a link", "rm '"});
    } else {
      CHECK(r.rc == 0);  // .made is troupe's own record: the link is replaced or removed, not followed
    }
    CHECK(slurp(victim) == "precious\n");
  }
}

TEST_CASE("plot gives gnuplot a deadline and names how a failing one ended", "[cli][hostile]") {
  Scratch s(kGroup, "gnuplot");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --run-dir '" +
                         s.path("run") + "'",
                     s).rc == 0);
  fs::create_directories(s.path("hang"));
  fs::create_directories(s.path("fail"));
  // a gnuplot that hangs, with a child that would outlive it; one that fails without a word
  s.write("hang/gnuplot", "#!/bin/sh\n(sleep 3; touch '" + s.path("outlived") + "') &\nsleep 100\n");
  s.write("fail/gnuplot", "#!/bin/sh\nexit 7\n");
  fs::permissions(s.path("hang/gnuplot"), fs::perms::owner_all);
  fs::permissions(s.path("fail/gnuplot"), fs::perms::owner_all);
  const std::string plot = "plot '" + s.path("run") + "' --out '" + s.path("f.png") + "'";
  const auto t0 = std::chrono::steady_clock::now();
  expect_user_error(run_troupe(plot, s, 60, "env TROUPE_GNUPLOT_TIMEOUT_S=2 PATH='" + s.path("hang") + ":/usr/bin:/bin'"),
                    {"hang/gnuplot did not finish drawing", "within 2 s and was stopped"});
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));  // a deadline, not gnuplot's 100 s
  std::this_thread::sleep_for(std::chrono::seconds(4));
  CHECK_FALSE(fs::exists(s.path("outlived")));  // its whole process group was stopped
  CHECK_FALSE(fs::exists(s.path("f.png")));
  expect_user_error(run_troupe(plot, s, 60, "env PATH='" + s.path("fail") + ":/usr/bin:/bin'"),
                    {"fail/gnuplot exited with status 7 without a word"});
  expect_user_error(run_troupe(plot, s, 60, "env TROUPE_GNUPLOT_TIMEOUT_S=0x5"),
                    {"TROUPE_GNUPLOT_TIMEOUT_S='0x5' is not a number of seconds from 1 to 86400"});
}

TEST_CASE("a job past fault.max_restarts names the last loss, a dead flock pid is not the holder, huge reals and "
          "TOML arrays for string keys are refused",
          "[cli][hostile][config]") {
  Scratch s(kGroup, "words");
  // a process started again past the limit (by hand here: troupe launch sets these)
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=2 --run-dir '" + s.path("run") + "'", s, 60,
                           "env TROUPE_WORLD_SIZE=2 TROUPE_RANK=1 TROUPE_COORDINATOR=127.0.0.1:9 "
                           "TROUPE_JOB_SECRET=0123456789abcdef0123 TROUPE_RESTART_COUNT=5 TROUPE_FAILURE_TIME=1 "
                           "TROUPE_LOST_AS='process 1 (pid 7) killed by signal SIGABRT'");
  CHECK(r.rc == 1);
  CHECK(r.err.find("more than fault.max_restarts = 3 (the last: process 1 (pid 7) killed by signal SIGABRT; the lines "
                   "above say why)") != std::string::npos);
  CHECK(r.err.find("checkpoint.interval = 0") != std::string::npos);
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.lr=1e400", s),
                    {"optim.lr' (from --set) = 1e400 is beyond the largest number a double holds"});
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set 'data.special_tokens=[\"<a>\"]' --set "
                               "data.cache_dir='" + s.path("st") + "'",
                               s),
                    {"data.special_tokens' (from --set) must be a string"});
  CHECK_FALSE(fs::exists(s.path("st")));
  if (shell_status("command -v flock > /dev/null 2>&1") != 0) {
    WARN("lock part skipped: flock(1) is not installed (util-linux)");
    return;
  }
  const std::string key = tiny_cache_key(s, s.path("cache"));
  fs::create_directories(s.path("cache/" + key));
  // flock(1) takes the lock and exits; its child `sleep` holds it on
  const Run w = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set data.lock_timeout_s=2 --set "
                           "data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run2") + "'",
                           s, 60,
                           "{ flock '" + s.path("cache/" + key + "/.lock") + "' sleep 8 & } ; sleep 0.3; kill $! ; "
                           "sleep 0.3;");
  expect_user_error(w, {"waited 2 s (data.lock_timeout_s) for process ", "(sleep), not troupe, preparing"});
}
