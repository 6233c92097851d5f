// Hostile inputs, issue 14: trial 59's findings. train.steps = 0 with --resume was refused as
// "nothing left to train", though the README promises the resumed parameters' validation
// loss (M1); numbers in messages were rounded so a value past a bound read as the bound, and
// 1e309 was refused as "inf" (L2); a typo in a schedule file got advice about microbatches
// before the file's own fault (L3); a run a full disk ended with exit 2 never counted the
// lines train.log lost (L4). And from fresh-user check 4: simulate --config takes the config's
// layout; plan without cluster.gpu names a fix that works.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial59";

std::string message_of(double v) {
  try {
    TROUPE_USER_FAIL() << "v = " << v;
  } catch (const troupe::UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("train.steps 0 with --resume evaluates the resumed parameters", "[cli][hostile]") {
  Scratch s(kGroup, "steps0");
  REQUIRE(run_troupe(tiny_train(s, "run", 3), s, 180).rc == 0);
  const std::string first = slurp(s.path("run/metrics.jsonl"));
  const Run r = run_troupe(tiny_train(s, "run", 0, " --resume latest"), s, 180);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("done: 0 steps") != std::string::npos);
  // the same validation loss the run ended with, from the same parameters
  const std::string all = slurp(s.path("run/metrics.jsonl"));
  const auto val_of_last_summary = [](const std::string& text) {
    const size_t at = text.rfind("\"val_loss\":");
    return text.substr(at, text.find_first_of(",}", at) - at);
  };
  CHECK(val_of_last_summary(all) == val_of_last_summary(first));
  CHECK(all.find("\"steps\":0,\"summary\":true") != std::string::npos);
  // and an explicit snapshot too; a later step than the snapshot's is still refused as before
  CHECK(run_troupe(tiny_train(s, "run2", 0, " --resume '" + s.path("run/checkpoints/step-00000003") + "'"), s, 180).rc == 0);
  expect_user_error(run_troupe(tiny_train(s, "run", 2, " --resume latest"), s, 180), {"nothing left to train"});
}

TEST_CASE("a number in a message is shown as typed, and 1e309 is named so", "[cli][hostile]") {
  CHECK(message_of(31536001) == "v = 31536001");
  CHECK(message_of(1000001) == "v = 1000001");
  CHECK(message_of(0.5) == "v = 0.5");
  CHECK(message_of(2.5e-7) == "v = 0.00000025");
  CHECK(message_of(2.5e-20) == "v = 2.5e-20");
  CHECK(message_of(1.0 / 3) == "v = 0.3333333333333333");  // every digit: never rounded onto a bound
  CHECK(message_of(604800.0000000001) == "v = 604800.0000000001");
  CHECK(message_of(0.0000001) == "v = 0.0000001");  // plain digits while short (trial 60, F1)
  CHECK(message_of(1e6) == "v = 1000000");
  CHECK(message_of(2e18) == "v = 2e18");  // else a plain exponent, as typed
  CHECK(message_of(1.5e300) == "v = 1.5e300");
  CHECK(message_of(-3.5e-38) == "v = -3.5e-38");
  CHECK(message_of(9223372036854775807.0) == "v = 9223372036854775808");
  CHECK(message_of(1e30) == "v = 1e30");
  CHECK(message_of(2.0 / 3e10) == "v = 6.666666666666667e-11");
  Scratch s(kGroup, "numbers");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set data.lock_timeout_s=31536001 --run-dir '" +
                                   s.path("r") + "'", s),
                    {"data.lock_timeout_s = 31536001;"});
  expect_user_error(run_troupe("plan --config configs/gpt2-124m.toml --set cluster.latency_us=1000001", s),
                    {"cluster.latency_us = 1000001 "});
  expect_user_error(run_troupe("plan --config configs/gpt2-124m.toml --tokens 1e400", s),
                    {"'1e400' is beyond the largest number a double holds"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a schedule file's own fault is named before its microbatch count", "[cli][hostile][schedule]") {
  Scratch s(kGroup, "schedule");
  REQUIRE(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --dump '" + s.path("my.csv") + "'", s).rc == 0);
  std::string text = slurp(s.path("my.csv"));
  const size_t row = text.find("F0,F1,B0,F2,B1,F3");  // stage 0's row: F3 typed as F4
  REQUIRE(row != std::string::npos);
  text.replace(text.find("F3", row), 2, "F4");
  s.write("bad.csv", text);
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set parallel.schedule='" +
                                   s.path("bad.csv") + "' --run-dir '" + s.path("r") + "'", s),
                    {"stage 0 runs B3 before its forward F3"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("simulate --config takes the config's layout, plan without cluster.gpu names a fix that works",
          "[cli][hostile][schedule]") {
  Scratch s(kGroup, "layout");
  Run r = run_troupe("simulate --config configs/tiny.toml --quiet", s);
  REQUIRE(r.rc == 0);
  std::string out = slurp(s.path("stdout.txt"));
  CHECK(out.find("schedule 1f1b: P=2 stages, M=4 microbatches") != std::string::npos);
  CHECK(out.find("(schedule, stages, microbatches from configs/tiny.toml's [parallel]") != std::string::npos);
  CHECK(out.find("4 sequences x 64 tokens per microbatch") != std::string::npos);
  r = run_troupe("simulate --config configs/tiny.toml --quiet --stages 4 --microbatches 8 --schedule gpipe", s);
  REQUIRE(r.rc == 0);
  out = slurp(s.path("stdout.txt"));
  CHECK(out.find("schedule gpipe: P=4 stages, M=8 microbatches") != std::string::npos);
  CHECK(out.find("[parallel]") == std::string::npos);
  // plan: the message's example, followed, plans
  expect_user_error(run_troupe("plan --config configs/tiny.toml", s),
                    {"cluster.gpu is not set", "--set cluster.gpu=cpu", "--set cluster.gpu=a100-80g --set cluster.gpus_per_node=2"});
  CHECK(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=a100-80g --set cluster.gpus_per_node=2", s).rc == 0);
}

TEST_CASE("a run a full disk ends counts the lines train.log lost", "[cli][hostile][disk]") {
  Scratch s(kGroup, "fulldisk");
  const std::string mnt = s.path("mnt");
  std::string body = "'";
  body += troupe_bin();
  body += std::string("' train --config configs/tiny.toml --set train.steps=2000 --set train.sample_tokens=0 ") +
          "--set checkpoint.interval=5 --set checkpoint.keep_last=1 --set data.cache_dir='" + s.path("cache") +
          "' --run-dir '" + mnt + "/run' > /dev/null 2> '" + s.path("err") +
          "' &\np=$!\nfor i in $(seq 1 600); do grep -qE 'step +6/' '" + s.path("err") + "' && break; sleep 0.1; done\n" +
          "dd if=/dev/zero of='" + mnt + "/fill' bs=64k 2>/dev/null || true\n" +
          "if wait $p; then echo 0; else echo $?; fi > '" + s.path("rc") + "'\n";
  std::string why;
  if (!run_on_tmpfs(s, mnt, 40, body, &why)) {
    WARN("skipped: cannot mount a tmpfs in a mount namespace here: " << why);
    return;
  }
  const std::string err = slurp(s.path("err"));
  INFO("stderr: " << err << "\ntmpfs.log: " << slurp(s.path("tmpfs.log")));
  CHECK(std::atoi(slurp(s.path("rc")).c_str()) == 2);
  CHECK(err.find("snapshots failed") != std::string::npos);
  CHECK(err.find("line(s) of the log could not be written to train.log (No space left on device)") != std::string::npos);
}
