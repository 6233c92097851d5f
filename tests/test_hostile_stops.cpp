// Hostile inputs, issue 14's tenth trial (review 14j M1, M5, L3, L4, L6): how a job says it
// stops. A process whose coordinator has nothing listening is told to start process 0;
// troupe launch backs off a process that dies at start and says in one line when it gives
// up; a stop signal is acknowledged at once, and a second one names what is lost; a stop
// during the recovery from a lost process, fault.policy = abort and fault.max_restarts name
// the snapshot to continue from.
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-stops";  // the scratch folders' group

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The numbers in `path`, one a line.
std::vector<double> numbers_in(const std::string& path) {
  std::vector<double> out;
  std::istringstream is(slurp(path));
  for (double v; is >> v;) out.push_back(v);
  return out;
}
}  // namespace

TEST_CASE("launch: a process that dies at start is started again after a doubling back-off, and the launcher says "
          "when it gives up",
          "[cli][hostile][launch]") {
  Scratch s(kGroup, "backoff");
  // each start notes its time, then dies by SIGKILL; the launcher is stopped once the seventh
  // respawn waits its 3.2 s
  const std::string starts = s.path("starts");
  const Run r = run_and_signal(
      s, "launch --nprocs 1 -- /bin/sh -c 'date +%s.%N >> \"$0\"; kill -9 $$' '" + starts + "'",
      "\\(respawn 7\\)", "kill -TERM $p");
  INFO(r.err);
  CHECK(r.err.find("killed by signal SIGKILL; starting it again (respawn 1)") != std::string::npos);
  CHECK(r.err.find("starting it again in 0.1 s (respawn 2)") != std::string::npos);
  CHECK(r.err.find("starting it again in 0.2 s (respawn 3)") != std::string::npos);
  CHECK(r.err.find("starting it again in 0.4 s (respawn 4)") != std::string::npos);
  CHECK(r.err.find("starting it again in 0.8 s (respawn 5)") != std::string::npos);
  CHECK(r.err.find("starting it again in 1.6 s (respawn 6)") != std::string::npos);
  CHECK(r.err.find("starting it again in 3.2 s (respawn 7)") != std::string::npos);
  // the stop came during the wait: that process is not started again, and its status is the job's
  CHECK(r.err.find("launch: process 0 is not started again: the job is being stopped (SIGTERM)") != std::string::npos);
  CHECK(r.rc == 137);
  const std::vector<double> t = numbers_in(starts);
  REQUIRE(t.size() == 7);
  CHECK(t[2] - t[1] >= 0.1);  // the waits are at least the back-off (never less, however loaded)
  CHECK(t[3] - t[2] >= 0.2);
  CHECK(t[4] - t[3] >= 0.4);
  CHECK(t[5] - t[4] >= 0.8);
  CHECK(t[6] - t[5] >= 1.6);

  // --respawn job: the job's starts back off too; without back-off, the limit is said in one line
  const Run j = run_troupe("launch --nprocs 2 --respawn job --respawn-backoff 0 --grace 5 -- /bin/sh -c 'exit 75'", s, 60);
  INFO(j.err);
  CHECK(j.rc == 75);
  CHECK(count_of(j.err, "starting all processes again (restart ") == 100);
  const auto lines = error_lines(j.err);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "error: troupe launch gives up: the job failed again (exit status 75) after 100 restarts, its "
                    "limit; find out why it fails (the output above), then start the job again (troupe train: "
                    "--resume latest)");
  CHECK(j.err.rfind("error: ") > j.err.rfind("launch: process"));  // the last word

  const Run bad = run_troupe("launch --nprocs 1 --respawn-backoff -1 -- true", s);
  expect_user_error(bad, {"--respawn-backoff '-1' is not a number of seconds from 0 to 3600"});
}

namespace {
// Shell words: SIGKILL to process 1 of the launcher $p's job (its child with TROUPE_RANK=1).
const std::string kKillRank1 =
    "for c in $(pgrep -P $p); do tr '\\0' '\\n' < /proc/$c/environ 2>/dev/null | grep -qx TROUPE_RANK=1 && "
    "kill -KILL $c; done";

// troupe launch of a two-process tiny job (pipeline of 2) that saves every 3 steps into
// <scratch>/run, with `extra` arguments for train; `wrap` (shell words) may run before train.
std::string two_process_job(const Scratch& s, const std::string& extra, const std::string& wrap = "") {
  return "launch --nprocs 2 -- " + wrap + " '" + troupe_bin() +
         "' train --config configs/tiny.toml --set parallel.pp=2 --set train.steps=100000 --set train.sample_tokens=0 "
         "--set checkpoint.interval=3 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") +
         "' " + extra;
}

// The one error line of `r` (checked: exactly one).
std::string the_error_line(const Run& r) {
  const auto lines = error_lines(r.err);
  REQUIRE(lines.size() == 1);
  return lines[0];
}
}  // namespace

TEST_CASE("a process whose TROUPE_COORDINATOR has nothing listening is told to start process 0, not that a server "
          "there is foreign",
          "[cli][hostile][multiprocess]") {
  Scratch s(kGroup, "nolisten");
  const std::string port = std::to_string(quiet_port(3));
  const Run r = run_troupe("train --config configs/tiny.toml --set parallel.pp=2 --set train.steps=2 --set "
                           "fault.join_timeout_s=2 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                               s.path("run") + "'",
                           s, 120,
                           "env TROUPE_JOB_SECRET=0123456789abcdef0123 TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 "
                           "TROUPE_COORDINATOR=127.0.0.1:" + port);
  INFO(r.err);
  CHECK(r.rc == 2);
  const std::string line = the_error_line(r);
  CHECK(line == "error: [process 1] nothing answered at 127.0.0.1:" + port +
                    " within fault.join_timeout_s = 2 s (connection refused): start process 0 (troupe launch does) "
                    "or check TROUPE_COORDINATOR");
  CHECK(line.find("not a troupe coordinator") == std::string::npos);
}

TEST_CASE("a stop signal while a launched job recovers from a lost process names the newest snapshot, not 'nothing "
          "was trained'",
          "[cli][hostile][multiprocess]") {
  Scratch s(kGroup, "recoverstop");
  // process 1 is killed after the snapshot of step 3; started again it never joins (a sleep),
  // so process 0 waits in the recovery's join when the launcher is stopped
  const Run r = run_and_signal(
      s,
      two_process_job(s, "", "/bin/sh -c 'if [ \"$TROUPE_RANK\" = 1 ] && [ \"$TROUPE_RESTART_COUNT\" != 0 ]; then exec "
                             "sleep 120; fi; exec \"$0\" \"$@\"'"),
      "snapshot of step 3 written",
      kKillRank1 + "; for i in $(seq 1 600); do grep -q 'recovering in place' '" + s.path("err") +
          "' && break; sleep 0.1; done; kill -TERM $p");
  INFO(r.err);
  CHECK(r.rc != 0);
  const std::string line = the_error_line(r);
  CHECK(line.find("[process 0] stopped by signal 15 (SIGTERM) while the processes joined again to recover from a "
                  "lost process (restart 1 of at most 3): the job stopped during the recovery; the newest snapshot on "
                  "disk is " + s.path("run") + "/checkpoints/step-0000000") != std::string::npos);
  CHECK(line.find("continue with --resume latest") != std::string::npos);
  CHECK(r.err.find("nothing was trained") == std::string::npos);
  CHECK(fs::exists(s.path("run") + "/metrics.jsonl"));  // what was trained stays
}

TEST_CASE("fault.policy = abort and a job past fault.max_restarts name the newest snapshot, and nothing says the job "
          "goes on",
          "[cli][hostile][multiprocess]") {
  Scratch s(kGroup, "faultstop");
  SECTION("abort") {
    const Run r = run_and_signal(s, two_process_job(s, "--set fault.policy=abort"), "snapshot of step 3 written",
                                 kKillRank1);
    INFO(r.err);
    CHECK(r.rc == 137);  // the lost process's status
    const std::string line = the_error_line(r);
    // (what the lost process made fail may follow, in parentheses, on the same line)
    CHECK(line.find("(fault.policy = abort: the job stops)") != std::string::npos);
    CHECK(line.find(". The newest snapshot on disk is " + s.path("run") + "/checkpoints/step-0000000") !=
          std::string::npos);
    CHECK(r.err.find("\n(then") == std::string::npos);  // the error is one line
    CHECK(line.find("continue with --resume latest") != std::string::npos);
  }
  SECTION("past fault.max_restarts") {
    const Run r = run_and_signal(s, two_process_job(s, "--set fault.max_restarts=0"), "snapshot of step 3 written",
                                 kKillRank1);
    INFO(r.err);
    CHECK(r.rc == 1);
    const std::string line = the_error_line(r);
    CHECK(line.find("more than fault.max_restarts = 0") != std::string::npos);
    CHECK(line.find("continue with --resume latest") != std::string::npos);
    CHECK(r.err.find("continues") == std::string::npos);  // no line says the job goes on
    CHECK(r.err.find("more than fault.max_restarts = 0: it stops)") != std::string::npos);  // process 0's log line
    CHECK(r.err.find("\nthe job failed") == std::string::npos);  // the error is one line
  }
}

TEST_CASE("a stop signal is acknowledged at once, and a second one that ends the run names the steps lost and the "
          "newest snapshot",
          "[cli][hostile][signals]") {
  Scratch s(kGroup, "twostops");
  // steps of about 2 s: the first SIGTERM comes after step 1 is saved; once it is
  // acknowledged the run is suspended (so the step under way cannot end), the second
  // SIGTERM comes more than a second later, and the run is continued
  const std::string ack = "stopping after step [0-9]+, the step under way, and saving a snapshot \\(send it again, a "
                          "second or more from now, to stop at once\\)";
  const Run r = run_and_signal(
      s,
      "train --config configs/tiny.toml --set train.steps=1000 --set train.sample_tokens=0 --set train.batch_size=512 "
      "--set parallel.microbatches=128 --set checkpoint.interval=1 --set data.cache_dir='" + s.path("cache") +
          "' --run-dir '" + s.path("run") + "'",
      "snapshot of step 1 written",
      "kill -TERM $p; for i in $(seq 1 600); do grep -qE '" + ack + "' '" + s.path("err") +
          "' && break; sleep 0.1; done; kill -STOP $p; sleep 1.2; kill -TERM $p; kill -CONT $p");
  INFO(r.err);
  CHECK(r.rc == 128 + 15);
  CHECK(r.err.find("signal 15 (SIGTERM): stopping after step ") != std::string::npos);
  const std::string line = the_error_line(r);
  CHECK(line.find("error: stopped at once by a second signal 15 (SIGTERM) at step ") == 0);
  CHECK(line.find(" lost (in no snapshot); the newest snapshot on disk is " + s.path("run") +
                  "/checkpoints/step-0000000") != std::string::npos);
  CHECK(line.find("continue with --resume latest") != std::string::npos);
  for (auto& e : fs::directory_iterator(s.path("run") + "/checkpoints"))  // the save under way left nothing
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}
