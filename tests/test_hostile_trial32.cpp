// Hostile inputs, issue 14's thirty-second trial (a fresh reviewer's 129 cases): processes
// of one job that read different bytes under the same config trained together (F0); a soft
// CPU-time limit ended training without a snapshot (F1, tests/test_hostile_peers.cpp);
// retention with an undeletable manifest left a manifest over deleted shards (F3); the
// umask check refused commands that write nothing (F4, tests/test_hostile_trial31.cpp); an
// output path past PATH_MAX was called missing (F5); the tests' fault switches took garbage
// (F6); a trickling server was said to have gone silent (F7); all-zero simulate costs gave a
// bubble of 0/0 (F8); a --set key wrapped in spaces got the whole key list (F9).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial32";
const std::string kSrc = TROUPE_SOURCE_DIR;
}  // namespace

TEST_CASE("processes of one job whose copies of the corpus differ are refused at join", "[cli][hostile][multiprocess]") {
  Scratch s(kGroup, "datakey");
  // one tokenizer for both (else the tokenizers, trained on different text, differ first)
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c0") + "'", s).rc == 0);
  std::string tok;
  for (auto& e : fs::recursive_directory_iterator(s.path("c0")))
    if (e.path().filename() == "tokenizer.model") tok = e.path().string();
  REQUIRE_FALSE(tok.empty());
  // process 1 runs from another folder whose tests/data/tiny_corpus.txt (the same relative
  // path) holds other text: the same config, other bytes
  fs::create_directories(s.path("w/configs"));
  fs::create_directories(s.path("w/tests/data"));
  fs::copy_file(kSrc + "/configs/tiny.toml", s.path("w/configs/tiny.toml"));
  std::string text = slurp(kSrc + "/tests/data/tiny_corpus.txt");
  for (char& c : text) c = c == 'e' ? 'E' : c;
  std::ofstream(s.path("w/tests/data/tiny_corpus.txt")) << text;
  const std::string port = std::to_string(quiet_port(32));
  const std::string env = "TROUPE_WORLD_SIZE=2 TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef "
                          "TROUPE_COORDINATOR=127.0.0.1:" + port;
  const std::string args = " train --config configs/tiny.toml --set train.steps=2 --set train.sample_tokens=0 "
                           "--set fault.join_timeout_s=60 --set data.tokenizer='" + tok + "' --run-dir '" +
                           s.path("run") + "'";
  const std::string cmd = "cd '" + kSrc + "' && (env " + env + " TROUPE_RANK=0 timeout 120 '" + troupe_bin() + "'" +
                          args + " --set data.cache_dir='" + s.path("c0") + "' 2> '" + s.path("e0") +
                          "' & cd '" + s.path("w") + "' && env " + env + " TROUPE_RANK=1 timeout 120 '" + troupe_bin() +
                          "'" + args + " --set data.cache_dir='" + s.path("c1") + "' 2> '" + s.path("e1") +
                          "'; echo $? > '" + s.path("rc1") + "'; wait $!; echo $? > '" + s.path("rc0") + "') > /dev/null";
  shell_status(cmd);
  const std::string e0 = slurp(s.path("e0")), e1 = slurp(s.path("e1"));
  INFO("process 0:\n" << e0 << "\n--- process 1:\n" << e1);
  CHECK(slurp(s.path("rc0")).substr(0, 1) == "2");
  CHECK(slurp(s.path("rc1")).substr(0, 1) == "2");
  CHECK(e0.find("process 1 prepared data") != std::string::npos);
  CHECK(e0.find("the sources' bytes differ") != std::string::npos);
  CHECK(e1.find("the sources' bytes differ") != std::string::npos);
}

TEST_CASE("retention never leaves a manifest over deleted shards", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "appendonly");
  const std::string train = "train --config configs/tiny.toml --set checkpoint.interval=1 --set checkpoint.keep_last=1 "
                            "--set train.sample_tokens=0 --set train.eval_interval=0 --run-dir '" + s.path("run") + "'";
  REQUIRE(run_troupe(train + " --set train.steps=2", s).rc == 0);
  const std::string old = s.path("run/checkpoints/step-00000002");
  const size_t files = std::distance(fs::directory_iterator(old), fs::directory_iterator());
  if (shell_status("chattr +a '" + old + "/manifest.capnp' 2> /dev/null") != 0) {
    SUCCEED("chattr +a is not supported on this filesystem: nothing to check");
    return;
  }
  const Run r = run_troupe(train + " --set train.steps=3 --resume latest", s);
  shell_status("chattr -a '" + old + "/manifest.capnp'");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("could not remove the older snapshot " + old) != std::string::npos);
  // whole: every file still there (it is still a snapshot that --resume can load)
  CHECK((size_t)std::distance(fs::directory_iterator(old), fs::directory_iterator()) == files);
}

TEST_CASE("an output path longer than the system takes is named as such, not as missing", "[cli][hostile]") {
  Scratch s(kGroup, "longpath");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 --set "
                     "train.sample_tokens=0 --set train.eval_interval=0 --run-dir '" + s.path("run") + "'",
                     s)
              .rc == 0);
  // a folder 40 levels of 100-byte names deep: it exists, but its path is past PATH_MAX
  const std::string name(100, 'y');
  std::string make = "cd '" + s.dir.string() + "'";
  for (int i = 0; i < 40; ++i) make += " && mkdir " + name + " && cd " + name;
  REQUIRE(shell_status(make + " && pwd > '" + s.path("deep") + "'") == 0);
  std::string deep = slurp(s.path("deep"));
  deep.erase(deep.find_last_not_of('\n') + 1);
  const Run r = run_troupe("export '" + s.path("run/checkpoints/step-00000001") + "' '" + deep + "/m.st'", s);
  expect_user_error(r, {"too long for the system", "File name too long", "pass a shorter"});
  CHECK(r.err.find("does not exist") == std::string::npos);
  shell_status("rm -rf '" + s.path(name) + "'");
}

TEST_CASE("the tests' fault switches refuse values they cannot mean", "[cli][hostile]") {
  Scratch s(kGroup, "faultenv");
  const std::string train = "train --config configs/tiny.toml --set train.steps=2 --set train.sample_tokens=0 "
                            "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'";
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_KILL_RANK=0 TROUPE_FAULT_KILL_STEP=abc"),
                    {"TROUPE_FAULT_KILL_STEP='abc' is not a whole number"});
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_KILL_RANK=0 TROUPE_FAULT_KILL_STEP=1 TROUPE_FAULT_PHASE=Q"),
                    {"TROUPE_FAULT_PHASE='Q' is not F, B or O"});
  expect_user_error(
      run_troupe(train, s, 60, "TROUPE_FAULT_KILL_RANK=0 TROUPE_FAULT_KILL_STEP=1 TROUPE_FAULT_SIGNAL=BOGUS"),
      {"TROUPE_FAULT_SIGNAL='BOGUS' is neither KILL nor STOP"});
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_KILL_RANK=7 TROUPE_FAULT_KILL_STEP=1"),
                    {"TROUPE_FAULT_KILL_RANK='7' is not a whole number from 0 to 0"});
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_DELAY_RANK=0 TROUPE_FAULT_DELAY_STEP=1 "
                                             "TROUPE_FAULT_DELAY_S=-1e308"),
                    {"TROUPE_FAULT_DELAY_S='-1e308' is not a number of seconds"});
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("a server that trickles bytes is not said to have gone silent", "[cli][hostile][launch]") {
  Scratch s(kGroup, "trickle");
  const std::string port = one_shot_server(s, "for i in range(30):\n  c.sendall(b'S')\n  time.sleep(1)");
  REQUIRE_FALSE(port.empty());
  const Run r = join_at(s, port, 5);
  expect_user_error(r, {"is not a troupe coordinator", "a few at a time"});
  CHECK(r.err.find("and then nothing for") == std::string::npos);
}

TEST_CASE("simulate refuses costs with no computation, and a --set key in spaces is told to drop them",
          "[cli][hostile]") {
  Scratch s(kGroup, "zerocost");
  expect_user_error(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --cost f=0,b=0,w=0,p2p=0", s),
                    {"--cost gives f = 0 and b = 0", "0/0"});
  const Run r = run_troupe("train --config configs/tiny.toml --set ' train.steps = 3 '", s);
  expect_user_error(r, {"has spaces around it", "--set train.steps=VALUE"});
  CHECK(r.err.find("model.n_layer") == std::string::npos);
}

TEST_CASE("plan --calibrate models the run the trace measured, not a reused folder's first config.toml",
          "[cli][hostile][plan]") {
  Scratch s(kGroup, "calibrate");
  const std::string train = "train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=3 "
                            "--set train.eval_interval=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                            s.path("run") + "' --trace '" + s.path("run/trace.json") + "'";
  fs::create_directories(s.path("run"));
  REQUIRE(run_troupe(train, s).rc == 0);
  REQUIRE(run_troupe(train + " --set model.n_embd=256", s).rc == 0);  // config.toml keeps n_embd 128
  CHECK(slurp(s.path("run/config.toml")).find("n_embd = 128") != std::string::npos);
  CHECK(slurp(s.path("run/trace.json")).find("n_embd = 256") != std::string::npos);  // otherData.troupe_config
  const Run r = run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("run") + "'", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("is not the config of the traced run") != std::string::npos);
}

TEST_CASE("launch names a process that exited 0 before the job failed", "[cli][hostile][launch]") {
  Scratch s(kGroup, "earlyzero");
  const Run r = run_troupe("launch --nprocs 2 -- sh -c 'if [ \"$TROUPE_RANK\" = 1 ]; then exit 0; fi; exec \"" +
                               troupe_bin() + "\" train --config configs/tiny.toml --set train.sample_tokens=0 --set "
                               "train.steps=2 --set fault.join_timeout_s=3 --set data.cache_dir=" + s.path("cache") +
                               " --run-dir " + s.path("run") + "'",
                           s, 60);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("launch: process 1 (pid ") != std::string::npos);
  CHECK(r.err.find("had exited with status 0 after") != std::string::npos);
}

TEST_CASE("log lines escape a bidi override in a path, as errors do", "[cli][hostile]") {
  Scratch s(kGroup, "bidi");
  const std::string run = s.path("n44-\u202Egnp.exe");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                           "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + run + "'",
                           s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("n44-\\u{202E}gnp.exe") != std::string::npos);
  CHECK(r.err.find("\u202E") == std::string::npos);
  CHECK(slurp(run + "/train.log").find("\u202E") == std::string::npos);
}
