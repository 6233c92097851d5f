// Hostile inputs, issue 14's forty-first trial (a fresh reviewer's 111 cases, 15 failed): one
// failed accept() on the data plane crashed a process inside UCX and then every in-place
// recovery failed, or left a pipeline step waiting for train.timeout_s (F2); pipe2 refused
// (EMFILE) ended with "InterruptGuard: pipe2 failed" and exit 1 (F3); launch claimed it killed
// a process it could not signal, and waited for it (F4); a shard read error named no cause
// (F5); gnuplot off PATH was "not installed" (F6); a foreign lock holder was "another
// process" (RF7); a damaged snapshot skipped by --resume latest was not in train.log.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial41";

// "final val loss X" of a finished run's output, "" when there is none.
std::string final_val_loss(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("done: [0-9]+ steps, final val loss ([0-9.]+)")) ? m[1].str() : "";
}
}  // namespace

TEST_CASE("one failed accept() on the data plane: the job recovers with a fresh process, no step waits out its "
          "timeout",
          "[cli][hostile][launch][ucx]") {
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it): cannot inject a failing accept()");
    return;
  }
  Scratch s(kGroup, "accept");
  const std::string train = "train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=6 --set "
                            "train.timeout_s=60 --set fault.join_timeout_s=30";
  const Run clean = run_troupe(train + " --run-dir '" + s.path("clean") + "'", s);
  REQUIRE(clean.rc == 0);
  const std::string want = final_val_loss(clean.err);
  REQUIRE_FALSE(want.empty());
  // the first start of process `rank` fails its first accept() once (ECONNABORTED: a client
  // that reset before it was accepted); every later start runs plainly
  const std::string once = s.write("once.sh",
                                   "#!/bin/sh\n"
                                   "if [ \"$TROUPE_RANK\" = \"$ONCE_RANK\" ] && mkdir \"$ONCE_MARK\" 2>/dev/null; then\n"
                                   "  exec strace -f -qq -o /dev/null -e trace=accept4,accept -e "
                                   "inject=accept4,accept:error=ECONNABORTED:when=1 \"$@\"\n"
                                   "fi\nexec \"$@\"\n");
  fs::permissions(once, fs::perms::owner_all);
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int rank = attempt % 2;
    const std::string tag = std::to_string(attempt);
    const Run r = run_troupe("launch --nprocs 2 --grace 2 -- '" + once + "' '" + troupe_bin() + "' " + train +
                                 " --run-dir '" + s.path("run" + tag) + "'",
                             s, 150, "env ONCE_RANK=" + std::to_string(rank) + " ONCE_MARK='" + s.path("mark" + tag) + "'");
    INFO("attempt " << attempt << " (rank " << rank << "): " << r.err.substr(r.err.size() > 6000 ? r.err.size() - 6000 : 0));
    CHECK(r.rc == 0);
    CHECK(final_val_loss(r.err) == want);  // a recovered run gives the clean run's bits
    CHECK(r.err.find("waited 60 s") == std::string::npos);  // no step waited for train.timeout_s
    CHECK(r.err.find("check failed") == std::string::npos);
  }
}

TEST_CASE("no pipe for the stop signals (EMFILE) names the open-files limit", "[cli][hostile]") {
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it): cannot inject a failing pipe2()");
    return;
  }
  Scratch s(kGroup, "pipe2");
  const std::string inject = "strace -f -qq -o /dev/null -e trace=pipe2,pipe -e inject=pipe2,pipe:error=EMFILE";
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2 --run-dir '" + s.path("run") + "'",
                               s, 60, inject),
                    {"cannot open the pipe that takes the stop signals (Too many open files)", "ulimit -n"});
  CHECK_FALSE(fs::exists(s.path("run")));
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'", s,
                               60, inject),
                    {"Too many open files", "ulimit -n"});
  CHECK_FALSE(fs::exists(s.path("cache")));
}

TEST_CASE("launch says when it cannot kill a process after the grace period, and stops waiting for it",
          "[cli][hostile][launch]") {
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it): cannot inject a failing kill()");
    return;
  }
  Scratch s(kGroup, "killeperm");
  // process 0 fails; process 1 would sleep 40 s, and every kill() of the launcher fails
  const Run r = run_troupe("launch --nprocs 2 --grace 1 -- /bin/sh -c 'if [ $TROUPE_RANK = 0 ]; then exit 3; fi; exec "
                           "sleep 40'",
                           s, 30, "strace -f -qq -o /dev/null -e trace=kill -e inject=kill:error=EPERM");
  INFO(r.err);
  CHECK(r.rc == 3);  // not 124: the launcher did not wait for the sleeper
  CHECK(r.err.find("could not kill process 1") != std::string::npos);
  CHECK(r.err.find("Operation not permitted") != std::string::npos);
  CHECK(r.err.find("killed process 1") == std::string::npos);
}

TEST_CASE("a shard read error names its cause, gnuplot off PATH is named, skipped snapshots reach train.log",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "reads");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=3 --set "
                     "checkpoint.interval=1 --run-dir '" + s.path("base") + "'",
                     s).rc == 0);
  const std::string snap = s.path("base/checkpoints/step-00000003");
  if (have_strace())
    expect_user_error(run_troupe("generate '" + snap + "' --tokens 2", s, 60,
                                 "strace -f -qq -o /dev/null -P '" + snap + "/shard-dp0-pp0-tp0.bin' -e trace=read -e "
                                 "inject=read:error=EIO"),
                      {"cannot read", "completely (0 of", "Input/output error", "check the disk"});
  else
    WARN("read-error part skipped: strace is not installed (scripts/setup.sh installs it)");
  if (::access("/usr/bin/gnuplot", X_OK) == 0) {
    // (run_troupe's own timeout needs PATH: the empty PATH is the command's only)
    const int rc = shell_status("timeout 60 env PATH= '" + troupe_bin() + "' plot '" + s.path("base") + "' --out '" +
                                s.path("p.png") + "' 2> '" + s.path("plot.err") + "'");
    expect_user_error(Run{rc, slurp(s.path("plot.err"))},
                      {"gnuplot was not found on PATH (empty), but /usr/bin/gnuplot exists: add /usr/bin to PATH"});
    CHECK_FALSE(fs::exists(s.path("p.png")));
  } else
    WARN("gnuplot part skipped: gnuplot is not installed at /usr/bin (scripts/setup.sh installs it)");
  // a copy under a later step's name holds step 3: skipped, moved aside, and said in train.log
  fs::copy(snap, s.path("base/checkpoints/step-00000009"), fs::copy_options::recursive);
  const Run r = run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=4 --set "
                           "checkpoint.dir='" + s.path("base/checkpoints") + "' --resume latest --run-dir '" +
                           s.path("again") + "'",
                           s);
  REQUIRE(r.rc == 0);
  const std::string log = slurp(s.path("again/train.log"));
  CHECK(log.find("skipped damaged snapshot " + s.path("base/checkpoints/step-00000009")) != std::string::npos);
  CHECK(log.find("falling back to the newest valid snapshot: " + snap) != std::string::npos);
}
