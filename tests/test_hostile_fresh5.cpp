// Hostile inputs, issue 14: fresh-user check 5. generate --logits-out replaced the training
// corpus of the snapshot it read, exit 0 (high); simulate --dump and export replaced a
// corpus that was no input of theirs (any file of another kind under an output's name);
// launch told a user to chmod +x a config file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-fresh5";
}  // namespace

TEST_CASE("no output replaces a snapshot's corpus, or any file of another kind than the output's",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "kinds");
  const std::string corpus = s.path("corpus.txt");
  fs::copy_file(std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt", corpus);
  const std::string text = slurp(corpus);
  REQUIRE(run_troupe(tiny_train(s, "r", 1, " --set data.corpus='" + corpus + "'"), s).rc == 0);
  const std::string snap = s.path("r/checkpoints/step-00000001");
  // the snapshot's own corpus, by the name its config gives and by another spelling
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 2 --logits-out '" + corpus + "'", s),
                    {"is a file this command reads or writes"});
  expect_user_error(run_troupe("export '" + snap + "' '" + s.path("./corpus.txt") + "'", s), {"reads or writes"});
  CHECK(slurp(corpus) == text);
  // a text file that is no input of the command: not a file of the kind the option writes
  const std::string other = s.write("notes.txt", "Fellow-Citizens of the Senate\n");
  expect_user_error(run_troupe("simulate --quiet --dump '" + other + "'", s),
                    {"exists and is not a schedule file (it begins 'Fellow-Citizens of the S')", "remove that file first"});
  expect_user_error(run_troupe("export '" + snap + "' '" + other + "'", s), {"exists and is not a safetensors file"});
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 2 --logits-out '" + other + "'", s),
                    {"exists and is not a JSON file"});
  expect_user_error(run_troupe("simulate --quiet --png '" + other + "'", s), {"exists and is not a PNG picture"});
  CHECK(slurp(other) == "Fellow-Citizens of the Senate\n");
  // a file of the kind it writes is replaced, as before
  const std::string dump = s.path("s.csv"), st = s.path("m.safetensors");
  CHECK(run_troupe("simulate --quiet --dump '" + dump + "'", s).rc == 0);
  CHECK(run_troupe("simulate --quiet --stages 2 --dump '" + dump + "'", s).rc == 0);
  CHECK(slurp(dump).find("stages P=2") != std::string::npos);
  CHECK(run_troupe("export '" + snap + "' '" + st + "'", s).rc == 0);
  CHECK(run_troupe("export '" + snap + "' '" + st + "'", s).rc == 0);
  // an empty file is no loss
  s.write("empty.json", "");
  CHECK(run_troupe("simulate --quiet --trace '" + s.path("empty.json") + "'", s).rc == 0);
}

TEST_CASE("launch given a config file where its program goes says so, not chmod", "[cli][hostile][launch]") {
  Scratch s(kGroup, "launch");
  expect_user_error(run_troupe("launch --nprocs 2 -- ./configs/tiny.toml", s),
                    {"it is neither a program nor a script", "-- build/troupe train --config ./configs/tiny.toml"});
}
