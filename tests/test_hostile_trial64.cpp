// Hostile inputs, issue 14: trial 64's findings. A JSON-lines file passed for one JSON
// document and was replaced by a JSON output (F1, high); simulate --config replaced the
// config's schedule file when --schedule overrode it (F2); a number past a double's range in
// a config file was called a syntax error (F3); the 32-bit bound named a range the key
// refuses half of (F4); a data source that is a file was said to lie inside itself (F5).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial64";
}  // namespace

TEST_CASE("a JSON output replaces one JSON document, not JSON lines nor a config's schedule", "[cli][hostile]") {
  Scratch s(kGroup, "json");
  const std::string lines = "{\"text\":\"doc one\"}\n{\"text\":\"doc two\"}\n";
  const std::string jsonl = s.write("data.jsonl", lines);
  expect_user_error(run_troupe("simulate --quiet --trace '" + jsonl + "'", s),
                    {"exists and is not a JSON file (it holds JSON lines)", "remove that file first"});
  CHECK(slurp(jsonl) == lines);
  // one document, on one line or pretty-printed, is replaced as before
  CHECK(run_troupe("simulate --quiet --trace '" + s.write("one.json", "{\"a\":1}\n") + "'", s).rc == 0);
  CHECK(run_troupe("simulate --quiet --trace '" + s.write("pretty.json", "{\n  \"a\": 1\n}\n{") + "'", s).rc == 0);
  // F2: the config's schedule file, though --schedule overrides it for this simulation
  const std::string sched = s.path("my.csv");
  REQUIRE(run_troupe("simulate --quiet --stages 2 --microbatches 4 --dump '" + sched + "'", s).rc == 0);
  const std::string before = slurp(sched);
  const std::string cfg = s.write("cs.toml", "[parallel]\npp = 2\nmicrobatches = 4\nschedule = \"" + sched + "\"\n");
  expect_user_error(run_troupe("simulate --quiet --config '" + cfg + "' --schedule gpipe --dump '" + sched + "'", s),
                    {"is a file this command reads or writes"});
  CHECK(slurp(sched) == before);
  // F5: a data source that is a file is named as the file, not as a folder the output lies in
  const std::string src = s.write("src.jsonl", lines);
  const std::string blend = s.write("blend.toml", "[[data.sources]]\nname = \"a\"\npath = \"" + src + "\"\n");
  const Run r = run_troupe("simulate --quiet --config '" + blend + "' --trace '" + src + "'", s);
  expect_user_error(r, {"this command reads or writes: writing it would destroy it"});
  CHECK(r.err.find("lies inside") == std::string::npos);
  CHECK(slurp(src) == lines);
}

TEST_CASE("numbers past a type's range are named with the bound on their side", "[cli][hostile][config]") {
  Scratch s(kGroup, "range");
  const std::string run = " --run-dir '" + s.path("r") + "'";
  const std::string big = s.write("big.toml", "[optim]\nlr = 1e400 # too big\n");
  expect_user_error(run_troupe("train --config '" + big + "'" + run, s),
                    {"line 2: 1e400 is beyond the largest number a double holds", "write a smaller number"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2147483648" + run, s),
                    {"a 32-bit integer (at most 2147483647)"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=-2147483649" + run, s),
                    {"a 32-bit integer (at least -2147483648)"});
  CHECK_FALSE(fs::exists(s.path("r")));
}
