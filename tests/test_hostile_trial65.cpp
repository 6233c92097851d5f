// Hostile inputs, issue 14: trial 65's findings. A run directory or a data cache inside a
// folder source became its documents (the run's log at once, its snapshots then stopped
// every preparation: F1, F2); a source name too long for a file name failed late, blaming
// data.cache_dir (F3); plan --search all named a rule of its own combinations, and "search
// more keys", when memory ruled (F4).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial65";
}  // namespace

TEST_CASE("no run directory or data cache inside a folder source, no source name too long for a file",
          "[cli][hostile][data]") {
  Scratch s(kGroup, "dirsrc");
  fs::create_directories(s.path("d1"));
  for (int i = 0; i < 3; ++i) s.write("d1/f" + std::to_string(i) + ".txt", "Document " + std::to_string(i) + " has words.\n");
  const std::string cfg = s.write("dir.toml", "[data]\ncache_dir = \"" + s.path("cache") + "\"\n[[data.sources]]\nname = "
                                              "\"a\"\npath = \"" + s.path("d1") + "\"\nformat = \"dir\"\n");
  expect_user_error(run_troupe("train --config '" + cfg + "' --run-dir '" + s.path("d1/run") + "'", s),
                    {"lies inside the folder of source 'a'", "pass --run-dir outside it"});
  CHECK_FALSE(fs::exists(s.path("d1/run")));
  expect_user_error(run_troupe("prepare --config '" + cfg + "' --set data.cache_dir='" + s.path("d1/cache") + "'", s),
                    {"data.cache_dir", "lies inside the folder of source 'a'", "set data.cache_dir to a folder outside it"});
  CHECK_FALSE(fs::exists(s.path("d1/cache")));
  const std::string long_name(65, 'a');
  const std::string named = s.write("named.toml", "[data]\ncache_dir = \"" + s.path("cache") + "\"\n[[data.sources]]\nname = \"" +
                                                      long_name + "\"\npath = \"" + s.path("d1") + "\"\nformat = \"dir\"\n");
  expect_user_error(run_troupe("prepare --config '" + named + "'", s),
                    {"data.sources[0] has a name of 65 characters; use at most 64"});
  CHECK_FALSE(fs::exists(s.path("cache")));
}

TEST_CASE("plan --search all names what binds when no layout fits", "[cli][hostile][plan]") {
  Scratch s(kGroup, "search");
  const Run r = run_troupe("plan --config configs/gpt3-175b.toml --set cluster.gpu=a100-40g --set cluster.nodes=1 "
                           "--search all", s);
  expect_user_error(r, {"they do not fit in device memory", "add nodes (cluster.nodes), or use a smaller model"});
  CHECK(r.err.find("search more keys") == std::string::npos);
  CHECK(slurp(s.path("stdout.txt")).find("none fits and runs") != std::string::npos);
}

TEST_CASE("an output that is one of the command's folders is called a folder", "[cli][hostile]") {
  // (trial 66, L2: "is a file this command reads or writes" of the data cache)
  Scratch s(kGroup, "folder");
  fs::create_directories(s.path("cache"));
  expect_user_error(run_troupe(tiny_train(s, "r", 1, " --tensorboard '" + s.path("cache") + "'"), s),
                    {"is a folder this command reads or writes"});
  CHECK_FALSE(fs::exists(s.path("r")));
}
