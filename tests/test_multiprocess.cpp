// One job over several processes (issue 6), run as a user runs it: `troupe launch --nprocs
// N -- troupe train ...`. Every layout gives bitwise the one-process losses, validation
// loss and parameters (the step-3 snapshot's shard files, which hold values, fp32 masters
// and AdamW moments, are byte-identical); a killed process stops the whole job within the
// deadline naming it; mismatched configs or binaries and processes without the job secret
// are refused at join. Every run has a deadline (timeout) and leaves no process behind.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "multiprocess_helpers.h"

namespace fs = std::filesystem;
using namespace troupe::mptest;

TEST_CASE("layouts over 2 and 4 processes equal the one-process run bitwise", "[multiprocess]") {
  Scratch s("layouts");
  struct Case {
    std::string name, layout;
    std::vector<int> nprocs;
  };
  const std::vector<Case> cases = {
      {"pp2", "--set parallel.pp=2 --set parallel.tp=1 --set parallel.dp=1", {2}},
      // fp16 from a 2^32 loss scale: the first steps overflow, so inf norms cross processes
      {"pp2dp2-fp16", "--set parallel.pp=2 --set parallel.tp=1 --set parallel.dp=2 --set train.precision=fp16", {2}},
      // bf16: the activations and their gradients cross processes as 16-bit tensors
      {"pp2-bf16", "--set parallel.pp=2 --set parallel.tp=1 --set parallel.dp=1 --set train.precision=bf16", {2}},
      {"tp2", "--set parallel.pp=1 --set parallel.tp=2 --set parallel.dp=1", {2}},
      {"dp2", "--set parallel.pp=1 --set parallel.tp=1 --set parallel.dp=2", {2}},
      {"tp2pp2", "--set parallel.pp=2 --set parallel.tp=2 --set parallel.dp=1", {2, 4}},
      {"dp2pp2", "--set parallel.pp=2 --set parallel.tp=1 --set parallel.dp=2", {2, 4}},
      // whole pipeline columns per process: the DP groups (ZeRO-1) cross processes instead
      {"dp2pp2-ppfirst", "--set parallel.pp=2 --set parallel.tp=1 --set parallel.dp=2 --set parallel.placement=pp-first",
       {2}},
  };
  for (const auto& c : cases) {
    Run one = sh("'" + troupe_bin() + "' " + train_args(s, c.name + "-1", c.layout + " --set train.threads=2"), s,
                 c.name + "-1");
    {
      INFO(c.name << " in one process: " << errors_first(one.err));
      REQUIRE(one.rc == 0);
    }
    const Outcome ref = read_run(s.path(c.name + "-1"));
    REQUIRE(ref.losses.size() == 3);
    REQUIRE(!ref.shards.empty());
    for (int n : c.nprocs) {
      const std::string run = c.name + "-" + std::to_string(n) + "p";
      Run multi = sh("'" + troupe_bin() + "' launch --nprocs " + std::to_string(n) + " --grace 15 -- '" + troupe_bin() +
                         "' " + train_args(s, run, c.layout + " --set train.threads=1"),
                     s, run);
      INFO(c.name << " over " << n << " processes: " << errors_first(multi.err));
      REQUIRE(multi.rc == 0);
      CHECK(multi.err.find("all " + std::to_string(n) + " processes joined") != std::string::npos);
      check_same_run(read_run(s.path(run)), ref);
    }
  }
  CHECK(survivors(s) == 0);
}

TEST_CASE("a one-process snapshot resumes over 4 processes bitwise, and the result snapshots identically",
          "[multiprocess]") {
  Scratch s("resume");
  const std::string layout = "--set parallel.pp=2 --set parallel.dp=2 --set checkpoint.interval=1";
  // straight: 3 steps in one process, snapshots at 1, 2, 3
  Run straight = sh("'" + troupe_bin() + "' " + train_args(s, "straight", layout + " --set train.threads=2"), s, "straight");
  INFO(errors_first(straight.err));
  REQUIRE(straight.rc == 0);
  const Outcome ref = read_run(s.path("straight"));
  REQUIRE(ref.losses.size() == 3);
  // resumed: from the step-2 snapshot, spread over 4 processes (one worker each)
  const std::string snap = s.path("straight") + "/checkpoints/step-00000002";
  Run resumed = sh("'" + troupe_bin() + "' launch --nprocs 4 --grace 15 -- '" + troupe_bin() + "' " +
                       train_args(s, "resumed", layout + " --set train.threads=1") + " --resume '" + snap + "'",
                   s, "resumed");
  INFO(errors_first(resumed.err));
  REQUIRE(resumed.rc == 0);
  const Outcome got = read_run(s.path("resumed"));
  REQUIRE(got.losses.size() == 1);
  CHECK(got.losses[0] == ref.losses[2]);
  CHECK(got.val == ref.val);
  REQUIRE(got.shards.size() == ref.shards.size());
  for (auto& [name, bytes] : ref.shards) CHECK(got.shards.at(name) == bytes);
  CHECK(survivors(s) == 0);
}

TEST_CASE("a process killed mid-step stops every other process within the deadline, naming it", "[multiprocess]") {
  Scratch s("kill");
  // process 1 SIGKILLs itself when its worker starts step 3 (fault injection); fault.timeout_s 10
  const std::string cmd = "env TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=3 '" + troupe_bin() +
                          "' launch --nprocs 2 --grace 30 -- '" + troupe_bin() + "' " +
                          train_args(s, "run", "--set parallel.pp=2 --set train.steps=50 --set train.threads=1"
                                                 " --set fault.policy=abort");
  Run r = sh(cmd, s, "kill", 120);
  INFO(errors_first(r.err));
  CHECK(r.rc != 0);
  CHECK(r.rc != 124);  // not the test's own timeout
  CHECK(r.err.find("lost process 1") != std::string::npos);
  // the survivor noticed the loss by itself (the connection closed), well before the launcher's grace ran out
  CHECK(r.err.find("killed process") == std::string::npos);
  // fault.policy = abort: troupe launch (--respawn process by default) does not start it again
  CHECK(r.err.find("starting it again") == std::string::npos);
  CHECK(r.err.find("fault.policy = abort: not started again") != std::string::npos);
  CHECK(r.seconds < 60);
  CHECK(survivors(s) == 0);
}

TEST_CASE("a hung (stopped) process is detected by its silence within fault.timeout_s", "[multiprocess]") {
  Scratch s("hang");
  // process 1 SIGSTOPs itself at step 3: its connection stays open, only the heartbeats stop
  const std::string cmd = "env TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=3 TROUPE_FAULT_SIGNAL=STOP '" +
                          troupe_bin() + "' launch --nprocs 2 --grace 5 -- '" + troupe_bin() + "' " +
                          train_args(s, "run", "--set parallel.pp=2 --set train.steps=50 --set train.threads=1"
                                               " --set fault.policy=abort --set fault.timeout_s=3");
  Run r = sh(cmd, s, "hang", 120);
  INFO(errors_first(r.err));
  CHECK(r.rc != 0);
  CHECK(r.rc != 124);
  CHECK(r.err.find("lost process 1") != std::string::npos);
  CHECK(r.err.find("no heartbeat") != std::string::npos);
  CHECK(r.seconds < 40);  // 3 s of silence, then the stopped process is killed after the 5 s grace
  CHECK(survivors(s) == 0);
}

TEST_CASE("a delayed message past train.timeout_s is an error naming the stage and what it waited for",
          "[multiprocess]") {
  Scratch s("delay");
  // rank 0's activations of step 2 are held back 6 s; stage 1 waits at most 2 s for a message
  const std::string cmd = "env TROUPE_FAULT_DELAY_RANK=0 TROUPE_FAULT_DELAY_STEP=2 TROUPE_FAULT_DELAY_S=6 '" +
                          troupe_bin() + "' launch --nprocs 2 --grace 10 -- '" + troupe_bin() + "' " +
                          train_args(s, "run", "--set parallel.pp=2 --set train.steps=5 --set train.threads=1"
                                               " --set fault.policy=abort --set train.timeout_s=2");
  Run r = sh(cmd, s, "delay", 120);
  INFO(errors_first(r.err));
  CHECK(r.rc == 1);
  // Stage 1 waits for the held activation and stage 0, right after sending it, for the
  // matching output gradient: both time out after 2 s and either may report first. The
  // headline names the stage whose deadline passed; the wait-for graph names the held message.
  const bool stage1_first = r.err.find("stage 1 waited 2 s for the activation of step 2") != std::string::npos;
  const bool stage0_first =
      r.err.find("stage 0 waited 2 s for the output gradient of step 2") != std::string::npos;
  CHECK((stage1_first || stage0_first));
  CHECK(r.err.find("stage 1 waits for the activation of step 2 microbatch 0 for chunk 0 from stage 0") !=
        std::string::npos);
  CHECK(r.seconds < 60);
  CHECK(survivors(s) == 0);
}

TEST_CASE("fault.policy = restart: a 4-process job whose process is killed finishes on its own, bitwise",
          "[multiprocess]") {
  Scratch s("restart");
  const std::string layout =
      "--set parallel.pp=2 --set parallel.dp=2 --set train.steps=8 --set checkpoint.interval=2";
  Run straight = sh("'" + troupe_bin() + "' " + train_args(s, "straight", layout + " --set train.threads=2"), s,
                    "straight");
  INFO(errors_first(straight.err));
  REQUIRE(straight.rc == 0);
  const std::map<int, double> ref = losses_by_step(s.path("straight"));  // step -> loss
  auto final_shards = [&](const std::string& run) { return shards_of(s.path(run) + "/checkpoints/step-00000008"); };
  REQUIRE(!final_shards("straight").empty());
  struct Kill {
    std::string name, env;
    std::string launch = "";  // troupe launch options (default: --respawn process)
    std::string set = "";     // config options
    std::string expect = "recovering in place";  // in the log
  };
  const std::string memory = " --set checkpoint.memory_interval=1";
  const std::vector<Kill> kills = {
      // before the first snapshot (a fresh start), at a step's start, in forward, backward and
      // the optimizer step, in the coordinator's process and in workers' processes, and
      // process 0 while its checkpoint writer writes step 4's snapshot. Only the lost
      // process is started again; the others recover in place, from the disk's snapshot...
      {"p0-step2", "TROUPE_FAULT_KILL_RANK=0 TROUPE_FAULT_KILL_STEP=2"},
      {"p3-step6", "TROUPE_FAULT_KILL_RANK=3 TROUPE_FAULT_KILL_STEP=6"},
      {"p1-forward5", "TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=5 TROUPE_FAULT_PHASE=F"},
      {"p2-backward6", "TROUPE_FAULT_KILL_RANK=2 TROUPE_FAULT_KILL_STEP=6 TROUPE_FAULT_PHASE=B"},
      {"p0-optimizer3", "TROUPE_FAULT_KILL_RANK=0 TROUPE_FAULT_KILL_STEP=3 TROUPE_FAULT_PHASE=O"},
      {"p0-snapshot4", "TROUPE_FAULT_KILL_IN_SNAPSHOT=4"},
      // ... or from a peer's memory copy of every step (the lost process's shards from the next process)
      {"mem-p3-step6", "TROUPE_FAULT_KILL_RANK=3 TROUPE_FAULT_KILL_STEP=6", "", memory, "from peer memory (step "},
      {"mem-p0-optimizer5", "TROUPE_FAULT_KILL_RANK=0 TROUPE_FAULT_KILL_STEP=5 TROUPE_FAULT_PHASE=O", "", memory,
       "from peer memory (step "},
      {"mem-p2-backward7", "TROUPE_FAULT_KILL_RANK=2 TROUPE_FAULT_KILL_STEP=7 TROUPE_FAULT_PHASE=B", "", memory,
       "from peer memory (step "},
      // a hung (stopped) process: found by its silence, killed, started again
      {"p1-stopped5", "TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=5 TROUPE_FAULT_SIGNAL=STOP", "",
       " --set fault.timeout_s=3", "killed it (SIGKILL) so that troupe launch starts it again"},
      // the whole job started again (torchrun-style), from the disk's snapshot
      {"job-p1-forward5", "TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=5 TROUPE_FAULT_PHASE=F", "--respawn job", "",
       "starting all processes again"},
  };
  for (const auto& kill : kills) {
    {
      const std::string run = "killed-" + kill.name;
      Run r = sh("env " + kill.env + " '" + troupe_bin() + "' launch --nprocs 4 --grace 15 " + kill.launch + " -- '" +
                     troupe_bin() + "' " + train_args(s, run, layout + " --set train.threads=1" + kill.set),
                 s, run, 200);
      INFO(run << ": " << errors_first(r.err));
      REQUIRE(r.rc == 0);
      CHECK(r.err.find("restart 1") != std::string::npos);
      CHECK(r.err.find(kill.expect) != std::string::npos);
      // each process names the lost one once, not as an error and again in its recovery's warning (trial 51, F6)
      std::map<std::string, int> said;
      std::istringstream lines(r.err);
      for (std::string l; std::getline(lines, l);)
        if (const size_t at = l.find("] lost process "), who = l.find("[process "); at != std::string::npos && who < at)
          ++said[l.substr(who, at - who) + l.substr(at)];
      for (const auto& [line, n] : said) CHECK(n == 1);
      CHECK(losses_by_step(s.path(run)) == ref);  // the last record of each step wins (a restart repeats steps)
      CHECK(final_shards(run) == final_shards("straight"));
    }
  }
  // past fault.max_restarts the job stops for good, says why, and leaves a usable snapshot
  Run r = sh("env TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=6 '" + troupe_bin() +
                 "' launch --nprocs 4 --grace 15 -- '" + troupe_bin() + "' " +
                 train_args(s, "limit", layout + " --set train.threads=1 --set fault.max_restarts=0"),
             s, "limit", 200);
  INFO(errors_first(r.err));
  CHECK(r.rc == 1);
  CHECK(r.err.find("more than fault.max_restarts = 0") != std::string::npos);
  CHECK(r.err.find("step-00000004") != std::string::npos);
  CHECK(fs::exists(s.path("limit") + "/checkpoints/step-00000004/manifest.capnp"));
  CHECK(survivors(s) == 0);
}

TEST_CASE("processes with another config, another binary or without the job secret are refused at join",
          "[multiprocess]") {
  Scratch s("join");
  const std::string port = std::to_string(troupe::test::quiet_port(1));
  auto env = [&](int rank, const std::string& secret) {
    return "env TROUPE_RANK=" + std::to_string(rank) + " TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=127.0.0.1:" + port +
           " TROUPE_JOB_SECRET=" + secret + " ";
  };
  const std::string good = "0123456789abcdef0123456789abcdef";
  const std::string args = train_args(s, "run", "--set parallel.pp=2 --set train.threads=1 --set fault.join_timeout_s=8");
  // warm the data cache first, so both processes reach the join at once
  REQUIRE(sh("'" + troupe_bin() + "' tokenize --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'",
             s, "tokenize")
              .rc == 0);
  auto pair = [&](const std::string& first, const std::string& second, const std::string& tag) {
    // both processes in the background, each under its own deadline; the rcs in files
    const std::string script = "( " + first + " > '" + s.path(tag + "-0.out") + "' 2> '" + s.path(tag + "-0.err") +
                               "'; echo $? > '" + s.path(tag + "-0.rc") + "' ) & ( " + second + " > '" +
                               s.path(tag + "-1.out") + "' 2> '" + s.path(tag + "-1.err") + "'; echo $? > '" +
                               s.path(tag + "-1.rc") + "' ) & wait";
    std::ofstream(s.path(tag + ".sh")) << "cd '" << kSrc << "'\n" << script << "\n";
    std::system(("timeout -k 5 90 sh '" + s.path(tag + ".sh") + "'").c_str());
    auto rc = [&](int r) { return std::atoi(slurp(s.path(tag + "-" + std::to_string(r) + ".rc")).c_str()); };
    return std::make_pair(rc(0), rc(1));
  };
  const std::string bin = "timeout -k 5 60 '" + troupe_bin() + "' ";
  SECTION("a different config") {
    auto [r0, r1] = pair(env(0, good) + bin + args, env(1, good) + bin + args + " --set optim.lr=0.5", "config");
    const std::string e0 = slurp(s.path("config-0.err")), e1 = slurp(s.path("config-1.err"));
    INFO(e0 << "\n---\n" << e1);
    CHECK(r0 != 0);
    CHECK(r1 != 0);
    CHECK(e0.find("optim.lr") != std::string::npos);
    CHECK(e1.find("optim.lr") != std::string::npos);
  }
  SECTION("a different binary") {
    const std::string other = s.path("troupe-other");
    fs::copy_file(troupe_bin(), other);
    { std::ofstream(other, std::ios::app) << "x"; }  // the same program, another build id
    fs::permissions(other, fs::perms::owner_all);
    auto [r0, r1] = pair(env(0, good) + bin + args, env(1, good) + "timeout -k 5 60 '" + other + "' " + args, "binary");
    const std::string e0 = slurp(s.path("binary-0.err")), e1 = slurp(s.path("binary-1.err"));
    INFO(e0 << "\n---\n" << e1);
    CHECK(r0 != 0);
    CHECK(r1 != 0);
    CHECK(e0.find("different troupe binary") != std::string::npos);
  }
  SECTION("another snapshot to resume from") {
    REQUIRE(sh("'" + troupe_bin() + "' " +
                   train_args(s, "snaps", "--set parallel.pp=2 --set train.threads=2 --set checkpoint.interval=1"),
               s, "snaps")
                .rc == 0);
    const std::string snaps = s.path("snaps") + "/checkpoints/";
    auto [r0, r1] = pair(env(0, good) + bin + args + " --resume '" + snaps + "step-00000001'",
                         env(1, good) + bin + args + " --resume '" + snaps + "step-00000002'", "resume");
    const std::string e0 = slurp(s.path("resume-0.err")), e1 = slurp(s.path("resume-1.err"));
    INFO(e0 << "\n---\n" << e1);
    CHECK(r0 != 0);
    CHECK(r1 != 0);
    CHECK(e0.find("the same --resume") != std::string::npos);
  }
  SECTION("a rank held twice") {
    const std::string long_args = train_args(s, "run", "--set parallel.pp=2 --set train.threads=1 --set train.steps=150");
    const std::string script = "cd '" + kSrc + "'\n( " + env(0, good) + bin + long_args + " > /dev/null 2> '" +
                               s.path("dup-0.err") + "'; echo $? > '" + s.path("dup-0.rc") + "' ) &\nsleep 1\n( " +
                               env(1, good) + bin + long_args + " > /dev/null 2> '" + s.path("dup-1.err") + "'; echo $? > '" +
                               s.path("dup-1.rc") + "' ) &\nsleep 2\n( " + env(1, good) + bin + long_args +
                               " > /dev/null 2> '" + s.path("dup-2.err") + "'; echo $? > '" + s.path("dup-2.rc") +
                               "' ) &\nwait\n";
    std::ofstream(s.path("dup.sh")) << script;
    std::system(("timeout -k 5 90 sh '" + s.path("dup.sh") + "'").c_str());
    const std::string e2 = slurp(s.path("dup-2.err"));
    INFO(e2);
    CHECK(std::atoi(slurp(s.path("dup-2.rc")).c_str()) == 2);  // refused: the rank is taken
    CHECK(e2.find("rank 1 is already held") != std::string::npos);
  }
  SECTION("a process without the secret cannot register") {
    auto [r0, r1] = pair(env(0, good) + bin + args, env(1, "not-the-job-secret-at-all") + bin + args, "secret");
    const std::string e0 = slurp(s.path("secret-0.err")), e1 = slurp(s.path("secret-1.err"));
    INFO(e0 << "\n---\n" << e1);
    CHECK(r0 != 0);
    CHECK(r1 != 0);
    CHECK(e0.find("authentication tag is wrong") != std::string::npos);
    CHECK(e0.find("did not join") != std::string::npos);
    CHECK(e0.find("failed authentication") != std::string::npos);
    CHECK(r1 == 2);  // told at once (tests/test_multiprocess.cpp "told at once" checks the timing)
    CHECK(e1.find("wrong job secret") != std::string::npos);
  }
  CHECK(survivors(s) == 0);
}

TEST_CASE("a process with the wrong job secret is told at once, one that does not listen is cut off, the job goes on, "
          "the job listens only on the coordinator's address",
          "[multiprocess][hostile]") {
  Scratch s("intruder");
  const std::string port = std::to_string(troupe::test::quiet_port(2));
  auto env = [&](int rank, const std::string& secret) {
    return "env TROUPE_RANK=" + std::to_string(rank) + " TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=127.0.0.1:" + port +
           " TROUPE_JOB_SECRET=" + secret + " ";
  };
  const std::string good = "0123456789abcdef0123456789abcdef", bad = "fedcba9876543210fedcba9876543210";
  const std::string args = train_args(s, "run", "--set parallel.pp=2 --set train.threads=1 --set fault.join_timeout_s=90");
  REQUIRE(sh("'" + troupe_bin() + "' tokenize --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'",
             s, "tokenize")
              .rc == 0);
  const std::string bin = "timeout -k 5 120 '" + troupe_bin() + "' ";
  auto timed = [&](const std::string& tag, const std::string& cmd) {  // rc and milliseconds into files
    return "t0=$(date +%s%N); " + cmd + " > /dev/null 2> '" + s.path(tag + ".err") + "'; echo $? > '" +
           s.path(tag + ".rc") + "'; echo $(( ($(date +%s%N) - t0) / 1000000 )) > '" + s.path(tag + ".ms") + "'\n";
  };
  std::string script = "cd '" + kSrc + "'\n( " + env(0, good) + bin + args + " > /dev/null 2> '" + s.path("p0.err") +
                       "'; echo $? > '" + s.path("p0.rc") + "' ) &\n"
                       // process 0's own listening sockets, once its transport is up (it waits for process 1)
                       "for i in $(seq 1 600); do for p in $(pgrep -f -- '" + s.path("run") +
                       "'); do [ \"$(cat /proc/$p/comm 2>/dev/null)\" = troupe ] && ss -ltnpH | grep \"pid=$p,\" > '" +
                       s.path("listen.txt") + "'; done; [ $(cat '" + s.path("listen.txt") +
                       "' 2>/dev/null | wc -l) -ge 2 ] && break; sleep 0.1; done\n" +
                       timed("wrong", env(1, bad) + bin + args) +
                       timed("deaf", env(1, bad) + "TROUPE_FAULT_IGNORE_REFUSAL=1 " + bin + args) + "( " + env(1, good) +
                       bin + args + " > /dev/null 2> '" + s.path("p1.err") + "'; echo $? > '" + s.path("p1.rc") +
                       "' ) &\nwait\n";
  std::ofstream(s.path("run.sh")) << script;
  std::system(("timeout -k 5 200 sh '" + s.path("run.sh") + "'").c_str());
  auto num = [&](const std::string& f) { return std::atoi(slurp(s.path(f)).c_str()); };
  const std::string p0 = slurp(s.path("p0.err")), wrong = slurp(s.path("wrong.err")), deaf = slurp(s.path("deaf.err"));
  INFO("process 0:\n" << p0 << "\n--- wrong secret:\n" << wrong << "\n--- deaf:\n" << deaf << "\n--- process 1:\n"
                       << slurp(s.path("p1.err")));
  // told at once: exit 2 naming the cause, long before fault.join_timeout_s = 90
  CHECK(num("wrong.rc") == 2);
  CHECK(wrong.find("wrong job secret") != std::string::npos);
  CHECK(wrong.find("wrong job secret", wrong.find("wrong job secret") + 1) == std::string::npos);  // said once
  CHECK(num("wrong.ms") < 20000);
  // one that ignores the notice is cut off by the job (its connection closed), also at once
  CHECK(num("deaf.rc") == 2);  // a job it could not join
  CHECK(deaf.find("closed the connection before this process joined") != std::string::npos);
  CHECK(num("deaf.ms") < 25000);
  CHECK(p0.find("closed the connection from 127.0.0.1:") != std::string::npos);
  // the job's log: refusals at a bounded rate, counted
  int lines = 0;
  std::istringstream is(p0);
  for (std::string l; std::getline(is, l);) lines += l.find("dropped a message") != std::string::npos;
  CHECK(lines >= 1);
  CHECK(lines <= 2);
  const size_t at = p0.find(" message(s) from processes without this job's secret were refused");
  REQUIRE(at != std::string::npos);
  const size_t from = p0.rfind(' ', at - 1) + 1;
  CHECK(std::atoi(p0.c_str() + from) >= 3);  // both joins and the deaf one's heartbeats
  // the job itself was not harmed
  CHECK(num("p0.rc") == 0);
  CHECK(num("p1.rc") == 0);
  // process 0 listens on the coordinator's address only: the control plane and the UCX data
  // plane (which listened on every interface before)
  const std::string listen = slurp(s.path("listen.txt"));
  INFO("listening sockets of process 0:\n" << listen);
  int sockets = 0;
  std::istringstream ls(listen);
  for (std::string l; std::getline(ls, l);) {
    ++sockets;
    CHECK(l.find("127.0.0.1:") != std::string::npos);
  }
  CHECK(sockets >= 2);
  CHECK(survivors(s) == 0);
}

TEST_CASE("three hosts on one machine: network namespaces joined by veth pairs, UCX over TCP only",
          "[multiprocess][netns]") {
  Scratch s("netns");
  const std::string tag = "trp" + std::to_string(::getpid() % 100000);
  const std::string ns[3] = {tag + "h0", tag + "h1", tag + "h2"};
  const std::string br = tag + "br";
  // Three namespaces (the hosts), each with an eth0 (10.231.0.1-3/24) whose veth peer sits
  // on a bridge in a fourth namespace; loopback stays down, so nothing goes another way.
  std::string setup = "set -e\nip netns add " + br + "\nip -n " + br + " link add br0 type bridge\nip -n " + br +
                      " link set br0 up\n";
  for (int i = 0; i < 3; ++i)
    setup += "ip netns add " + ns[i] + "\nip link add eth0 netns " + ns[i] + " type veth peer name p" +
             std::to_string(i) + " netns " + br + "\nip -n " + br + " link set p" + std::to_string(i) +
             " master br0 up\nip -n " + ns[i] + " addr add 10.231.0." + std::to_string(i + 1) + "/24 dev eth0\nip -n " +
             ns[i] + " link set eth0 up\n";
  std::string teardown;
  for (const auto& n : {ns[0], ns[1], ns[2], br})
    teardown += "ip netns pids " + n + " 2>/dev/null | xargs -r kill -9; ip netns del " + n + " 2>/dev/null; ";
  struct Cleanup {
    std::string cmd;
    ~Cleanup() { std::system(("sh -c '" + cmd + "' >/dev/null 2>&1").c_str()); }
  } cleanup{teardown};
  std::ofstream(s.path("setup.sh")) << setup;
  if (std::system(("sh '" + s.path("setup.sh") + "' > '" + s.path("setup.log") + "' 2>&1").c_str()) != 0) {
    WARN("skipped: cannot create network namespaces and veth pairs here (needs root and iproute2): "
         << slurp(s.path("setup.log")));
    return;
  }
  const std::string layout = "--set parallel.pp=3 --set parallel.tp=1 --set parallel.dp=1";
  Run one = sh("'" + troupe_bin() + "' " + train_args(s, "one", layout + " --set train.threads=2"), s, "one");
  INFO(errors_first(one.err));
  REQUIRE(one.rc == 0);
  const Outcome ref = read_run(s.path("one"));
  // one process per host; process 0 listens on host 0's address
  std::string script = "cd '" + kSrc + "'\n";
  for (int i = 0; i < 3; ++i)
    script += "( ip netns exec " + ns[i] + " env TROUPE_RANK=" + std::to_string(i) +
              " TROUPE_WORLD_SIZE=3 TROUPE_COORDINATOR=10.231.0.1:29555 TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef"
              " UCX_TLS=tcp UCX_NET_DEVICES=eth0 timeout -k 5 100 '" +
              troupe_bin() + "' " + train_args(s, "multi", layout + " --set train.threads=1 --set fault.join_timeout_s=60") + " > '" +
              s.path("h" + std::to_string(i) + ".out") + "' 2> '" + s.path("h" + std::to_string(i) + ".err") +
              "'; echo $? > '" + s.path("h" + std::to_string(i) + ".rc") + "' ) &\n";
  script += "wait\n";
  std::ofstream(s.path("run.sh")) << script;
  std::system(("timeout -k 5 150 sh '" + s.path("run.sh") + "'").c_str());
  for (int i = 0; i < 3; ++i) {
    INFO("host " << i << ": " << slurp(s.path("h" + std::to_string(i) + ".err")));
    const std::string rc = slurp(s.path("h" + std::to_string(i) + ".rc"));
    CHECK(!rc.empty());
    CHECK(std::atoi(rc.c_str()) == 0);
  }
  const Outcome got = read_run(s.path("multi"));
  REQUIRE(got.losses.size() == 3);
  for (int k = 0; k < 3; ++k) CHECK(got.losses[k] == ref.losses[k]);
  CHECK(got.val == ref.val);
  REQUIRE(got.shards.size() == ref.shards.size());
  for (auto& [name, bytes] : ref.shards) CHECK(got.shards.at(name) == bytes);
  // the pipeline really crossed the veths: host 1 received its activations (~0.5 MiB a step) on eth0
  FILE* p = popen(("cat /sys/class/net/eth0/statistics/rx_bytes 2>/dev/null; ip netns exec " + ns[1] +
                   " cat /sys/class/net/eth0/statistics/rx_bytes")
                      .c_str(),
                  "r");
  long long host_rx = 0, ns_rx = 0;
  if (p) {
    char buf[64];
    while (fgets(buf, sizeof buf, p)) ns_rx = std::atoll(buf);  // the last line is host 1's
    pclose(p);
  }
  (void)host_rx;
  CHECK(ns_rx > 1024 * 1024);
}
