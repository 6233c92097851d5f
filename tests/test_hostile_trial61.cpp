// Hostile inputs, issue 14: trial 61's findings. Advice to change the microbatch count
// left the batch size it also needs unsaid: interleaved's list of microbatch counts held
// ones that are not multiples of pp (L1), a schedule file's "set parallel.microbatches"
// and interleaved's nearest multiples named counts the batch cannot be split into (L2);
// plan took a fraction of a token (L3).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"
#include "core/text.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial61";
}  // namespace

TEST_CASE("advice on the microbatch count names counts the schedule and the batch both take", "[cli][hostile][schedule]") {
  Scratch s(kGroup, "mb");
  const std::string run = " --run-dir '" + s.path("r") + "'";
  const std::string inter = "train --config configs/tiny.toml --set parallel.schedule=interleaved --set parallel.chunks=2 ";
  // L1: batch 16 over 3 microbatches; interleaved with pp = 2 takes even counts only
  expect_user_error(run_troupe(inter + "--set parallel.microbatches=3" + run, s), {"microbatches in {2, 4, 8, 16}"});
  // L2: batch 6 splits into 3, but interleaved wants a multiple of 2 that 6 divides into: 2 or 6, not 4
  expect_user_error(run_troupe(inter + "--set parallel.microbatches=3 --set train.batch_size=6" + run, s),
                    {"use parallel.microbatches = 2 or 6,"});
  // batch 2 over dp = 2: one sequence per replica, so no multiple of pp = 2 fits; the batch is named
  expect_user_error(run_troupe(inter + "--set parallel.microbatches=1 --set train.batch_size=2 --set parallel.dp=2" + run, s),
                    {"use parallel.microbatches = 2 and train.batch_size = 4 (a multiple of parallel.dp x "
                     "parallel.microbatches = 4)"});
  // L2: a schedule file for 3 microbatches beside a batch of 16
  const std::string three = s.write("three.csv", "F0,F1,F2,B0,B1,B2\nF0,B0,F1,B1,F2,B2\n");
  const std::string sched = "train --config configs/tiny.toml --set parallel.schedule='" + three + "'";
  expect_user_error(run_troupe(sched + run, s),
                    {"set parallel.microbatches = 3 and train.batch_size = 18 (a multiple of 3)"});
  // following it trains
  const Run ok = run_troupe(tiny_train(s, "ok", 1, " --set parallel.schedule='" + three +
                                                       "' --set parallel.microbatches=3 --set train.batch_size=18"), s);
  INFO(ok.err);
  CHECK(ok.rc == 0);
  CHECK(ok.err.find("error:") == std::string::npos);
  // a batch the file's count divides: no batch size named
  expect_user_error(run_troupe(sched + " --set train.batch_size=12" + run, s), {"set parallel.microbatches = 3, or write"});
}

TEST_CASE("plan counts whole tokens", "[cli][hostile][plan]") {
  Scratch s(kGroup, "tokens");
  const std::string plan = "plan --config configs/tiny.toml --set cluster.gpu=a100-80g --set cluster.gpus_per_node=2 ";
  expect_user_error(run_troupe(plan + "--tokens 1.5", s), {"--tokens 1.5 is not a whole number of tokens", "--tokens 2"});
  CHECK(run_troupe(plan + "--tokens 2.7e11", s).rc == 0);
}

TEST_CASE("text helpers: join, and UTF-8 read as a decoder reads it", "[cli][hostile]") {
  using troupe::join;
  CHECK(join({}, " or ").empty());
  CHECK(join({"a"}, " or ") == "a");
  CHECK(join({"a", "b", "c"}, ", ") == "a, b, c");
  uint32_t cp = 0;
  // a C1 control is UTF-8 to a decoder, though printable() escapes it
  CHECK(troupe::valid_utf8_at("\xC2\x9B", 0, &cp) == 2);
  CHECK(cp == 0x9B);
  CHECK(troupe::utf8_at("\xC2\x9B", 0, &cp) == 0);
  CHECK(troupe::valid_utf8_at("\xD0\xB0", 0, &cp) == 2);  // Cyrillic a
  CHECK(cp == 0x430);
  CHECK(troupe::valid_utf8_at("\xC0\x80", 0, &cp) == 0);  // overlong NUL
  CHECK(troupe::valid_utf8_at("\xED\xA0\x80", 0, &cp) == 0);  // a surrogate
  CHECK(troupe::valid_utf8_at("\xE2\x82", 0, &cp) == 0);  // cut short
  // a look-alike letter in a key is named by its code point, an overlong byte as a byte
  Scratch s(kGroup, "utf8");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set tr\xD0\xB0in.steps=3 --run-dir '" + s.path("r") + "'", s),
                    {"its character 3 is U+0430"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set tr\xC0\x80in.steps=3 --run-dir '" + s.path("r") + "'", s),
                    {"its character 3 is the byte 0xC0"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a --set key in TOML quotes names the key a config file would", "[cli][hostile][config]") {
  Scratch s(kGroup, "quoted");
  const std::string train = "train --config configs/tiny.toml --run-dir '" + s.path("r") + "' --set ";
  expect_user_error(run_troupe(train + "'train.\"steps\"=-1'", s), {"train.steps = -1 must be >= 0"});
  expect_user_error(run_troupe(train + "\"'train'.steps=-1\"", s), {"train.steps = -1 must be >= 0"});
  // one quoted part holding a dot is one key, as in a file: unknown, with the key meant named
  expect_user_error(run_troupe(train + "'\"train.steps\"=1'", s), {"unknown config key", "did you mean train.steps?"});
  expect_user_error(run_troupe(train + "'train.\"ste ps\"=1'", s), {"unknown config key"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a decimal with more digits than a double holds is quoted as typed when its key is refused",
          "[cli][hostile][config]") {
  Scratch s(kGroup, "digits");
  const std::string run = " --run-dir '" + s.path("r") + "'";
  const char* const said = "optim.beta2 = 0.99999999999999999 (read as 1: a double holds about 16 significant digits)";
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.beta2=0.99999999999999999" + run, s),
                    {said, "must be in [0, 1)"});
  const std::string file = s.write("b2.toml", "[optim]\nbeta2 = 0.99999999999999999\n");
  expect_user_error(run_troupe("train --config '" + file + "'" + run, s), {said});
  // a --set of the key replaces the file's text
  expect_user_error(run_troupe("train --config '" + file + "' --set optim.beta2=2" + run, s), {"optim.beta2 = 2 must"});
  // digits a double holds are quoted as they read
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.beta2=1.000" + run, s), {"optim.beta2 = 1 must"});
  CHECK_FALSE(fs::exists(s.path("r")));
}
