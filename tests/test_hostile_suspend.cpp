// Hostile inputs, issue 14's ninth trial (review 14i): a run suspended (SIGSTOP, Ctrl-Z)
// longer than its deadlines and continued, SIGQUIT and SIGPWR as stop signals, a stop
// signal across troupe's own re-exec, a resume under an address-space limit between the
// old memory estimate and the real need, and no .tmp snapshot folder after a stop that
// ends the process at once.
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cli_helpers.h"
#include "core/awake_clock.h"

namespace fs = std::filesystem;

namespace {
using troupe::test::Run;
using troupe::test::run_troupe;
using troupe::test::shell_status;
using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("hostile-suspend", name) {}
};

// Starts troupe `args` in the background, waits (30 s at most) until its stderr matches the
// grep -E pattern `ready`, runs the shell words `then` ($p: troupe's pid) and waits for it
// (a watchdog kills it after 150 s). Returns the exit status; stderr is in <scratch>/err.
int run_and_then(const Scratch& s, const std::string& args, const std::string& ready, const std::string& then,
                 const std::string& prefix = "") {
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && " + prefix + " '" + troupe_bin() + "' " +
                          args + " 2> '" +
                          s.path("err") + "' > /dev/null & p=$!; (sleep 150; kill -KILL $p) > /dev/null 2>&1 & w=$!; " +
                          "for i in $(seq 1 300); do grep -qE '" + ready + "' '" + s.path("err") +
                          "' 2>/dev/null && break; sleep 0.1; done; " + then + "; wait $p; rc=$?; kill $w 2>/dev/null; " +
                          "exit $rc";
  return shell_status(cmd);
}
bool has_snapshot(const std::string& ckpt) {
  std::error_code ec;
  if (!fs::is_directory(ckpt, ec)) return false;
  for (auto& e : fs::directory_iterator(ckpt, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0 && fs::exists(e.path() / "manifest.capnp")) return true;
  return false;
}
int tmp_folders(const std::string& ckpt) {
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt, ec), end; !ec && it != end; it.increment(ec))
    n += it->path().filename().string().find(".tmp-") != std::string::npos;
  return n;
}
}  // namespace

TEST_CASE("AwakeClock runs with steady_clock while this process runs", "[hostile][clock]") {
  const auto a0 = troupe::AwakeClock::now();
  const auto s0 = std::chrono::steady_clock::now();
  ::usleep(300 * 1000);
  const double awake = std::chrono::duration<double>(troupe::AwakeClock::now() - a0).count();
  const double steady = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
  // a peer that hangs while this process runs still meets its deadline: no time is lost
  CHECK(awake > 0.29);
  CHECK(awake <= steady + 1e-3);
  CHECK(troupe::AwakeClock::in(2.0) > troupe::AwakeClock::now() + std::chrono::milliseconds(1900));
}

TEST_CASE("a run stopped (SIGSTOP) longer than train.timeout_s and continued finishes every step", "[cli][hostile]") {
  Scratch s("stopcont");
  const std::string run = s.path("run");
  // train.timeout_s = 2: the coordinator's deadline is 3.5 s; the stop lasts 5 s
  const int rc = run_and_then(s,
                              "train --config configs/tiny.toml --set train.steps=30 --set train.timeout_s=2 "
                              "--set train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                                  run + "'",
                              "step +3/", "kill -STOP $p; sleep 5; kill -CONT $p");
  const std::string err = slurp(s.path("err"));
  INFO(err);
  CHECK(rc == 0);
  CHECK(err.find("30/30") != std::string::npos);
  CHECK(err.find("did not come") == std::string::npos);
  CHECK(err.find("none came") == std::string::npos);
}

TEST_CASE("SIGQUIT and SIGPWR stop training with a snapshot and exit 0", "[cli][hostile]") {
  Scratch s("quitpwr");
  for (const char* sig : {"QUIT", "PWR"}) {
    INFO(sig);
    const std::string run = s.path(std::string("run-") + sig);
    const int rc = run_and_then(s,
                                "train --config configs/tiny.toml --set train.steps=100000 --set train.sample_tokens=0 "
                                "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + run + "'",
                                "step +2/", std::string("kill -") + sig + " $p",
                                // sh starts a background job with SIGQUIT ignored, and troupe leaves a
                                // signal ignored on entry as it is (core/interrupt.h left_ignored)
                                "env --default-signal=QUIT");
    const std::string err = slurp(s.path("err"));
    INFO(err);
    CHECK(rc == 0);
    CHECK(err.find("stopping after step") != std::string::npos);
    CHECK(has_snapshot(run + "/checkpoints"));
    CHECK(tmp_folders(run + "/checkpoints") == 0);
  }
}

TEST_CASE("a stop signal pending across troupe's re-exec gets the sentence, not the default action", "[cli][hostile]") {
  Scratch s("reexec");
  // what bound_openmp_spinning's exec looks like from inside: the stop signals blocked, one
  // pending, TROUPE_STOP_SIGNALS_HELD set; the new image's .preinit_array takes it
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) +
                          "' && python3 -c 'import os, signal, sys; "
                          "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
                          "os.kill(os.getpid(), signal.SIGTERM); "
                          "env = dict(os.environ, TROUPE_STOP_SIGNALS_HELD=\"1\", GOMP_SPINCOUNT=\"1000\"); "
                          "os.execve(sys.argv[1], [sys.argv[1], \"plan\", \"--help\"], env)' '" +
                          troupe_bin() + "' 2> '" + s.path("err") + "' > /dev/null";
  const int rc = shell_status(cmd);
  const std::string err = slurp(s.path("err"));
  INFO(err);
  CHECK(rc == 2);
  CHECK(err.find("error: stopped by SIGTERM") != std::string::npos);
}

TEST_CASE("a resume is refused up front when the address-space limit cannot hold the model and the loaded snapshot",
          "[cli][hostile]") {
  Scratch s("resumemem");
  const std::string common = "--config configs/tiny.toml --set model.n_embd=512 --set model.n_layer=8 "
                             "--set model.n_head=8 --set train.batch_size=4 --set train.sample_tokens=0 "
                             "--set train.eval_batches=1 --set data.cache_dir='" + s.path("cache") + "'";
  Run r = run_troupe("train " + common + " --set train.steps=1 --set checkpoint.interval=1 --run-dir '" +
                         s.path("a") + "'", s, 300);
  REQUIRE(r.rc == 0);
  const std::string snap = s.path("a") + "/checkpoints/step-00000001";
  REQUIRE(fs::exists(snap + "/manifest.capnp"));
  // the fresh run's estimate: 25.3M parameters x 20 B + activations + 1 GiB; a resume also
  // holds the snapshot's state and the optimizers' copies of the moments, 20 B a parameter:
  // about 480 MiB more. A limit between the two is refused at once.
  const std::string fresh = run_troupe("train " + common + " --set train.steps=2 --run-dir '" + s.path("probe") + "'",
                                       s, 120, "ulimit -v 1100000;").err;
  INFO(fresh);
  const size_t at = fresh.find("needs about ");
  REQUIRE(at != std::string::npos);
  const long fresh_mib = std::atol(fresh.c_str() + at + 12);
  REQUIRE(fresh_mib > 1100);
  const long limit_kib = (fresh_mib + 100) * 1024;  // above the fresh estimate, below the resume's
  r = run_troupe("train " + common + " --set train.steps=2 --run-dir '" + s.path("b") + "' --resume '" + snap + "'",
                 s, 120, "ulimit -v " + std::to_string(limit_kib) + ";");
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("resuming this training job") != std::string::npos);
  CHECK(r.err.find("ulimit -v") != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("b")));
}

TEST_CASE("a stop by SIGXCPU (ulimit -t) while a snapshot is being written leaves no .tmp folder", "[cli][hostile]") {
  Scratch s("xcpu");
  for (int i = 0; i < 3; ++i) {
    const std::string run = s.path("run" + std::to_string(i));
    // a snapshot after every step, each a few MB: the limit often strikes while one is written
    const Run r = run_troupe("train --config configs/tiny.toml --set model.n_embd=256 --set model.n_layer=4 "
                             "--set model.n_head=4 --set train.steps=100000 --set checkpoint.interval=1 "
                             "--set checkpoint.keep_last=2 --set train.sample_tokens=0 --set data.cache_dir='" +
                                 s.path("cache") + "' --run-dir '" + run + "'",
                             s, 120, "ulimit -t 3;");  // soft and hard alike: no room to save, it ends at once
    INFO(r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find("stopped at once by signal 24 (SIGXCPU)") != std::string::npos);
    CHECK(tmp_folders(run + "/checkpoints") == 0);
  }
}
