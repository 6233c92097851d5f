// Hostile inputs, issue 14: what the fresh-user checks of session 22 found and left. A fresh
// run in a folder whose newest snapshot is damaged was told to "--resume latest" from it; the
// all-damaged refusal repeated "use another snapshot" per snapshot before its fix;
// `simulate --stages 0` did not name --stages; a folder given as a PNG output suggested
// DIR/out without .png. And the one test of "a prepared data cache" the outputs, the run
// directory and data.cache_dir share.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"
#include "datasets/cache_folder.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-leftovers";

void cut_shard(const std::string& snap) {
  for (const auto& e : fs::directory_iterator(snap))
    if (e.path().filename().string().rfind("shard-", 0) == 0) fs::resize_file(e.path(), 10);
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("a fresh run beside damaged snapshots is told the advice that works", "[cli][hostile]") {
  Scratch s(kGroup, "damaged");
  REQUIRE(run_troupe(tiny_train(s, "run", 2), s).rc == 0);
  cut_shard(s.path("run/checkpoints/step-00000002"));
  // the newest is damaged, an older one is complete: --resume latest starts from that one
  expect_user_error(run_troupe(tiny_train(s, "run", 3), s),
                    {"newest complete: step 1; the newer step 2 is damaged", "it starts from step 1"});
  cut_shard(s.path("run/checkpoints/step-00000001"));
  expect_user_error(run_troupe(tiny_train(s, "run", 3), s),
                    {"none of them complete (newest: step 2", "move them out of"});
  // --resume latest refuses both, and says "use another snapshot" at most once
  const Run r = run_troupe(tiny_train(s, "run", 3, " --resume latest"), s);
  expect_user_error(r, {"every one was refused", "move the refused snapshots out of"});
  CHECK(count(r.err, "use another snapshot") <= 1);
  // the damaged snapshots are where they were
  CHECK(fs::file_size(s.path("run/checkpoints/step-00000002/manifest.capnp")) > 0);
}

TEST_CASE("simulate names the flag of a size below one, a folder output suggests a file of its kind",
          "[cli][hostile]") {
  Scratch s(kGroup, "flags");
  expect_user_error(run_troupe("simulate --stages 0", s), {"--stages must be >= 1 (got 0)", "set --stages 1 or more"});
  expect_user_error(run_troupe("simulate --microbatches -3", s), {"--microbatches must be >= 1 (got -3)"});
  expect_user_error(run_troupe("simulate --schedule interleaved --chunks 0", s), {"--chunks must be >= 1"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set parallel.microbatches=0 --run-dir '" +
                                   s.path("r") + "'",
                               s),
                    {"parallel.microbatches"});
  CHECK_FALSE(fs::exists(s.path("r")));
  fs::create_directories(s.path("pics"));
  expect_user_error(run_troupe("simulate --quiet --png '" + s.path("pics") + "'", s),
                    {"is a directory", "pics/out.png"});
  expect_user_error(run_troupe("simulate --quiet --png '" + s.path("pics") + "/'", s), {"pics/out.png"});
  expect_user_error(run_troupe("simulate --quiet --trace '" + s.path("pics") + "'", s), {"pics/out.json"});
  CHECK(fs::is_empty(s.path("pics")));
}

TEST_CASE("a prepared data cache is one test for outputs, run directories and data.cache_dir", "[cli][hostile]") {
  Scratch s(kGroup, "cache");
  const std::string c = s.path("c/abc-v512");
  fs::create_directories(c + "/sub");
  CHECK_FALSE(troupe::is_prepared_cache(c));
  std::ofstream(c + "/meta.json") << "{}";
  CHECK_FALSE(troupe::is_prepared_cache(c));  // meta.json alone: no cache
  for (const char* f : {"tokenizer.model", "corpus.train.bin", "corpus.train.idx"}) {
    fs::remove(c + "/tokenizer.model");
    fs::remove(c + "/corpus.train.bin");
    fs::remove(c + "/corpus.train.idx");
    std::ofstream(c + "/" + f) << "x";
    CHECK(troupe::is_prepared_cache(c));
  }
  CHECK(troupe::prepared_cache_around(c + "/sub/x.json") == c);
  CHECK(troupe::prepared_cache_around(c) == c);
  CHECK(troupe::prepared_cache_around(s.path("c")).empty());
  CHECK(troupe::prepared_cache_around(s.path("c/other/x")).empty());
  // each of the three refusals uses it
  expect_user_error(run_troupe("simulate --quiet --trace '" + c + "/sub/t.json'", s), {"lies inside the data cache"});
  expect_user_error(run_troupe(tiny_train(s, "r", 1) + " --set data.cache_dir='" + c + "/sub'", s),
                    {"lies inside the prepared data cache"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir '" + s.path("c") + "'", s),
                    {"holds the prepared data cache"});
  CHECK_FALSE(fs::exists(s.path("r")));
  CHECK_FALSE(fs::exists(s.path("c/config.toml")));
}

TEST_CASE("fresh-user check 3: the words of a misspelled variable, a missing run, help and the report's copy",
          "[cli][hostile]") {
  Scratch s(kGroup, "fresh3");
  const Run r = run_troupe(tiny_train(s, "r", 1), s, 120, "env TROUPE_GEM=blis");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("a misspelling of TROUPE_GEMM") != std::string::npos);
  expect_user_error(run_troupe("plot '" + s.path("nope") + "'", s), {"does not exist"});
  CHECK(run_troupe("help train", s).rc == 0);
  CHECK(slurp(s.path("stdout.txt")).find("Usage: troupe train [OPTIONS]") != std::string::npos);
  CHECK(run_troupe("help", s).rc == 0);
  CHECK(slurp(s.path("stdout.txt")).find("Usage: troupe [OPTIONS]") != std::string::npos);
  // prepare --report's copy names the removed documents' copy beside it
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "' --report '" +
                         s.path("rep.json") + "'",
                     s)
              .rc == 0);
  CHECK(slurp(s.path("rep.json")).find("\"removed_samples\": \"" + s.path("rep.removed.jsonl") + "\"") !=
        std::string::npos);
  // a path given in the same words as the config's is not quoted twice
  expect_user_error(run_troupe("simulate --quiet --trace tests/data/tiny_corpus.txt --config configs/tiny.toml", s),
                    {"--trace tests/data/tiny_corpus.txt is a file this command reads or writes"});
}
