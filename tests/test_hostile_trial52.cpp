// Hostile inputs, issue 14: trial 52's findings. generate --logits-out, plot --out and
// simulate --dump wrote over a prepared data cache's files (meta.json, the token files),
// which export already refused; an empty [[data.sources]] table was said to have name = "".
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial52";
}  // namespace

TEST_CASE("no output lands inside a prepared data cache", "[cli][hostile][data]") {
  Scratch s(kGroup, "cache");
  REQUIRE(run_troupe(tiny_train(s, "run", 1), s).rc == 0);
  std::string cache;
  for (const auto& e : fs::directory_iterator(s.path("cache")))
    if (fs::exists(e.path() / "meta.json")) cache = e.path().string();
  REQUIRE(!cache.empty());
  const std::string meta = slurp(cache + "/meta.json");
  const std::string snap = s.path("run/checkpoints/step-00000001");
  for (const std::string& cmd : {"generate '" + snap + "' --tokens 1 --logits-out '" + cache + "/meta.json'",
                                 "simulate --dump '" + cache + "/corpus.val.idx'",
                                 "plot '" + s.path("run") + "' --out '" + cache + "/report.png'",
                                 "export '" + snap + "' '" + cache + "/m.safetensors'"}) {
    const Run r = run_troupe(cmd, s);
    INFO(cmd << "\n" << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find("lies inside") != std::string::npos);
  }
  CHECK(slurp(cache + "/meta.json") == meta);
  CHECK_FALSE(fs::exists(cache + "/report.png"));
  // an empty [[data.sources]] table has no name (not name = "")
  s.write("src.toml", "[[data.sources]]\n");
  expect_user_error(run_troupe("prepare --config '" + s.path("src.toml") + "'", s),
                    {"data.sources[0] has no name; give each source a name"});
}

TEST_CASE("a refused --set value is said alone, and a misspelled schedule is an unknown name", "[cli][hostile]") {
  Scratch s(kGroup, "fresh");
  // the last of two --set of one key is malformed: the error alone, not "the last one is used" first
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=2 --set train.steps --run-dir '" +
                               s.path("run") + "'",
                           s);
  expect_user_error(r, {"--set 'train.steps' must look like section.key=value"});
  CHECK(r.err.find("note:") == std::string::npos);
  expect_user_error(run_troupe("simulate --schedule 2f2b --stages 4", s),
                    {"unknown schedule '2f2b'; use gpipe, 1f1b, interleaved, zb-h1 or a path to a schedule file"});
}
