// Hostile inputs, issue 14's forty-fourth trial (a fresh reviewer's 185 cases, 9 failed, none
// high): gnuplot's stderr was a file in /tmp without a size cap (N4); a SIGKILLed plot's
// temporary folder stayed forever (N2), and a refused pipe left it too (N3); a --set value
// with broken quotes was taken with its quotes (N5); a lock held by flock(1) and its command
// named one of them (N6); only unfinished step-<k>.tmp-<pid> folders were "step-<k> folders
// lacking a manifest" (N7); generate on a run directory called it an interrupted save (N8).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial44";

// The troupe-gnuplot-* folders in `tmp` (the runs' TMPDIR) now.
std::vector<std::string> draw_folders(const std::string& tmp) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(tmp, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("troupe-gnuplot-", 0) == 0) out.push_back(it->path().string());
  return out;
}
}  // namespace

TEST_CASE("gnuplot's messages are capped, its folder goes even after SIGKILL or a refused pipe", "[cli][hostile]") {
  Scratch s(kGroup, "gnuplot");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --set "
                     "checkpoint.interval=2 --run-dir '" + s.path("run") + "'",
                     s).rc == 0);
  for (const char* d : {"chatty", "hangs"}) fs::create_directories(s.path(d));
  s.write("chatty/gnuplot", "#!/bin/sh\nyes 'a line of gnuplot complaint' >&2\n");
  s.write("hangs/gnuplot", "#!/bin/sh\necho $$ > '" + s.path("gnuplot.pid") + "'\nexec sleep 60\n");
  for (const char* d : {"chatty", "hangs"}) fs::permissions(s.path(std::string(d) + "/gnuplot"), fs::perms::owner_all);
  // (a TMPDIR of its own: other tests draw at the same time)
  const std::string tmp = s.path("tmp");
  fs::create_directories(tmp);
  const std::string plot = "plot '" + s.path("run") + "' --out '" + s.path("f.png") + "'";
  // writes without end: stopped at the deadline, nothing of it on disk
  expect_user_error(run_troupe(plot, s, 60, "env TMPDIR='" + tmp + "' TROUPE_GNUPLOT_TIMEOUT_S=2 PATH='" + s.path("chatty") + ":/usr/bin:/bin'"),
                    {"chatty/gnuplot did not finish drawing"});
  CHECK(draw_folders(tmp).empty());
  // a plot killed while gnuplot runs leaves its folder; the next draw removes it
  REQUIRE(shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && { TMPDIR='" + tmp + "' PATH='" + s.path("hangs") + ":/usr/bin:/bin' '" +
                       troupe_bin() + "' " + plot + " 2> /dev/null & p=$!; for i in $(seq 1 100); do [ -s '" +
                       s.path("gnuplot.pid") + "' ] && break; sleep 0.1; done; kill -KILL $p; wait $p; } ; true") == 0);
  CHECK(draw_folders(tmp).size() == 1);
  const bool drew = run_troupe(plot, s, 120, "env TMPDIR='" + tmp + "'").rc == 0;
  REQUIRE((drew || shell_status("command -v gnuplot > /dev/null 2>&1") != 0));
  CHECK(draw_folders(tmp).empty());
  if (have_strace()) {  // no pipe for gnuplot's messages: named, and no folder left
    expect_user_error(run_troupe(plot, s, 60, "env TMPDIR='" + tmp + "' strace -f -qq -o /dev/null -e trace=pipe2 -e "
                                              "inject=pipe2:error=EMFILE:when=2"),
                      {"cannot open a pipe for gnuplot's messages (Too many open files)", "ulimit -n"});
    CHECK(draw_folders(tmp).empty());
  }
  // generate on the run directory: its newest snapshot is named
  expect_user_error(run_troupe("generate '" + s.path("run") + "' --tokens 2", s),
                    {"is a run directory, not a snapshot; pass one of its snapshots, e.g. ",
                     "checkpoints/step-00000002 (the newest)"});
}

TEST_CASE("broken quotes in --set, unfinished saves only, and every holder of a foreign lock are named",
          "[cli][hostile][config]") {
  Scratch s(kGroup, "words");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'data.special_tokens=\"unterminated'", s),
                    {"is not valid TOML", "close the quotes"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'data.corpus=\"a\\qb\"'", s),
                    {"unknown escape sequence", "use '...' for text with backslashes"});
  fs::create_directories(s.path("ck/step-00000020.tmp-999"));
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=30 --set checkpoint.dir='" +
                                   s.path("ck") + "' --resume latest --run-dir '" + s.path("r") + "'",
                               s),
                    {"only step-<k>.tmp-<pid> folders are there"});
  if (shell_status("command -v flock > /dev/null 2>&1") != 0) {
    WARN("lock part skipped: flock(1) is not installed (util-linux)");
    return;
  }
  fs::create_directories(s.path("rd"));
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --run-dir '" + s.path("rd") + "'", s, 60,
                           "{ : > '" + s.path("rd/.lock") + "'; flock '" + s.path("rd/.lock") +
                           "' sleep 6 & } ; sleep 0.3;");
  expect_user_error(r, {"(flock), process ", "(sleep), not troupe: they hold", "end them (kill "});
}
