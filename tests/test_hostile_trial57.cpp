// Hostile inputs, issue 14: trial 57's findings. A config whose invalid UTF-8 byte starts a
// line was named one line early (F1); the advice for a run directory holding a data cache
// moved the cache onto itself when the run directory was ./data (F2); an output path that is
// a dangling link was told about terminals and devices (F4). And misspelled keys are named.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"
#include "core/text.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial57";
}  // namespace

TEST_CASE("a config's invalid UTF-8 byte is named on its own line, with the conversion", "[cli][hostile]") {
  Scratch s(kGroup, "utf8");
  // at the start of line 3, after a C1 control (valid UTF-8) in a comment, and inside a string
  const std::string starts = s.write("starts.toml", "[train]\nsteps=2\n\xff = 1\n");
  const std::string after_c1 = s.write("c1.toml", "[train]\n# \xc2\x85 x\nsteps=2\n\n\xfe = 1\n");
  const std::string inside = s.write("inside.toml", "[train]\nsteps=2\nx = \"\xff\"\n");
  for (const auto& [file, line] : {std::pair{starts, "at line 3:"}, {after_c1, "at line 5:"}, {inside, "at line 3:"}}) {
    INFO(file);
    expect_user_error(run_troupe("train --config '" + file + "' --run-dir '" + s.path("r") + "'", s),
                      {line, "TOML files are UTF-8", "iconv -f LATIN1 -t UTF-8"});
  }
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a run directory named data that holds a cache is told to move it outside", "[cli][hostile]") {
  Scratch s(kGroup, "datadir");
  fake_cache(s.path("data/cache/abc-v512"));
  const Run r = run_troupe("train --config configs/tiny.toml --run-dir '" + s.path("data") + "' --resume latest", s);
  expect_user_error(r, {"holds the prepared data cache"});
  const std::string& err = r.err;
  const std::string dest = s.path("data-caches");
  CHECK(err.find("mkdir -p " + dest + " && mv " + s.path("data/cache/abc-v512") + " " + dest + "/") !=
        std::string::npos);
  CHECK(err.find("point data.cache_dir at " + dest) != std::string::npos);
  CHECK(fs::exists(s.path("data/cache/abc-v512/meta.json")));
  CHECK_FALSE(fs::exists(s.path("data/config.toml")));
}

TEST_CASE("an output that is a link is refused for the rename, dangling or not", "[cli][hostile]") {
  Scratch s(kGroup, "links");
  fs::create_symlink(s.path("nowhere.json"), s.path("dangling.json"));
  s.write("real.json", "keep");
  fs::create_symlink(s.path("real.json"), s.path("tofile.json"));
  const std::string train = "train --config configs/tiny.toml --set train.steps=1 --run-dir '" + s.path("r") + "' ";
  expect_user_error(run_troupe(train + "--trace '" + s.path("dangling.json") + "'", s),
                    {"would replace the link", "the link's target (it does not exist yet)", "rm "});
  expect_user_error(run_troupe(train + "--trace '" + s.path("tofile.json") + "'", s),
                    {"would replace the link", "pass that path"});
  CHECK(slurp(s.path("real.json")) == "keep");
  CHECK_FALSE(fs::exists(s.path("nowhere.json")));
  CHECK(fs::is_symlink(s.path("dangling.json")));
}

TEST_CASE("a misspelled config key is named with the keys nearest to it", "[cli][hostile]") {
  using troupe::nearest_names;
  const std::vector<std::string_view> keys = {"train.steps", "train.seed", "model.n_layer", "model.n_head"};
  CHECK(nearest_names("train.stepz", keys, 2) == std::vector<std::string>{"train.steps"});
  CHECK(nearest_names("train.stepz", keys) == std::vector<std::string>{"train.steps", "train.seed"});
  CHECK(nearest_names("train.step", keys, 2) == std::vector<std::string>{"train.steps", "train.seed"});
  CHECK(nearest_names("model.n_hed", keys, 1) == std::vector<std::string>{"model.n_head"});
  CHECK(nearest_names("zzz.qqqqq", keys).empty());
  CHECK(nearest_names("", keys).empty());
  CHECK(nearest_names("train.steps", keys, 0, 1) == std::vector<std::string>{"train.steps"});
  Scratch s(kGroup, "keys");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set model.nlayer=3 --run-dir '" + s.path("r") + "'", s),
                    {"unknown config key 'model.nlayer'", "did you mean model.n_layer?", "remove it or use one of"});
  const std::string src = s.write("src.toml", "[data]\n[[data.sources]]\nnmae = \"a\"\npath = \"x\"\n");
  expect_user_error(run_troupe("train --config '" + src + "' --run-dir '" + s.path("r") + "'", s),
                    {"unknown key 'nmae'", "did you mean name?"});
  CHECK_FALSE(fs::exists(s.path("r")));
}
