// Hostile inputs, issue 14's forty-third trial (a fresh reviewer's 163 cases, 11 failed): a
// gnuplot that left a child holding troupe's stdout kept a pipe reader waiting past the
// deadline (F1); one that exited 0 without a picture was blamed on free space (F2); a run
// directory locked by a process that is not troupe was "in use by another troupe run" (F3);
// a --set value opening a TOML array but not valid TOML was taken as a string (F4); the
// example for data.special_tokens was "" (F5); a failed write to stdout named no errno (F8);
// gnuplot outlived a SIGKILLed plot (F9).
#include <catch2/catch.hpp>

#include <signal.h>
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
const char* const kGroup = "hostile-trial43";

// Whether process `pid` is gone or a zombie (killed, waiting to be reaped).
bool ended(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  return text.empty() || (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z');
}
}  // namespace

TEST_CASE("a gnuplot that draws nothing, leaves a child behind or outlives plot is named and ended",
          "[cli][hostile]") {
  Scratch s(kGroup, "gnuplot");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --run-dir '" +
                         s.path("run") + "'",
                     s).rc == 0);
  for (const char* d : {"leaves", "hangs"}) fs::create_directories(s.path(d));
  // exits 0 at once without a picture, leaving a child of another session that holds its stdout
  s.write("leaves/gnuplot", "#!/bin/sh\n(setsid sleep 30 &)\nexit 0\n");
  s.write("hangs/gnuplot", "#!/bin/sh\necho $$ > '" + s.path("gnuplot.pid") + "'\nexec sleep 60\n");
  for (const char* d : {"leaves", "hangs"}) fs::permissions(s.path(std::string(d) + "/gnuplot"), fs::perms::owner_all);
  const std::string plot = "plot '" + s.path("run") + "' --out '" + s.path("f.png") + "'";
  const auto t0 = std::chrono::steady_clock::now();
  // through a pipe, as a script reading troupe's output would: the reader must not wait for the child
  const int rc = shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && PATH='" + s.path("leaves") +
                              ":/usr/bin:/bin' timeout 60 '" + troupe_bin() + "' " + plot + " 2> '" + s.path("err") +
                              "' | cat > /dev/null");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (void)rc;
  INFO(slurp(s.path("err")));
  CHECK(took < 20);  // not the child's 30 s
  CHECK(slurp(s.path("err")).find("leaves/gnuplot exited 0 but drew nothing into") != std::string::npos);
  // SIGKILL to plot while gnuplot runs: gnuplot dies with it (its parent-death signal)
  REQUIRE(shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && { PATH='" + s.path("hangs") + ":/usr/bin:/bin' '" +
                       troupe_bin() + "' " + plot + " 2> /dev/null & p=$!; for i in $(seq 1 100); do [ -s '" +
                       s.path("gnuplot.pid") + "' ] && break; sleep 0.1; done; kill -KILL $p; wait $p; } ; true") == 0);
  const long gp = std::atol(slurp(s.path("gnuplot.pid")).c_str());
  REQUIRE(gp > 0);
  for (int i = 0; i < 50 && !ended(gp); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(ended(gp));
  if (!ended(gp)) ::kill((pid_t)gp, SIGKILL);
}

TEST_CASE("a foreign lock on a run directory, a broken TOML array and a failed stdout write are named",
          "[cli][hostile]") {
  Scratch s(kGroup, "words");
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set 'data.special_tokens=[\"\\ud800\"]' --set "
                               "data.cache_dir='" + s.path("st") + "'",
                               s),
                    {"data.special_tokens=[\"\\ud800\"] is not valid TOML", "quote a string"});
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set 'data.special_tokens=[\"<a>\"]' --set "
                               "data.cache_dir='" + s.path("st") + "'",
                               s),
                    {"e.g. data.special_tokens = \"<|user|>,<|bot|>\""});
  CHECK_FALSE(fs::exists(s.path("st")));
  if (shell_status("command -v flock > /dev/null 2>&1") == 0) {
    fs::create_directories(s.path("rd"));
    std::ofstream(s.path("rd/.lock")).close();
    const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --run-dir '" + s.path("rd") + "'", s,
                             60, "{ flock '" + s.path("rd/.lock") + "' sleep 6 & } ; sleep 0.3;");
    expect_user_error(r, {"is locked by process ", "(flock)", "not troupe", "(kill "});
  } else {
    WARN("lock part skipped: flock(1) is not installed (util-linux)");
  }
  if (!have_strace()) {
    WARN("stdout part skipped: strace is not installed (scripts/setup.sh installs it)");
    return;
  }
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --set "
                     "checkpoint.interval=2 --run-dir '" + s.path("run") + "'",
                     s).rc == 0);
  expect_user_error(run_troupe("generate '" + s.path("run/checkpoints/step-00000002") + "' --tokens 5", s, 60,
                               "strace -f -qq -o /dev/null -e trace=write -e inject=write:error=EIO:when=1"),
                    {"cannot write to standard output (Input/output error", "check the disk"});
}
