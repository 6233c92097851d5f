// Hostile inputs, issue 14's twenty-fifth trial (a fresh reviewer's 238 cases): a corpus line
// too long to allocate ended the corpus without a word and the cut-short cache was kept
// under the full input's key (BL1/BL2, D06); the data step's out-of-memory named training's
// fixes (BL3); optim.weight_decay = inf passed (S08); a snapshot folder this user cannot read
// was called incomplete (U04); and the lows: TROUPE_LOCAL_WORLD_SIZE read with atoi (H09),
// invisible characters echoed raw (M10), --resume latest without a checkpoints folder (P07).
#include <catch2/catch.hpp>

#include <filesystem>
#include <new>
#include <string>

#include "cli_helpers.h"
#include "core/error.h"
#include "core/text.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial25";

// configs/tiny.toml without its data.corpus line, for a config that adds [[data.sources]]
std::string tiny_without_corpus() {
  std::string t = slurp(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml");
  const size_t at = t.find("\ncorpus = ");
  if (at != std::string::npos) t.erase(at + 1, t.find('\n', at + 1) - at);
  return t;
}

std::string train_args(const Scratch& s, const std::string& corpus) {
  return "train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 --set data.cache_dir='" +
         s.path("c") + "' --set data.corpus='" + corpus + "' --run-dir '" + s.path("r") + "'";
}
}  // namespace

TEST_CASE("a document past 256 MiB is refused naming its line, and no cache is kept", "[cli][hostile][data]") {
  Scratch s(kGroup, "longline");
  const std::string tiny = std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt";
  // 257 MiB of 'a' on line 3, between two documents: read whole, it would be 257 MiB in memory
  // (and past the memory limit, the corpus ended there without a word)
  REQUIRE(shell_status("{ printf 'first document\\n\\n'; head -c 269484032 /dev/zero | tr '\\000' a; printf '\\n\\n'; "
                       "cat '" + tiny + "'; } > '" + s.path("giant.txt") + "'") == 0);
  REQUIRE(fs::file_size(s.path("giant.txt")) > (257ull << 20));
  expect_user_error(run_troupe(train_args(s, s.path("giant.txt")), s),
                    {"line 3 of", "is longer than 256 MiB", "split it into smaller documents"});
  CHECK_FALSE(fs::exists(s.path("r")));
  CHECK((!fs::exists(s.path("c")) || fs::is_empty(s.path("c"))));

  // a document of many short lines past the bound: named by the line it starts at
  REQUIRE(shell_status("{ printf 'first document\\n\\n'; head -c 269484032 /dev/zero | tr '\\000' a | fold -w 1000; "
                       "printf '\\n'; cat '" + tiny + "'; } > '" + s.path("lines.txt") + "'") == 0);
  expect_user_error(run_troupe(train_args(s, s.path("lines.txt")), s),
                    {"the document starting at line 3 of", "is longer than 256 MiB"});
  fs::remove(s.path("lines.txt"));

  // a dir source's file (a hard link to the same bytes), and a JSONL line
  fs::create_directories(s.path("d"));
  fs::create_hard_link(s.path("giant.txt"), s.path("d/big.txt"));
  const std::string tiny_toml = tiny_without_corpus();
  s.write("dir.toml", tiny_toml + "\n[[data.sources]]\nname = 'd'\npath = '" + s.path("d") + "'\nformat = 'dir'\n");
  const std::string prepare = "prepare --set data.cache_dir='" + s.path("c") + "' --config '";
  expect_user_error(run_troupe(prepare + s.path("dir.toml") + "'", s),
                    {"source 'd': file '", "big.txt' is longer than 256 MiB", "smaller files"});
  fs::remove(s.path("d/big.txt"));
  fs::remove(s.path("giant.txt"));
  REQUIRE(shell_status("{ printf '{\"text\": \"'; head -c 269484032 /dev/zero | tr '\\000' a; printf '\"}\n'; } > '" +
                       s.path("long.jsonl") + "'") == 0);
  s.write("jsonl.toml", tiny_toml + "\n[[data.sources]]\nname = 'j'\npath = '" + s.path("long.jsonl") +
                            "'\nformat = 'jsonl'\n");
  expect_user_error(run_troupe(prepare + s.path("jsonl.toml") + "'", s),
                    {"source 'j': line 1 of", "is longer than 256 MiB", "more JSON lines"});
}

TEST_CASE("a 20 GB line of NUL bytes is named at once, not read whole or called blank", "[cli][hostile][data]") {
  Scratch s(kGroup, "nul");
  REQUIRE(shell_status("truncate -s 20G '" + s.path("nul.txt") + "'") == 0);
  const Run r = run_troupe(train_args(s, s.path("nul.txt")), s, 60);
  expect_user_error(r, {"line 1 of", "holds NUL bytes"});
  fs::create_directories(s.path("d"));
  REQUIRE(shell_status("truncate -s 20G '" + s.path("d/nul.bin") + "'") == 0);
  s.write("dir.toml", tiny_without_corpus() +
                         "\n[[data.sources]]\nname = 'd'\npath = '" + s.path("d") + "'\nformat = 'dir'\n");
  expect_user_error(run_troupe("prepare --set data.cache_dir='" + s.path("c") + "' --config '" + s.path("dir.toml") + "'", s, 60),
                    {"source 'd'", "holds NUL bytes"});
}

TEST_CASE("out of memory in the data step names the data step's fixes, and the command's come back after it",
          "[hostile][data]") {
  const std::string train = troupe::describe_exception(std::bad_alloc());
  CHECK(train.find("lower train.batch_size") != std::string::npos);
  {
    troupe::OutOfMemoryFixesScope data("split very long documents");
    CHECK(troupe::describe_exception(std::bad_alloc()).find("split very long documents") != std::string::npos);
  }
  CHECK(troupe::describe_exception(std::bad_alloc()) == train);
  try {
    troupe::OutOfMemoryFixesScope data("split very long documents");
    throw std::bad_alloc();
  } catch (const std::bad_alloc& e) {  // the failed phase's sentence stays for main's last catch
    CHECK(troupe::describe_exception(e).find("split very long documents") != std::string::npos);
  }
  troupe::set_out_of_memory_fixes("");
}

TEST_CASE("optim.weight_decay must be finite and below 1 / optim.lr", "[cli][hostile][config]") {
  Scratch s(kGroup, "wd");
  const std::string run = "train --config configs/tiny.toml --set train.steps=1 --run-dir '" + s.path("r") + "' ";
  expect_user_error(run_troupe(run + "--set optim.weight_decay=inf", s), {"optim.weight_decay = inf", "finite"});
  expect_user_error(run_troupe(run + "--set optim.weight_decay=1e308", s),
                    {"optim.weight_decay = 1e308", "1 - lr * weight_decay", "below 1 / optim.lr"});
  expect_user_error(run_troupe(run + "--set optim.lr=0.01 --set optim.weight_decay=100", s), {"below 1 / optim.lr = 100"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a snapshot folder this user cannot read is named as such, not as incomplete", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "snapperm");
  if (!nobody_can_run()) {
    SUCCEED("no user nobody who can run the binary here: nothing to check");
    return;
  }
  fs::create_directories(s.path("snap"));
  s.write("snap/manifest.capnp", "not read: the folder cannot be entered");
  fs::permissions(s.path("snap"), fs::perms::owner_all);  // root's, mode 700
  fs::permissions(s.dir, fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
  for (const std::string& cmd : {"generate '" + s.path("snap") + "' --tokens 1",
                                "export '" + s.path("snap") + "' --format safetensors '" + s.path("out.st") + "'"})
    expect_user_error(run_troupe_as_nobody(cmd, s, 60),
                      {"cannot read snapshot directory", "Permission denied", "chmod -R a+rX"});
}

TEST_CASE("resume latest says whether the checkpoints folder is missing or holds no snapshot",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "latest");
  const std::string run = "train --config configs/tiny.toml --set train.steps=1 --set data.cache_dir='" + s.path("c") +
                          "' --resume latest --run-dir '";
  expect_user_error(run_troupe(run + s.path("new") + "'", s), {"the folder does not exist"});
  fs::create_directories(s.path("empty/checkpoints"));
  expect_user_error(run_troupe(run + s.path("empty") + "'", s), {"it holds no snapshot"});
}

TEST_CASE("invisible characters in an error's quoted value are shown escaped", "[cli][hostile]") {
  CHECK(troupe::printable("B\xE2\x80\x8B" "0") == "B\\u{200B}0");
  CHECK(troupe::printable("\xEF\xBB\xBF" "F0") == "\\u{FEFF}F0");
  CHECK(troupe::printable("a\xE2\x80\xAE" "b") == "a\\u{202E}b");  // a bidi override (Trojan Source)
  CHECK(troupe::printable("caf\xC3\xA9 \xE2\x9C\x93") == "caf\xC3\xA9 \xE2\x9C\x93");  // visible text unchanged
  Scratch s(kGroup, "cell");
  s.write("z.csv", "F0,B0\nF0,B\xE2\x80\x8B" "0\n");
  expect_user_error(run_troupe("simulate --schedule '" + s.path("z.csv") + "' --quiet", s),
                    {"cannot read cell 'B\\u{200B}0'"});
}
