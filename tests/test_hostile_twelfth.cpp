// Hostile inputs, issue 14's eleventh trial (review 14k MB1, MB4, LB1-LB5, L5): a run's own
// checkpoints folder locked against a second run, the file-size limit held to the largest
// shard file, a run directory's record files probed before any is written, a stdout whose
// reader went away, every catchable terminating signal a stop request, a stop during a
// snapshot load, a snapshot of a newer format, an IPv6 coordinator, SentencePiece's words.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "actors/job.h"
#include "checkpoint/snapshot.h"
#include "cli_helpers.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/job_error.h"
#include "core/launch_env.h"
#include "core/text.h"
#include "datasets/corpus.h"
#include "tests/job_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-twelfth";  // the scratch folders' group

// A tiny run in the background until its second step, then the shell words `then` ($p: its
// pid); stderr in <scratch>/err. `args` go after train's own.
Run train_then(const Scratch& s, const std::string& args, const std::string& then) {
  return run_and_signal(s,
                        "train --config configs/tiny.toml --set train.steps=100000 --set train.sample_tokens=0 "
                        "--set data.cache_dir='" + s.path("cache") + "' " + args,
                        "step +2/", then);
}

// Shell words that run troupe `args` in the foreground (from the source dir), its stderr to
// <scratch>/<name>.err and its exit status to <scratch>/<name>.rc.
std::string foreground(const Scratch& s, const std::string& name, const std::string& args) {
  return "'" + troupe_bin() + "' " + args + " > /dev/null 2> '" + s.path(name + ".err") + "'; echo $? > '" +
         s.path(name + ".rc") + "'";
}
Run result_of(const Scratch& s, const std::string& name) {
  return {std::atoi(slurp(s.path(name + ".rc")).c_str()), slurp(s.path(name + ".err"))};
}

// The step-<k> folder of a finished tiny run's checkpoints.
std::string newest_snapshot(const std::string& ckpt) {
  std::string best;
  for (auto& e : fs::directory_iterator(ckpt))
    if (e.path().filename().string().rfind("step-", 0) == 0 && fs::exists(e.path() / "manifest.capnp"))
      best = std::max(best, e.path().string());
  return best;
}
}  // namespace

TEST_CASE("a run's own checkpoints folder is locked: a second run naming it as checkpoint.dir, or a run directory "
          "whose checkpoints folder another run writes, is refused naming the holder",
          "[cli][hostile]") {
  Scratch s(kGroup, "ckptlock");
  const std::string cache = " --set data.cache_dir='" + s.path("cache") + "'";
  // run A writes A/checkpoints (checkpoint.dir unset); run B names it as its checkpoint.dir
  Run a = train_then(s, "--run-dir '" + s.path("A") + "'",
                     "echo $p > '" + s.path("pidA") + "'; " +
                         foreground(s, "B",
                                    "train --config configs/tiny.toml --set train.steps=4" + cache +
                                        " --set checkpoint.dir='" + s.path("A/checkpoints") + "' --run-dir '" +
                                        s.path("B") + "'") +
                         "; kill -TERM $p");
  CHECK(a.rc == 0);
  const std::string pid_a = std::to_string(std::atoi(slurp(s.path("pidA")).c_str()));
  expect_user_error(result_of(s, "B"), {"in use by another troupe run", ("(process " + pid_a + ")").c_str(),
                                        "choose another checkpoint.dir"});
  CHECK_FALSE(fs::exists(s.path("B")));
  // run C writes into D/checkpoints (its checkpoint.dir); run D's own checkpoints folder is that one
  Run c = train_then(s, "--set checkpoint.dir='" + s.path("D/checkpoints") + "' --run-dir '" + s.path("C") + "'",
                     "echo $p > '" + s.path("pidC") + "'; " +
                         foreground(s, "D",
                                    "train --config configs/tiny.toml --set train.steps=4" + cache + " --run-dir '" +
                                        s.path("D") + "'") +
                         "; kill -TERM $p");
  CHECK(c.rc == 0);
  const std::string pid_c = std::to_string(std::atoi(slurp(s.path("pidC")).c_str()));
  expect_user_error(result_of(s, "D"),
                    {"the run's checkpoints folder", ("(process " + pid_c + ")").c_str(), "pass another --run-dir"});
  CHECK_FALSE(fs::exists(s.path("D/config.toml")));
  CHECK_FALSE(fs::exists(s.path("D/train.log")));
}

TEST_CASE("the file-size limit is checked against the largest shard file: a pipeline run under a limit between a "
          "shard and the whole model trains and snapshots",
          "[cli][hostile]") {
  Scratch s(kGroup, "fsize");
  const std::string base = "train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=1 --set "
                           "train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "'";
  REQUIRE(run_troupe(base + " --run-dir '" + s.path("free") + "'", s, 300).rc == 0);
  uint64_t largest = 0, total = 0;
  for (auto& e : fs::directory_iterator(newest_snapshot(s.path("free/checkpoints")))) {
    largest = std::max<uint64_t>(largest, e.file_size());
    total += e.file_size();
  }
  INFO("largest file " << largest << " bytes, snapshot " << total << " bytes");
  REQUIRE(total > largest + largest / 2);  // PP = 2: two shards of about the same size
  const uint64_t limit = (largest + total) / 2;
  const Run r = run_troupe(base + " --run-dir '" + s.path("limited") + "'", s, 300,
                           "prlimit --fsize=" + std::to_string(limit) + ":" + std::to_string(limit));
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(error_lines(r.err).empty());
  CHECK_FALSE(newest_snapshot(s.path("limited/checkpoints")).empty());
  // under the largest shard it is still refused before anything is written
  const uint64_t small = largest / 2;
  expect_user_error(run_troupe(base + " --run-dir '" + s.path("small") + "'", s, 120,
                               "prlimit --fsize=" + std::to_string(small) + ":" + std::to_string(small)),
                    {"ulimit -f", "largest snapshot shard file"});
  CHECK_FALSE(fs::exists(s.path("small")));
}

TEST_CASE("a run directory whose metrics.jsonl is a directory is refused before config.toml or train.log is written",
          "[cli][hostile]") {
  Scratch s(kGroup, "records");
  for (const char* f : {"metrics.jsonl", "train.log", "config.toml"}) {
    INFO(f);
    const std::string run = s.path(std::string("run-") + f);
    fs::create_directories(run + "/" + f);
    expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set data.cache_dir='" +
                                     s.path("cache") + "' --run-dir '" + run + "'",
                                 s, 120),
                      {f, "a directory", "--run-dir"});
    for (const char* other : {"metrics.jsonl", "train.log", "config.toml", "checkpoints"})
      if (std::string(other) != f) CHECK_FALSE(fs::exists(run + "/" + other));
  }
}

TEST_CASE("a command whose standard output's reader goes away (| head -c 10) ends quietly with exit 0",
          "[cli][hostile]") {
  Scratch s(kGroup, "pipe");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=2 --set "
                     "train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                         s.path("run") + "'",
                     s, 300)
              .rc == 0);
  const std::string snap = newest_snapshot(s.path("run/checkpoints"));
  for (const std::string& args : {"generate '" + snap + "' --tokens 4000 --prompt a", std::string("--version"),
                                 std::string("plan --config configs/tiny.toml --set cluster.gpu=a100-80g --set cluster.gpus_per_node=2"),
                                 std::string("simulate --stages 64 --microbatches 256"), std::string("help")}) {
    INFO(args);
    const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && bash -c \"'" + troupe_bin() + "' " + args +
                            " 2> '" + s.path("err") + "' | head -c 10 > /dev/null; echo \\${PIPESTATUS[0]} > '" +
                            s.path("rc") + "'\"";
    shell_status(cmd);
    const std::string err = slurp(s.path("err"));
    INFO(err);
    CHECK(std::atoi(slurp(s.path("rc")).c_str()) == 0);
    CHECK(error_lines(err).empty());
  }
}

TEST_CASE("every signal that can be caught and whose default action ends the process is a stop signal, or "
          "documented as left alone",
          "[hostile][unit]") {
  // default action "ignore", "stop" or "continue", or not catchable
  const std::set<int> not_terminating = {SIGCHLD, SIGCONT, SIGURG, SIGWINCH, SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU, SIGKILL};
  // a fault inside the process (its crash status stays) and the two ignored ones (cli/main.cpp)
  const std::set<int> left_alone = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGPIPE, SIGXFSZ};
  std::set<int> stop(troupe::kStopSignals, troupe::kStopSignals + troupe::kStopSignalCount);
  CHECK(stop.size() == (size_t)troupe::kStopSignalCount);
  for (int sig = 1; sig <= SIGRTMAX; ++sig) {
    if (sig > SIGSYS && sig < SIGRTMIN) continue;  // glibc's own (its thread cancellation, setxid)
    INFO("signal " << sig << " " << strsignal(sig));
    if (not_terminating.count(sig)) continue;
    CHECK((stop.count(sig) + left_alone.count(sig)) == 1);
    if (stop.count(sig)) CHECK(std::string(troupe::stop_signal_label(sig)).rfind("SIG", 0) == 0);
  }
  CHECK(std::string(troupe::stop_signal_label(SIGRTMIN + 3)) == "SIGRTMIN+3");
}

TEST_CASE("SIGPROF, SIGIO, SIGSYS, SIGSTKFLT and SIGRTMIN+3 stop training with a snapshot, the signal named",
          "[cli][hostile]") {
  Scratch s(kGroup, "signals");
  for (const int sig : {SIGPROF, SIGIO, SIGSYS, SIGSTKFLT, SIGRTMIN + 3}) {
    const std::string name = troupe::stop_signal_label(sig);
    INFO(name);
    const std::string run = s.path("run-" + std::to_string(sig));
    const Run r = train_then(s, "--run-dir '" + run + "'", "kill -" + std::to_string(sig) + " $p");
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.err.find("(" + name + ")") != std::string::npos);
    CHECK(r.err.find("stopping after step") != std::string::npos);
    CHECK_FALSE(newest_snapshot(run + "/checkpoints").empty());
  }
}

TEST_CASE("a stop signal during a snapshot load ends the load, saying so, and --resume latest neither skips nor "
          "moves the snapshot, and a snapshot of a newer format names the newer troupe",
          "[checkpoint][hostile]") {
  Scratch s(kGroup, "load");
  troupe::Config c = tiny(2, 1);
  c.train.steps = 2;
  c.checkpoint.interval = 2;
  troupe::JobContext x = ctx();
  x.checkpoint_dir = s.path("ck");
  troupe::run_job(c, x);
  const std::string good = s.path("ck/step-00000002");
  REQUIRE_NOTHROW(troupe::load_snapshot(good, c));
  troupe::note_stop_signal(SIGTERM);
  CHECK_THROWS_WITH(troupe::load_snapshot(good, c),
                    Catch::Contains("stopped by SIGTERM while loading the snapshot") && Catch::Contains(good));
  CHECK_THROWS_WITH(troupe::load_latest(s.path("ck"), c, nullptr), Catch::Contains("while loading the snapshot"));
  troupe::note_stop_signal(0);
  CHECK(fs::exists(good + "/manifest.capnp"));  // not moved aside
  // a manifest whose trailer is a later one ("TRPMANI2"): a newer troupe wrote it
  const std::string newer = s.path("ck/step-00000003");
  fs::copy(good, newer, fs::copy_options::recursive);
  {
    const std::string m = newer + "/manifest.capnp";
    std::fstream f(m, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((long)fs::file_size(m) - 5);
    f.put('2');
  }
  CHECK_THROWS_WITH(troupe::load_snapshot(newer, c),
                    Catch::Contains("written by a newer troupe (format 2; this build reads up to format 1)") &&
                        Catch::Contains("use a newer troupe"));
  CHECK_THROWS_WITH(troupe::load_latest(s.path("ck"), c, nullptr), Catch::Contains("newer troupe"));
  CHECK(fs::exists(newer + "/manifest.capnp"));  // kept where it is
}

TEST_CASE("an IPv6 coordinator address is refused naming IPv4 and host names, and parser texts lose their tags",
          "[hostile][unit]") {
  auto env = [](const char* coord) {
    return [coord](const char* k) -> const char* {
      const std::string key = k;
      if (key == "TROUPE_RANK") return "1";
      if (key == "TROUPE_WORLD_SIZE") return "2";
      if (key == "TROUPE_COORDINATOR") return coord;
      return nullptr;
    };
  };
  for (const char* coord : {"[::1]:29500", "::1:29500", "[fe80::1]:29500"}) {
    INFO(coord);
    CHECK_THROWS_WITH(troupe::read_launch_env(env(coord)),
                      Catch::Contains("IPv6") && Catch::Contains("IPv4 address") && Catch::Contains("host name"));
  }
  CHECK(troupe::read_launch_env(env("127.0.0.1:29500")).port == 29500);
  CHECK(troupe::parser_message("[json.exception.parse_error.101] parse error at line 1, column 1: x") ==
        "parse error at line 1, column 1: x");
}

TEST_CASE("launch --coordinator [::1]:PORT is refused with one sentence naming IPv4", "[cli][hostile][launch]") {
  Scratch s(kGroup, "ipv6");
  expect_user_error(run_troupe("launch --nprocs 2 --coordinator '[::1]:29533' -- train --config configs/tiny.toml", s, 60),
                    {"IPv6", "IPv4 address"});
}

TEST_CASE("a vocabulary larger than the corpus yields is refused in troupe's words, without SentencePiece's source "
          "locations",
          "[cli][hostile][datasets]") {
  Scratch s(kGroup, "spm");
  const Run r = run_troupe("prepare --config configs/tiny.toml --set model.vocab_size=60000 --set data.cache_dir='" +
                               s.path("cache") + "'",
                           s, 300);
  INFO(r.err);
  CHECK(r.err.find(".cc(") == std::string::npos);
  expect_user_error(r, {"model.vocab_size = 60000 is more tokens than this corpus yields", "lower model.vocab_size"});
}

TEST_CASE("hashing a corpus says how far it is and stops at a stop signal", "[hostile][datasets]") {
  const std::string corpus = std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt";
  std::vector<std::string> lines;
  const uint64_t h = troupe::hash_file(corpus, [&](const std::string& l) { lines.push_back(l); }, 0.0);
  CHECK(h == troupe::hash_file(corpus));
  REQUIRE_FALSE(lines.empty());
  CHECK(lines[0].find("hashing '" + corpus + "'") == 0);
  CHECK(lines[0].find(" GB (") != std::string::npos);
  troupe::note_stop_signal(SIGINT);
  CHECK_THROWS_WITH(troupe::hash_file(corpus), Catch::Contains("stopped by SIGINT (Ctrl-C) while hashing"));
  troupe::note_stop_signal(0);
}
