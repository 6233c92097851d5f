// Hostile inputs, issue 14's twelfth trial (a fresh reviewer's 270 cases, /work/notes/trial12.md):
// a value quoted in an error line can no longer break it (M1), plot of a run without a finite
// loss (M2), a peak cache no core reaches (M3, in test_gemm_libs), simulate outputs that would
// be dropped (M5), a shard or metrics.jsonl that is not a regular file (L1, L2), an underflowing
// --set (L3), CLI11's words (L6), the --prompt offset (L7), TROUPE_EVENT_LOG a folder (L8),
// gnuplot markup in a title (L10), a data cache inside a snapshot (L11).
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial12";

// A finished tiny run (2 steps, a snapshot at step 2) in s/run, its data cache in s/cache.
std::string tiny_run(const Scratch& s) {
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=2 --set checkpoint.interval=2 "
                           "--set train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                               s.path("run") + "'",
                           s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  return s.path("run");
}
}  // namespace

TEST_CASE("a newline or an escape in an environment variable or a launch flag stays on the one error line",
          "[cli][hostile]") {
  Scratch s(kGroup, "newline");
  // (/bin/sh has no $'...': printf makes the bytes) a path with a newline is refused (L9) ...
  const Run cache = run_troupe("train --config configs/tiny.toml --set train.steps=2", s, 60,
                               "env TROUPE_CACHE_DIR=\"$(printf '/tmp/x/c\\nd')\"");
  expect_user_error(cache, {"environment variable TROUPE_CACHE_DIR", "holds a control character", "plain path"});
  CHECK_FALSE(fs::exists("/tmp/x/c\nd"));
  // ... and any other value quoted in a sentence shows its newline and escape as \x0A, \x1B (M1)
  for (const char* env : {"TROUPE_LAUNCH_ID=\"$(printf 'a\\nb')\"",
                          "TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=127.0.0.1:29501 TROUPE_RANK=\"$(printf '1\\033[2J\\n1')\""}) {
    const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=2", s, 60, std::string("env ") + env);
    expect_user_error(r, {"\\x0A"});
    CHECK(r.err.find('\x1b') == std::string::npos);
  }
  // a flag's value quoted in a sentence: the newline is shown as \x0A, the line stays one
  const Run l = run_troupe("launch --nprocs \"$(printf '2\\n\\033[31m')\" -- /bin/true", s, 60);
  expect_user_error(l, {"--nprocs", "\\x0A"});
  CHECK(l.err.find('\x1b') == std::string::npos);
}

TEST_CASE("plot of a run whose losses are all null draws the other panels and says why the loss panels are empty",
          "[cli][hostile]") {
  Scratch s(kGroup, "plotnull");
  fs::create_directories(s.path("p"));
  s.write("p/metrics.jsonl", "{\"step\":1,\"loss\":null,\"lr\":0.001}\n{\"step\":2,\"loss\":\"abc\",\"lr\":0.002}\n"
                             "{\"step\":2,\"val_loss\":null}\n");
  const Run r = run_troupe("plot '" + s.path("p") + "'", s, 60);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("holds no finite loss") != std::string::npos);
  CHECK(r.err.find("troupe-gnuplot") == std::string::npos);
  CHECK(fs::file_size(s.path("p/plot.png")) > 1000);
  // a metrics.jsonl that is a FIFO is named as such, not as missing (L2)
  fs::create_directories(s.path("q"));
  REQUIRE(::mkfifo(s.path("q/metrics.jsonl").c_str(), 0644) == 0);
  expect_user_error(run_troupe("plot '" + s.path("q") + "'", s, 60), {"is not a regular file"});
  // a title is drawn as typed: gnuplot's markup (_ ^ @ {}) is off (L10), no picture check here
  // beyond that it draws
  const Run t = run_troupe("plot '" + s.path("p") + "' --title 'my_run^2' --out '" + s.path("t.png") + "'", s, 60);
  CHECK(t.rc == 0);
}

TEST_CASE("simulate refuses a --trace or --png beside --dump, and '-' as a file output", "[cli][hostile]") {
  Scratch s(kGroup, "simdash");
  const std::string sim = "simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet ";
  expect_user_error(run_troupe(sim + "--dump - --trace '" + s.path("t.json") + "'", s, 60),
                    {"--dump writes the schedule and exits", "--trace"});
  expect_user_error(run_troupe(sim + "--trace -", s, 60), {"--trace -", "not standard output", "./-"});
  CHECK_FALSE(fs::exists(std::string(TROUPE_SOURCE_DIR) + "/-"));
}

TEST_CASE("a snapshot shard that is a FIFO is named as not a regular file, not as missing", "[cli][hostile]") {
  Scratch s(kGroup, "shardfifo");
  const std::string run = tiny_run(s);
  const std::string snap = run + "/checkpoints/step-00000002";
  std::string shard;
  for (auto& e : fs::directory_iterator(snap))
    if (e.path().filename().string().rfind("shard-", 0) == 0) shard = e.path().string();
  REQUIRE(!shard.empty());
  fs::remove(shard);
  REQUIRE(::mkfifo(shard.c_str(), 0644) == 0);
  expect_user_error(run_troupe("export '" + snap + "' '" + s.path("o.safetensors") + "'", s, 60),
                    {"is not a regular file", "use another snapshot"});
  CHECK_FALSE(fs::exists(s.path("o.safetensors")));
  // a data cache inside a snapshot is refused before anything is written there (L11)
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2 --set data.cache_dir='" + snap +
                                   "/cache' --run-dir '" + s.path("r2") + "'",
                               s, 60),
                    {"data.cache_dir", "inside the snapshot"});
  CHECK_FALSE(fs::exists(snap + "/cache"));
  CHECK_FALSE(fs::exists(s.path("r2")));
}

TEST_CASE("the words of values: an underflowing --set, CLI11's mismatches, the --prompt offset, TROUPE_EVENT_LOG",
          "[cli][hostile]") {
  Scratch s(kGroup, "words");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.lr=1e-400", s, 60),
                    {"optim.lr", "1e-400", "smallest number a double holds"});
  // a refused --set value is quoted as typed, not as TOML's reading of it (trial 13, LN2)
  expect_user_error(run_troupe("train --config configs/tiny.toml --set model.n_layer=1e9", s, 60),
                    {"model.n_layer", "got '1e9'"});
  // digits past 64 bits are an integer out of range, not "not an integer" (trial 14, L2)
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=9223372036854775808", s, 60),
                    {"train.steps", "a 32-bit integer (at most 2147483647)"});
  const std::string snap = tiny_run(s) + "/checkpoints/step-00000002";
  const std::string gen = "generate '" + snap + "' --tokens 2 ";
  const Run seed = run_troupe(gen + "--seed 1.5", s, 60);
  expect_user_error(seed, {"--seed", "a whole number", "1.5"});
  CHECK(seed.err.find("INT:INT") == std::string::npos);
  const Run topk = run_troupe(gen + "--top-k 99999999999", s, 60);
  expect_user_error(topk, {"--top-k", "a whole number in range"});
  CHECK(topk.err.find("INT:INT") == std::string::npos);
  expect_user_error(run_troupe(gen + "--logits-out '" + s.path("a.json") + "' --logits-out '" + s.path("b.json") + "'", s, 60),
                    {"--logits-out", "takes one value", "pass it once"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --resume", s, 60), {"--resume", "needs a value"});
  // a missing positional argument is named with what it is (trial 14, L3)
  expect_user_error(run_troupe("export '" + snap + "'", s, 60), {"troupe export needs its OUT argument"});
  expect_user_error(run_troupe(gen + "--prompt \"$(printf '\\377ab')\"", s, 60), {"--prompt", "byte offset 0", "0xff"});
  // TROUPE_EVENT_LOG a folder: said once, the run goes on
  const Run ev = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                            "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("evrun") + "'",
                            s, 120, "env TROUPE_EVENT_LOG='" + s.dir.string() + "'");
  INFO(ev.err);
  CHECK(ev.rc == 0);
  CHECK(ev.err.find("TROUPE_EVENT_LOG=" + s.dir.string() + " is not a regular file") != std::string::npos);
}

// The thirteenth trial (/work/notes/trial13.md): MN1, LN1, LN4, LN5, LN6.
TEST_CASE("a UTF-16 or NUL-filled corpus is named as such, a /proc file as sizeless, ulimit -f as the cause, an "
          "unwritable peak cache said once",
          "[cli][hostile]") {
  Scratch s(kGroup, "trial13");
  const std::string prep = "prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "' ";
  std::string le, bom = "\xFF\xFE";
  for (char ch : std::string("Four score and seven years ago.\nOur fathers brought forth.\n")) le += ch, le += '\0';
  s.write("u16le.txt", le);
  s.write("u16bom.txt", bom + le);
  expect_user_error(run_troupe(prep + "--set data.corpus='" + s.path("u16le.txt") + "'", s, 60),
                    {"holds NUL bytes", "iconv -f UTF-16 -t UTF-8"});
  expect_user_error(run_troupe(prep + "--set data.corpus='" + s.path("u16bom.txt") + "'", s, 60),
                    {"UTF-16 byte-order mark", "iconv -f UTF-16 -t UTF-8"});
  s.write("u32.txt", std::string("\xFF\xFE\0\0", 4) + "x");
  expect_user_error(run_troupe(prep + "--set data.corpus='" + s.path("u32.txt") + "'", s, 60),
                    {"UTF-32 byte-order mark", "iconv -f UTF-32 -t UTF-8"});
  expect_user_error(run_troupe(prep + "--set data.corpus=/proc/self/status", s, 60),
                    {"lies on proc (/proc)", "point data.corpus at a text file on disk"});  // (trial 38)
  // nothing of the refused preparations is left in the cache
  if (fs::exists(s.path("cache"))) CHECK(fs::is_empty(s.path("cache")));
  // the file-size limit named as the cause of a failed write (generate --logits-out)
  const std::string snap = tiny_run(s) + "/checkpoints/step-00000002";
  const Run f = run_troupe("generate '" + snap + "' --tokens 2 --logits-out '" + s.path("l.json") + "'", s, 60,
                           "ulimit -f 4;");  // (2 KiB under sh: room for stderr, not for the logits)
  expect_user_error(f, {"raise ulimit -f"});
  CHECK_FALSE(fs::exists(s.path("l.json")));
  // a peak cache that cannot be written: one warning, the run goes on
  s.write("afile", "x");
  const Run p = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                           "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("pk") + "'",
                           s, 120, "env TROUPE_CACHE_DIR='" + s.path("afile") + "'");
  INFO(p.err);
  CHECK(p.rc == 0);
  CHECK(p.err.find("cannot write the peak cache") != std::string::npos);
}

TEST_CASE("a fresh run naming a checkpoint.dir a live run writes is told that run is live, not that it is earlier",
          "[cli][hostile]") {
  Scratch s(kGroup, "liveckpt");
  const std::string common = "train --config configs/tiny.toml --set train.sample_tokens=0 --set data.cache_dir='" +
                             s.path("cache") + "' --set checkpoint.dir='" + s.path("ck") + "' --set checkpoint.interval=1 ";
  const std::string b = "'" + troupe_bin() + "' " + common + "--set train.steps=3 --run-dir '" + s.path("B") +
                        "' > /dev/null 2> '" + s.path("B.err") + "'; echo $? > '" + s.path("B.rc") + "'";
  const Run a = run_and_signal(s, common + "--set train.steps=100000 --run-dir '" + s.path("A") + "'", "step +2/",
                               b + "; kill -TERM $p");
  INFO(a.err);
  CHECK(a.rc == 0);
  const Run rb{std::atoi(slurp(s.path("B.rc")).c_str()), slurp(s.path("B.err"))};
  expect_user_error(rb, {"is in use by another troupe run", "wait for it to end"});
  CHECK_FALSE(fs::exists(s.path("B")));
}

// The fifteenth trial (/work/notes/trial15.md): M2 a schedule file with a byte-order mark, M3 a
// CPU-time limit whose soft and hard limits are equal.
TEST_CASE("a schedule file with a UTF-8 byte-order mark reads as without it, and ulimit -t ends training with a "
          "sentence, not SIGKILL",
          "[cli][hostile]") {
  Scratch s(kGroup, "trial15");
  const std::string plain = "F0,F1\nF0,F1\n";
  s.write("plain.csv", plain);
  s.write("bom.csv", "\xEF\xBB\xBF" + plain);
  const Run a = run_troupe("simulate --schedule '" + s.path("plain.csv") + "' --quiet", s, 60);
  const std::string out_a = slurp(s.path("stdout.txt"));
  const Run b = run_troupe("simulate --schedule '" + s.path("bom.csv") + "' --quiet", s, 60);
  INFO(a.err << b.err);
  CHECK(a.rc == b.rc);
  CHECK(b.err.find("cannot read cell") == std::string::npos);
  CHECK(slurp(s.path("stdout.txt")) == out_a);
  // (sh's ulimit -t sets the soft and hard limits alike; troupe lowers the soft one so SIGXCPU comes first)
  const Run t = run_troupe("train --config configs/tiny.toml --set train.steps=100000 --set train.sample_tokens=0 "
                           "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("r") + "'",
                           s, 120, "ulimit -t 3;");
  INFO(t.err);
  CHECK(t.rc != 137);
  CHECK(t.err.find("SIGXCPU") != std::string::npos);
  // said at the start too (trial 49, L4): such a limit cannot be met with a save
  CHECK(t.err.find("warning: the CPU-time limit (ulimit -t) is 2 s with 1 s below its hard limit") != std::string::npos);
}

TEST_CASE("a gzip corpus is named as compressed, and an unknown option as unknown", "[cli][hostile]") {
  Scratch s(kGroup, "gzip");
  s.write("c.txt.gz", std::string("\x1F\x8B\x08\x00\x00\x00\x00\x00\x00\x03", 10) + "garbage");
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") +
                                   "' --set data.corpus='" + s.path("c.txt.gz") + "'",
                               s, 60),
                    {"gzip", "-compressed, not text", "gunzip -k"});
  const Run u = run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 2 --top-p 1.5", s, 60);
  expect_user_error(u, {"troupe simulate has no option --top-p", "troupe help simulate"});
}
