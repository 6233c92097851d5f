// Hostile inputs, fourth part (issue 14's seventh trial): the stop signals beyond SIGINT and
// SIGTERM, a stop signal sent to a process other than 0 of a launched job, a coordinator
// host that does not resolve, a busy --coordinator port, paths the filesystem refuses, a
// CPU GEMM switch naming a GPU library, memory limits named, and a tokenizer trained on a
// corpus without spaces.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using troupe::test::expect_user_error;
using troupe::test::Run;
using troupe::test::run_troupe;
using troupe::test::shell_status;
using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("hostile-signals", name) {}
};

// Starts troupe `troupe_args` in the background (from the source dir, after the shell words
// `prefix`, e.g. "nohup"), waits until the file `watch` (default: its stderr) matches `ready`
// (a grep -E pattern), runs `signal_cmd` (shell words; $p is troupe's pid: no `timeout` in
// between, which would take the signal itself), and writes the exit status to
// <scratch>/rc, stderr to <scratch>/err and stdout to <scratch>/out. A watchdog kills troupe
// after 150 s.
void signal_when(const Scratch& s, const std::string& troupe_args, const std::string& ready,
                 const std::string& signal_cmd, const std::string& prefix = "", std::string watch = "") {
  if (watch.empty()) watch = s.path("err");
  // the previous call's files go first: the loop below could otherwise find its "ready" line
  // before the new process's redirection empties the file, and signal the new one at start
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && rm -f '" + s.path("rc") + "' '" +
                          s.path("err") + "' '" + s.path("out") + "' '" + watch + "'; " + prefix +
                          " '" + troupe_bin() + "' " + troupe_args + " 2> '" + s.path("err") + "' > '" + s.path("out") +
                          "' & p=$!; (sleep 150; kill -KILL $p) > /dev/null 2>&1 & w=$!; for i in $(seq 1 900); do " +
                          "grep -qE '" + ready + "' '" + watch + "' 2>/dev/null && break; sleep 0.1; done; " + signal_cmd +
                          "; wait $p; echo $? > '" + s.path("rc") + "'; kill $w 2>/dev/null";
  shell_status(cmd);
}
int rc_of(const Scratch& s) { return std::atoi(slurp(s.path("rc")).c_str()); }
bool has_snapshot(const std::string& ckpt) {
  std::error_code ec;
  if (!fs::is_directory(ckpt, ec)) return false;
  for (auto& e : fs::directory_iterator(ckpt, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0 && fs::exists(e.path() / "manifest.capnp")) return true;
  return false;
}
}  // namespace

TEST_CASE("SIGUSR2, SIGALRM and SIGHUP stop training with a snapshot, and end other commands with a sentence",
          "[cli][hostile]") {
  Scratch s("more");
  const std::string cache = " --set data.cache_dir='" + s.path("cache") + "'";
  for (const char* sig : {"ALRM", "USR2", "HUP"}) {
    INFO(sig);
    const std::string run = s.path(std::string("run-") + sig);
    signal_when(s, "train --config configs/tiny.toml --set train.steps=100000 --set train.sample_tokens=0" + cache +
                       " --run-dir '" + run + "'",
                "step +2/", std::string("kill -") + sig + " $p");
    const std::string err = slurp(s.path("err"));
    INFO(err);
    CHECK(rc_of(s) == 0);
    CHECK(err.find("stopping after step") != std::string::npos);
    // the log's line names the signal, as the README says (trial 58, F4)
    CHECK(slurp(run + "/train.log").find(std::string("(SIG") + sig + "): stopping after step") != std::string::npos);
    CHECK(has_snapshot(run + "/checkpoints"));
    bool tmp = false;
    for (auto& e : fs::directory_iterator(run + "/checkpoints"))
      tmp = tmp || e.path().filename().string().find(".tmp") != std::string::npos;
    CHECK_FALSE(tmp);
  }
  // a command without a step to save (generate): one sentence naming the signal, exit 2
  signal_when(s, "generate '" + s.path("run-ALRM/checkpoints") + "/'$(ls '" + s.path("run-ALRM/checkpoints") +
                     "' | grep -v tmp | tail -1) --tokens 100000 --prompt a",
              ".", "kill -USR2 $p", "", s.path("out"));
  {
    const std::string err = slurp(s.path("err"));
    INFO(err);
    CHECK(rc_of(s) == 2);
    CHECK(err.find("error: stopped by SIGUSR2") != std::string::npos);
  }
  // nohup's SIGHUP stays ignored: the run goes on and finishes (libucs takes SIGHUP at load,
  // over nohup's SIG_IGN, for its debug switch, unless UCX_DEBUG_SIGNO=0: docs/signals)
  signal_when(s, "train --config configs/tiny.toml --set train.steps=30 --set train.sample_tokens=0" + cache +
                     " --run-dir '" + s.path("run-nohup") + "'",
              "step +2/", "kill -HUP $p", "env UCX_DEBUG_SIGNO=0 nohup");
  const std::string err = slurp(s.path("err"));
  INFO(err);
  CHECK(rc_of(s) == 0);
  CHECK(err.find("stopping after step") == std::string::npos);
  CHECK(err.find("30/30") != std::string::npos);
}

TEST_CASE("SIGTERM to a process other than 0 of a launched job stops the whole job with a snapshot", "[cli][hostile][multiprocess]") {
  Scratch s("follower");
  const std::string run = s.path("run");
  // process 1's pid: the launcher's child whose environment says TROUPE_RANK=1
  const std::string find_rank1 =
      "for c in $(pgrep -P $p); do for w in $(pgrep -P $c) $c; do tr '\\0' '\\n' < /proc/$w/environ 2>/dev/null | "
      "grep -qx TROUPE_RANK=1 && r1=$w; done; done; echo \"rank1=$r1\" >&2; kill -TERM $r1";
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && timeout -k 5 150 '" + troupe_bin() +
                          "' launch --nprocs 2 -- '" + troupe_bin() +
                          "' train --config configs/tiny.toml --set parallel.pp=2 --set train.steps=100000 "
                          "--set train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" + run +
                          "' 2> '" + s.path("err") + "' > /dev/null & p=$!; for i in $(seq 1 900); do grep -qE "
                          "'step +3/' '" + s.path("err") + "' && break; sleep 0.1; done; " + find_rank1 +
                          " 2>> '" + s.path("err") + "'; wait $p; echo $? > '" + s.path("rc") + "'";
  shell_status(cmd);
  const std::string err = slurp(s.path("err"));
  INFO(err);
  CHECK(rc_of(s) == 0);
  CHECK(err.find("asked process 0 to stop the job") != std::string::npos);
  CHECK(err.find("stopping after step") != std::string::npos);
  CHECK(has_snapshot(run + "/checkpoints"));
  std::ifstream metrics(run + "/metrics.jsonl");
  bool stopped = false;
  for (std::string line; std::getline(metrics, line);) stopped = stopped || line.find("\"stopped_by_signal\":true") != std::string::npos;
  CHECK(stopped);  // the summary says the job was stopped, not finished
}

TEST_CASE("the seventh trial's classes: an unresolvable coordinator, a busy --coordinator port, paths the filesystem "
          "refuses, TROUPE_GEMM=cublas, ulimit -d, a corpus without spaces",
          "[cli][hostile]") {
  Scratch s("seventh");
  const std::string cache = " --set data.cache_dir='" + s.path("cache") + "'";
  {  // a host name that does not resolve: refused at once, not after fault.join_timeout_s
    const auto t0 = std::chrono::steady_clock::now();
    expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache, s, 100,
                                 "env TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=nosuchhost.invalid:29500 "
                                 "TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef"),
                      {"nosuchhost.invalid", "does not resolve"});
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
  }
  {  // a --coordinator port something listens on: one sentence from the launcher, no process started
    const std::string cmd = "python3 -c \"import socket,time,sys;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();"
                            "open(sys.argv[1],'w').write(str(s.getsockname()[1]));time.sleep(60)\" '" +
                            s.path("port") + "' & for i in $(seq 1 50); do [ -s '" + s.path("port") +
                            "' ] && break; sleep 0.1; done";
    shell_status(cmd);
    const std::string port = slurp(s.path("port"));
    REQUIRE_FALSE(port.empty());
    expect_user_error(run_troupe("launch --nprocs 2 --coordinator 127.0.0.1:" + port + " -- '" + troupe_bin() +
                                     "' train --config configs/tiny.toml --set parallel.pp=2 --set train.steps=1" + cache,
                                 s, 60),
                      {"port is in use", port.c_str()});
    shell_status("pkill -f \"" + s.path("port") + "\" || true");
  }
  // the process limit (ulimit -u) counts every thread of the user: 8 processes of 16 compute
  // threads each do not fit in 256 (libgomp failed mid-start, exit 1, no sentence); refused
  // before the join by any process (root is not held to the limit: run as nobody)
  if (shell_status("command -v setpriv > /dev/null") == 0) {
    const Run r = run_troupe("train --config configs/tiny.toml --set parallel.pp=2 --set parallel.dp=4 --set "
                             "train.threads=16 --set data.cache_dir='" + s.path("nobody-cache") + "'",
                             s, 60,
                             "prlimit --nproc=256:256 setpriv --reuid=65534 --regid=65534 --clear-groups env TROUPE_RANK=1 "
                             "TROUPE_WORLD_SIZE=8 TROUPE_LOCAL_WORLD_SIZE=8 TROUPE_COORDINATOR=127.0.0.1:9 "
                             "TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef");
    if (r.err.find("setpriv:") == std::string::npos) expect_user_error(r, {"ulimit -u", "train.threads"});
    // a privileged --coordinator port for a user who may not bind it: that is the cause named
    const Run p = run_troupe("launch --nprocs 2 --coordinator 127.0.0.1:80 -- true", s, 60,
                             "setpriv --reuid=65534 --regid=65534 --clear-groups");
    if (p.err.find("setpriv:") == std::string::npos)
      expect_user_error(p, {"127.0.0.1:80", "ports below 1024 need privileges", "from 1024 to 65535"});
  }
  // a checkpoint.dir with a name longer than 255 bytes, and one through a loop of symbolic links
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache + " --set checkpoint.dir='" +
                                   s.path(std::string(300, 'x')) + "' --run-dir '" + s.path("r1") + "'",
                               s, 60),
                    {"checkpoint.dir"});
  fs::create_symlink(s.path("loopB"), s.path("loopA"));
  fs::create_symlink(s.path("loopA"), s.path("loopB"));
  {
    const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache + " --set checkpoint.dir='" +
                                 s.path("loopA/ck") + "' --run-dir '" + s.path("r2") + "'",
                             s, 60);
    expect_user_error(r, {"loopA"});
    CHECK(r.err.find("filesystem_error") == std::string::npos);
    CHECK(fs::is_symlink(s.path("loopA")));
  }
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache + " --resume '" +
                                   s.path(std::string(300, 'z')) + "' --run-dir '" + s.path("r3") + "'",
                               s, 60),
                    {"--resume"});
  // a snapshot to generate from
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 --set "
                     "train.sample_tokens=0" + cache + " --run-dir '" + s.path("run") + "'",
                     s)
              .rc == 0);
  const std::string snap = s.path("run/checkpoints/step-00000001");
  // the CPU GEMM switch naming a GPU library: refused before the model loads
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 3", s, 60, "env TROUPE_GEMM=cublas"),
                    {"TROUPE_GEMM=cublas", "CPU"});
  // a data-segment limit under 1 GiB (thread stacks count against it: a detached actor's
  // thread failed to start and the exit then hung) is refused at once, naming it
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 3", s, 60, "ulimit -d 120000;"), {"ulimit -d"});
  {  // a corpus without a single space (base64 lines): troupe accepts the tokenizer it trains on it
    std::mt19937 rng(7);
    const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string text;
    for (int line = 0; line < 3000; ++line) {
      for (int i = 0; i < 76; ++i) text += b64[rng() % 64];
      text += line % 10 == 9 ? "\n\n" : "\n";
    }
    s.write("b64.txt", text);
    const Run r = run_troupe("prepare --config configs/tiny.toml --set data.corpus='" + s.path("b64.txt") +
                                 "' --set data.cache_dir='" + s.path("cache-b64") + "' --set model.vocab_size=512",
                             s, 300);
    INFO(r.err);
    CHECK(r.rc == 0);
  }
}

TEST_CASE("train.device: a value other than cpu or cuda is refused, and cuda is refused with the reason", "[cli][hostile]") {
  Scratch s("device");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.device=gpu", s, 60), {"train.device", "cpu"});
  // no GPU: the CUDA runtime's answer; a GPU: the workers do not run on one yet; a build without CUDA: says so
  const Run r = run_troupe("train --config configs/tiny.toml --set train.device=cuda --run-dir '" + s.path("run") + "'", s, 60);
  expect_user_error(r, {"train.device = \"cuda\"", "train.device = \"cpu\""});
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("the eighth trial's classes: a report onto the config, retention through a linked snapshot, a closed pipe, "
          "ulimit -f, a resume under a memory limit",
          "[cli][hostile]") {
  Scratch s("eighth");
  const std::string cache = " --set data.cache_dir='" + s.path("cache") + "'";
  {  // prepare --report naming its own config: refused, the config intact
    fs::copy_file(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml", s.path("cfg.toml"));
    const std::string before = slurp(s.path("cfg.toml"));
    expect_user_error(run_troupe("prepare --config '" + s.path("cfg.toml") + "' --report '" + s.path("cfg.toml") + "'" + cache, s, 120),
                      {"--report", "destroy"});
    CHECK(slurp(s.path("cfg.toml")) == before);
  }
  // a run with two snapshots, one of them linked into another checkpoint.dir
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=4 --set checkpoint.interval=2 --set "
                     "train.sample_tokens=0" + cache + " --run-dir '" + s.path("a") + "'",
                     s)
              .rc == 0);
  fs::create_directories(s.path("b"));
  fs::create_symlink(s.path("a/checkpoints/step-00000002"), s.path("b/step-00000002"));
  {  // retention never deletes through the link: the linked snapshot stays whole
    const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=6 --set checkpoint.interval=2 --set "
                             "checkpoint.keep_last=1 --set train.sample_tokens=0 --set checkpoint.dir='" + s.path("b") +
                                 "'" + cache + " --resume latest --run-dir '" + s.path("rb") + "'",
                             s);
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(fs::exists(s.path("a/checkpoints/step-00000002/manifest.capnp")));
  }
  {  // a closed pipe on stderr (train 2>&1 | head): the run goes on to its end, exit 0
    shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && '" + troupe_bin() +
                 "' train --config configs/tiny.toml --set train.steps=30 --set train.sample_tokens=0" + cache +
                 " --run-dir '" + s.path("pipe") + "' 2>&1 | head -2 > /dev/null");
    CHECK(slurp(s.path("pipe/metrics.jsonl")).find("\"steps\":30,\"summary\":true") != std::string::npos);
  }
  // export onto the run's own corpus (named in the snapshot's config) or metrics: refused, both intact
  {
    const std::string corpus = slurp(std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt");
    expect_user_error(run_troupe("export '" + s.path("a/checkpoints/step-00000004") + "' tests/data/tiny_corpus.txt", s, 60),
                      {"destroy"});
    CHECK(slurp(std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt") == corpus);
    expect_user_error(run_troupe("export '" + s.path("a/checkpoints/step-00000004") + "' '" + s.path("a/metrics.jsonl") + "'", s, 60),
                      {"destroy"});
  }
  {  // a process of a launched job refuses (exit 2) while process 0 waits for it to join: the
     // launcher stops process 0 at once (SIGTERM), not after the grace period, and no run
     // directory stays
    const auto t0 = std::chrono::steady_clock::now();
    const Run r = run_troupe("launch --nprocs 2 --grace 60 -- /bin/sh -c 'if [ \"$TROUPE_RANK\" = 1 ]; then exit 2; fi; "
                             "exec \"$0\" \"$@\"' '" + troupe_bin() + "' train --config configs/tiny.toml --set "
                             "parallel.pp=2 --set train.steps=2" + cache + " --run-dir '" + s.path("js") + "'",
                             s, 120);
    INFO(r.err);
    CHECK(r.rc == 2);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
    CHECK(r.err.find("stopping the other processes") != std::string::npos);
    CHECK_FALSE(fs::exists(s.path("js")));
  }
  // the file-size limit under one snapshot shard: refused before the run
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=1" + cache +
                                   " --run-dir '" + s.path("fs") + "'",
                               s, 60, "ulimit -f 100;"),
                    {"ulimit -f"});
  CHECK_FALSE(fs::exists(s.path("fs")));
  // a resume under an address-space limit too small for the job: refused like a fresh run (exit 2, the limit named)
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=6 --set model.n_layer=24 --set "
                               "model.n_embd=1024 --set model.n_head=16" + cache + " --resume '" +
                                   s.path("a/checkpoints/step-00000004") + "' --run-dir '" + s.path("rv") + "'",
                               s, 60, "ulimit -v 1500000;"),
                    {"ulimit -v"});
}

TEST_CASE("checkpoint.dir inside the data cache is refused before anything is written", "[cli][hostile]") {
  Scratch s("ckcache");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set data.cache_dir='" + s.path("cache") +
                               "' --set checkpoint.dir='" + s.path("cache/ck") + "' --run-dir '" + s.path("run") + "'",
                           s, 60);
  expect_user_error(r, {"checkpoint.dir", "inside"});
  CHECK_FALSE(fs::exists(s.path("run")));
  CHECK_FALSE(fs::exists(s.path("cache/ck")));
}

TEST_CASE("a second process claiming a rank that is held is refused, and the job goes on to its end", "[cli][hostile][multiprocess]") {
  Scratch s("duprank");
  // a free port for the coordinator
  const std::string port = std::to_string(29000 + (::getpid() % 900));
  const std::string env = "export TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef TROUPE_WORLD_SIZE=2 "
                          "TROUPE_COORDINATOR=127.0.0.1:" + port + "; ";
  const std::string tr = "'" + troupe_bin() + "' train --config configs/tiny.toml --set train.steps=3 --set parallel.pp=2 "
                         "--set train.sample_tokens=0 --set fault.join_timeout_s=30 --set data.cache_dir='" +
                         s.path("cache") + "'";
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && " + env + "TROUPE_RANK=0 timeout 120 " + tr +
                          " --run-dir '" + s.path("r0") + "' 2> '" + s.path("e0") + "' > /dev/null & A=$!; sleep 2; " +
                          "TROUPE_RANK=1 timeout 120 " + tr + " --run-dir '" + s.path("r1") + "' 2> '" + s.path("e1") +
                          "' > /dev/null & B=$!; TROUPE_RANK=1 timeout 120 " + tr + " --run-dir '" + s.path("r2") +
                          "' 2> '" + s.path("e2") + "' > /dev/null & C=$!; wait $A; echo $? > '" + s.path("rc0") +
                          "'; wait $B; b=$?; wait $C; c=$?; echo $b $c > '" + s.path("rc12") + "'";
  shell_status(cmd);
  INFO(slurp(s.path("e0")) << "\n--\n" << slurp(s.path("e1")) << "\n--\n" << slurp(s.path("e2")));
  CHECK(std::atoi(slurp(s.path("rc0")).c_str()) == 0);  // the job finished
  const std::string rc12 = slurp(s.path("rc12"));
  CHECK((rc12 == "0 2\n" || rc12 == "2 0\n"));  // one rank 1 trained, the other was refused
  CHECK((slurp(s.path("e1")) + slurp(s.path("e2"))).find("is already held by") != std::string::npos);
}
