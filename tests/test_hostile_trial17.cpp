// Hostile inputs, issue 14's seventeenth trial (a fresh reviewer's 119 cases): its five
// mediums — simulate --config with more chunks than layers (M1), data.corpus beside
// [[data.sources]] (M2), plot under ulimit -f 0 (M3), a 1-second hard CPU limit (M4), an
// unreadable /proc tokenizer (M5) — and its lows, each now one sentence naming the fix.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial17";

// A config of the blend form: one jsonl source at `jsonl`, plus `extra` lines in [data].
std::string blend_config(const Scratch& s, const std::string& jsonl, const std::string& extra) {
  return s.write("blend.toml", "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 128\nvocab_size = 300\n"
                               "[data]\ncache_dir = '" + s.path("cache") + "'\n" + extra +
                               "\n[[data.sources]]\nname = 'j'\nformat = 'jsonl'\npath = '" + jsonl + "'\n");
}
}  // namespace

TEST_CASE("simulate --config refuses more stages x chunks than the model has layers", "[cli][hostile][schedule]") {
  Scratch s(kGroup, "simlayers");
  expect_user_error(run_troupe("simulate --schedule 1f1b --stages 8 --microbatches 8 --config configs/tiny.toml --quiet", s),
                    {"8 model chunks, but model.n_layer = 4", "use stages x chunks <= 4"});
  expect_user_error(
      run_troupe("simulate --schedule interleaved --stages 2 --microbatches 4 --chunks 4 --config configs/tiny.toml --quiet", s),
      {"2 stages (--stages) x 4 chunk(s) (--chunks) = 8 model chunks"});
  // without --config the default model's table says it has no bytes to show, not 0
  const Run r = run_troupe("simulate --schedule 1f1b --stages 16 --microbatches 16 --quiet", s);
  CHECK(r.rc == 0);
  const std::string out = slurp(s.path("stdout.txt"));
  CHECK(out.find("n/a") != std::string::npos);
  CHECK(out.find("no activation bytes") != std::string::npos);
}

TEST_CASE("a config's data sources: data.corpus beside them, an empty list, a JSON line that is no object",
          "[cli][hostile][blend]") {
  Scratch s(kGroup, "sources");
  const std::string arr = s.write("arr.jsonl", "[\"text\"]\n");
  expect_user_error(run_troupe("train --config '" + blend_config(s, arr, "corpus = 'nope.txt'") + "'", s),
                    {"sets both data.corpus and [[data.sources]]", "remove data.corpus"});
  const std::string empty = s.write("empty.toml", "[data]\nsources = []\n");
  expect_user_error(run_troupe("prepare --config '" + empty + "'", s), {"data.sources", "is an empty list"});
  expect_user_error(run_troupe("prepare --config '" + blend_config(s, arr, "") + "'", s),
                    {"line 1 of", "is a JSON array, not an object"});
  expect_user_error(run_troupe("train --config '" + blend_config(s, arr, "") + "' --set data.corpus=x.txt", s),
                    {"--set data.corpus", "[[data.sources]]"});
  CHECK_FALSE(fs::exists(s.path("cache")));
}

TEST_CASE("limits and devices named as such: plot under ulimit -f 1, a 1-second CPU limit, a /proc tokenizer, a device corpus",
          "[cli][hostile]") {
  Scratch s(kGroup, "limits");
  fs::create_directories(s.path("p"));
  s.write("p/metrics.jsonl", "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n");
  const Run f = run_troupe("plot '" + s.path("p") + "' --out '" + s.path("p.png") + "'", s, 60, "ulimit -f 1;");
  expect_user_error(f, {"gnuplot's script", "ulimit -f"});
  CHECK_FALSE(fs::exists(s.path("p.png")));
  expect_user_error(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet", s, 60, "ulimit -t 1;"),
                    {"CPU-time limit (ulimit -t) is 1 s", "raise it"});
  if (fs::exists("/proc/self/mem"))
    expect_user_error(run_troupe("train --config configs/tiny.toml --set data.tokenizer=/proc/self/mem --set "
                                 "data.cache_dir='" + s.path("c") + "'", s),
                      {"cannot read tokenizer model file", "point data.tokenizer at"});
  if (fs::exists("/dev/zero"))
    expect_user_error(run_troupe("train --config configs/tiny.toml --set data.corpus=/dev/zero", s),
                      {"is not a regular file (a device, a FIFO or a socket"});
}

TEST_CASE("options and arguments: spaces around '=', a picture named .svg, two run directories, a URL coordinator, "
          "an empty required argument",
          "[cli][hostile]") {
  Scratch s(kGroup, "options");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'model.n_layer = 4'", s),
                    {"has spaces around '='", "--set model.n_layer=4"});
  fs::create_directories(s.path("p"));
  s.write("p/metrics.jsonl", "{\"step\":1,\"loss\":3}\n");
  expect_user_error(run_troupe("plot '" + s.path("p") + "' --out '" + s.path("x.svg") + "'", s),
                    {"PNG pictures only", "name the file .png"});
  CHECK_FALSE(fs::exists(s.path("x.svg")));
  expect_user_error(run_troupe("plot '" + s.path("p") + "' '" + s.path("p") + "'", s),
                    {"troupe plot got argument(s) it does not take"});
  expect_user_error(run_troupe("launch --nprocs 2 --coordinator http://127.0.0.1:29901 -- /bin/true", s),
                    {"holds a URL or a path", "HOST:PORT"});
  expect_user_error(run_troupe("export x ''", s), {"the OUT argument of troupe export is empty", "give it a value ("});
  const Run c = run_troupe("prepare --config ''", s);
  expect_user_error(c, {"--config of troupe prepare is empty"});
  CHECK(c.err.find("leave it out") == std::string::npos);
}

TEST_CASE("paths: --resume latest without a run directory, a path through a file, an output under a link loop, "
          "a value quoted as typed",
          "[cli][hostile]") {
  Scratch s(kGroup, "paths");
  const Run r = run_troupe("train --config configs/tiny.toml --resume latest", s);
  expect_user_error(r, {"--resume latest continues the run in --run-dir, but none was given"});
  expect_user_error(run_troupe("train --config configs/tiny.toml/../tiny.toml", s),
                    {"goes through the file 'configs/tiny.toml' as if it were a folder"});
  fs::create_symlink(s.path("l2"), s.path("l1"));
  fs::create_symlink(s.path("l1"), s.path("l2"));
  expect_user_error(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet --trace '" +
                                   s.path("l1/x.json") + "'", s),
                    {"is a loop of symbolic links"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set parallel.dp_bucket_mb=1048577", s),
                    {"parallel.dp_bucket_mb = 1048577 must be"});
}

TEST_CASE("plan --calibrate names a trace.json that is a device and a simulated schedule's trace", "[cli][hostile][plan]") {
  Scratch s(kGroup, "calib");
  fs::create_directories(s.path("dev"));
  fs::copy_file(fs::path(TROUPE_SOURCE_DIR) / "configs/tiny.toml", s.path("dev/config.toml"));
  fs::create_symlink("/dev/zero", s.path("dev/trace.json"));
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("dev") + "'", s),
                    {"trace.json is not a regular file"});
  fs::create_directories(s.path("sim"));
  fs::copy_file(fs::path(TROUPE_SOURCE_DIR) / "configs/tiny.toml", s.path("sim/config.toml"));
  REQUIRE(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet --trace '" + s.path("sim/trace.json") + "'", s)
              .rc == 0);
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("sim") + "'", s),
                    {"is a simulated schedule's trace"});
}

TEST_CASE("a data cache without its tokenizer.model is named damaged with the file missing, not a path to set",
          "[cli][hostile]") {
  Scratch s(kGroup, "cache");
  const std::string args = "train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                           "--set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path("run") + "'";
  REQUIRE(run_troupe(args, s).rc == 0);
  std::string cache;
  for (auto& e : fs::directory_iterator(s.path("c")))
    if (e.is_directory()) cache = e.path().string();
  REQUIRE_FALSE(cache.empty());
  fs::remove(cache + "/tokenizer.model");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set data.cache_dir='" + s.path("c") +
                               "' --run-dir '" + s.path("run2") + "'", s);
  expect_user_error(r, {"is damaged: tokenizer.model is missing", "delete that folder"});
  CHECK(r.err.find("set the path") == std::string::npos);
}
