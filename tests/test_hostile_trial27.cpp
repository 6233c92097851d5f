// Hostile inputs, issue 14's twenty-seventh trial (a fresh reviewer's 254 cases): train.log
// was cut mid-line on a full disk and its lost lines never named (M01); generate racing
// keep_last retention called the snapshot incomplete or empty (R5b); an empty config trained
// the default job without a word (C08); a float with a leading zero passed --set (R3c); a
// seed past 2^63 - 1 was "not a non-negative integer" (X14); another run's manifest made an
// intact shard "damaged" (S03).
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "cli_helpers.h"
#include "core/error.h"
#include "core/line_file_sink.h"

#include <spdlog/logger.h>

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial27";

// Runs `args` while a thread removes `victim` after 300 ms: what a reader sees while
// checkpoint.keep_last deletes a snapshot.
Run run_while_removed(const std::string& args, const Scratch& s, const std::string& victim) {
  std::thread remover([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    fs::remove_all(victim);
  });
  Run r = run_troupe(args, s);
  remover.join();
  return r;
}
}  // namespace

TEST_CASE("train.log keeps whole lines on a full disk and the lost ones are counted", "[cli][hostile][disk]") {
  Scratch s(kGroup, "fulllog");
  const std::string mnt = s.path("mnt");
  std::string body = "'";  // (piece by piece: GCC 12's -Wrestrict misfires on "'" + string)
  body += troupe_bin();
  body +=
      std::string("' train --config configs/tiny.toml --set train.steps=150 --set train.sample_tokens=0 ") +
      "--set checkpoint.dir='" + s.path("ck") + "' --run-dir '" + mnt + "/run' > /dev/null 2> '" + s.path("err") +
      "' &\np=$!\nfor i in $(seq 1 600); do grep -qE 'step +2/' '" + s.path("err") + "' && break; sleep 0.1; done\n" +
      "dd if=/dev/zero of='" + mnt + "/fill' bs=1M count=64 2>/dev/null || true\n" +
      "if wait $p; then echo 0; else echo $?; fi > '" + s.path("rc") + "'\n" +
      "tail -c 1 '" + mnt + "/run/train.log' | od -An -tx1 > '" + s.path("last") + "'\n";
  std::string why;
  if (!run_on_tmpfs(s, mnt, 12, body, &why)) {
    WARN("skipped: cannot mount a tmpfs in a mount namespace here: " << why);
    return;
  }
  const std::string err = slurp(s.path("err"));
  INFO("stderr: " << err << "\ntmpfs.log: " << slurp(s.path("tmpfs.log")));
  CHECK(std::atoi(slurp(s.path("rc")).c_str()) == 0);  // training and snapshots go on
  std::string cannot = "cannot write ";  // (piece by piece: GCC 12's -Wrestrict misfires on "..." + string)
  cannot += mnt;
  cannot += "/run/train.log (No space left on device)";
  CHECK(err.find(cannot) != std::string::npos);
  CHECK(err.find("line(s) of the log could not be written to train.log (No space left on device); it holds every other line whole") !=
        std::string::npos);
  CHECK(slurp(s.path("last")).find("0a") != std::string::npos);  // the file ends with a whole line
}

TEST_CASE("a log line that does not fit is counted, not thrown", "[hostile][disk]") {
  auto sink = std::make_shared<troupe::LineFileSink>("/dev/full");
  spdlog::logger logger("full", sink);
  logger.info("one");
  logger.info("two");
  CHECK(sink->lost_lines() == 2);
  CHECK_THROWS_WITH(troupe::LineFileSink("/nonexistent-dir/train.log"), Catch::Contains("cannot append to"));
}

TEST_CASE("generate or export racing retention says the snapshot was removed, not incomplete or empty",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "race");
  // retention's stages: manifest gone, files going (tokenizer.model left), folder empty
  fs::create_directories(s.path("ck/step-00000004"));
  s.write("ck/step-00000004/tokenizer.model", "bytes");
  expect_user_error(run_while_removed("generate '" + s.path("ck/step-00000004") + "' --tokens 1", s,
                                      s.path("ck/step-00000004")),
                    {"was removed while it was being read", "keep_last"});
  fs::create_directories(s.path("ck/step-00000005"));
  expect_user_error(run_while_removed("generate '" + s.path("ck/step-00000005") + "/' --tokens 1", s,
                                      s.path("ck/step-00000005")),
                    {"was removed while it was being read"});
  // one that stays is still named for what it is
  fs::create_directories(s.path("ck/step-00000006"));
  expect_user_error(run_troupe("generate '" + s.path("ck/step-00000006") + "' --tokens 1", s), {"is empty"});
}

TEST_CASE("a config file that sets no key is refused, not trained as the default job", "[cli][hostile][config]") {
  Scratch s(kGroup, "emptyconfig");
  for (const std::string& text : {std::string(), std::string("# only a comment\n"), std::string("[train]\n[model]\n")}) {
    s.write("e.toml", text);
    expect_user_error(run_troupe("train --config '" + s.path("e.toml") + "' --run-dir '" + s.path("r") + "'", s, 30),
                      {"sets no key", "configs/sotu.toml"});
  }
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("numbers from --set follow TOML: no leading zeros, integers up to 2^63 - 1", "[cli][hostile][config]") {
  Scratch s(kGroup, "numbers");
  const std::string run = "train --config configs/tiny.toml --set train.steps=1 --run-dir '" + s.path("r") + "' ";
  expect_user_error(run_troupe(run + "--set optim.lr=02e-3", s), {"optim.lr", "without leading zeros", "got '02e-3'"});
  expect_user_error(run_troupe(run + "--set optim.lr=-00.5", s), {"without leading zeros"});
  expect_user_error(run_troupe(run + "--set train.seed=9223372036854775808", s),
                    {"train.seed", "at most 9223372036854775807"});
  expect_user_error(run_troupe(run + "--set train.seed=-1", s), {"train.seed", "a non-negative integer, got '-1'"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("another snapshot's manifest is named, not the intact shard called damaged", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "foreign");
  for (const char* run : {"a", "b"})
    REQUIRE(run_troupe(std::string("train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 "
                                   "--set train.sample_tokens=0 --set train.seed=") +
                           (run[0] == 'a' ? "1" : "2") + " --run-dir '" + s.path(run) + "'",
                       s)
                .rc == 0);
  const std::string snap = s.path("b/checkpoints/step-00000001");
  fs::copy_file(s.path("a/checkpoints/step-00000001/manifest.capnp"), snap + "/manifest.capnp",
                fs::copy_options::overwrite_existing);
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 1", s),
                    {"does not match its manifest", "whole by its own per-tensor checksums", "another snapshot"});
}
