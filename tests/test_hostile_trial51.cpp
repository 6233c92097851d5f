// Hostile inputs, issue 14: trial 50's findings. A complete snapshot left under its writer's
// temporary name (killed between the manifest's rename and the folder's) was deleted as
// unfinished (M3); a snapshot copied to another name (step-3 (copy), backup-step-3) was passed
// over without a word (M2); checkpoints/ as a file was "Permission denied" (M4); simulate wrote
// over its config's corpus and over a config (M5); a link to a snapshot of another step was
// "damaged" (M6); a dangling link was "a file" (L7); special-token and local-rank messages (L8-L10).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/snapshot_name.h"
#include "cli_helpers.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/toml_text.h"
#include "datasets/corpus.h"
#include "datasets/special_tokens.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial51";
const std::string kKeep = " --set checkpoint.keep_last=9";


std::string refusal(const std::string& list) {
  return user_error_of([&] { troupe::parse_special_tokens(list); });
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("a snapshot its killed writer finished but did not rename is put in place, never deleted",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "promote");
  REQUIRE(run_troupe(tiny_train(s, "run", 4, kKeep), s).rc == 0);
  const std::string ck = s.path("run/checkpoints");
  // step 4 as its writer left it when killed before the folder's rename (pid 1: a container's)
  fs::rename(ck + "/step-00000004", ck + "/step-00000004.tmp-1");
  // step 3 twice: in place, and a finished copy under a temporary name (both stay)
  fs::copy(ck + "/step-00000003", ck + "/step-00000003.tmp-77", fs::copy_options::recursive);
  // step 2 under a temporary name with a damaged shard: named, kept
  fs::copy(ck + "/step-00000002", ck + "/step-00000002.tmp-78", fs::copy_options::recursive);
  {
    std::fstream f(ck + "/step-00000002.tmp-78/shard-dp0-pp0-tp0.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('X');
  }
  // step 1 as a folder of links to a snapshot's files (trial 51, F1): no writer's, never put in place
  fs::create_directory(ck + "/step-00000001.tmp-79");
  for (const auto& e : fs::directory_iterator(ck + "/step-00000001"))
    fs::create_symlink(e.path(), ck + "/step-00000001.tmp-79/" + e.path().filename().string());
  fs::rename(ck + "/step-00000001", ck + "/step-00000001.kept");
  // a fresh run: the snapshot is put in place, and the folder's snapshots refuse the run
  Run r = run_troupe(tiny_train(s, "run", 6, kKeep), s);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(has(r.err, "renamed " + ck + "/step-00000004.tmp-1 to " + ck + "/step-00000004: a complete snapshot"));
  CHECK(has(r.err, "already holds snapshots of an earlier run (newest: step 4)"));
  CHECK(fs::exists(ck + "/step-00000004/manifest.capnp"));
  CHECK(has(r.err, "left " + ck + "/step-00000003.tmp-77 alone: it holds a complete snapshot of step 3"));
  CHECK(has(r.err, "left " + ck + "/step-00000002.tmp-78 alone: it holds a manifest, but the snapshot is damaged"));
  CHECK(has(r.err, "left " + ck + "/step-00000001.tmp-79 alone: it holds a manifest, but the snapshot is damaged"));
  CHECK(has(r.err, "manifest.capnp as a symbolic link"));
  CHECK_FALSE(fs::exists(ck + "/step-00000001"));
  // --resume latest continues from it; the two that stay are still there afterwards
  fs::rename(ck + "/step-00000004", ck + "/step-00000004.tmp-1");
  r = run_troupe(tiny_train(s, "run", 5, kKeep + " --resume latest"), s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(has(r.err, "resumed from " + ck + "/step-00000004 at step 4"));
  CHECK(fs::exists(ck + "/step-00000003.tmp-77/manifest.capnp"));
  CHECK(fs::exists(ck + "/step-00000002.tmp-78/manifest.capnp"));
  CHECK(fs::exists(ck + "/step-00000005/manifest.capnp"));
}

TEST_CASE("snapshots copied under other names, links to other steps and dangling links are named as they are",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "names");
  REQUIRE(run_troupe(tiny_train(s, "run", 3, kKeep), s).rc == 0);
  const std::string ck = s.path("run/checkpoints");
  fs::copy(ck + "/step-00000003", ck + "/step-3 (copy)", fs::copy_options::recursive);
  fs::rename(ck + "/step-00000003", ck + "/backup-step-3");
  fs::copy(ck + "/step-00000002", ck + "/step-\x1b[31m2", fs::copy_options::recursive);
  fs::copy(ck + "/step-00000002", ck + "/step-2-old", fs::copy_options::recursive);  // step-00000002 is there
  fs::create_directory_symlink(ck + "/step-00000002", ck + "/step-00000009");  // a link to step 2, named 9
  // (a variable troupe reads is no misspelling: trial 51, F2)
  Run r = run_troupe(tiny_train(s, "run", 4, kKeep + " --resume latest"), s, 120, "TROUPE_GNUPLOT_TIMEOUT_S=30");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK_FALSE(has(r.err, "is not one troupe reads"));
  CHECK(has(r.err, ck + "/step-2-old holds a snapshot manifest but is not read as one"));
  CHECK(has(r.err, ck + "/step-00000002 is there already (is it a copy of that one?)"));
  CHECK(has(r.err, ck + "/backup-step-3 holds a snapshot manifest but is not read as one"));
  CHECK(has(r.err, ck + "/step-3 (copy) holds a snapshot manifest but is not read as one"));
  CHECK(has(r.err, "rename it " + ck + "/step-00000003"));
  CHECK(has(r.err, "step-\\x1B[31m2 holds a snapshot manifest"));  // (the escape sequence printed, not sent to the terminal)
  CHECK_FALSE(has(r.err, "\x1b[31m2"));
  CHECK(has(r.err, "skipped the link " + ck + "/step-00000009: a symbolic link to " + ck +
                       "/step-00000002, a snapshot of step 2, not of step 9 as the link's name says"));
  CHECK(fs::exists(ck + "/step-00000002/manifest.capnp"));  // (the link moved aside, not what it points to)
  // a dangling link of a snapshot's name is no file
  fs::create_directory_symlink(s.path("nowhere"), ck + "/step-00000011");
  r = run_troupe(tiny_train(s, "run", 5, " --resume latest"), s);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(has(r.err, "holds step-00000011, a dangling symbolic link (to " + s.path("nowhere") + ")"));
}

TEST_CASE("checkpoints as a file, and simulate's outputs over a config or its corpus, are refused as such",
          "[cli][hostile]") {
  Scratch s(kGroup, "outputs");
  fs::create_directories(s.path("run"));
  s.write("run/checkpoints", "not a folder\n");
  Run r = run_troupe("train --config configs/tiny.toml --run-dir '" + s.path("run") + "' --resume latest", s);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(has(r.err, "(it is a file, not a folder (Not a directory)"));
  CHECK_FALSE(has(r.err, "Permission denied"));
  // a config is never an output; nor is the corpus of the config simulate reads
  fs::copy_file(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml", s.path("mine.toml"));
  r = run_troupe("simulate --dump '" + s.path("mine.toml") + "'", s);
  CHECK(r.rc == 2);
  CHECK(has(r.err, "is a troupe config (it has a [model], [train] or [data] table): writing it would destroy it"));
  const std::string corpus = s.write("corpus.txt", "hello world\n");
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  cfg.replace(cfg.find("tests/data/tiny_corpus.txt"), 26, corpus);
  s.write("c2.toml", cfg);
  r = run_troupe("simulate --config '" + s.path("c2.toml") + "' --trace '" + corpus + "'", s);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(has(r.err, "--trace " + corpus + " is a file this command reads or writes"));
  std::ifstream back(corpus);
  std::string now((std::istreambuf_iterator<char>(back)), std::istreambuf_iterator<char>());
  CHECK(now == "hello world\n");
}

TEST_CASE("special tokens split at a comma, half-bracketed or with an invisible character are refused clearly",
          "[data][hostile]") {
  std::string e = refusal("<,>");
  CHECK(has(e, "\"<\" is one character (data.special_tokens is split at each comma, so a token cannot hold one)"));
  CHECK(has(e, "e.g. \"<|sep|>\""));
  e = refusal("<|x");
  CHECK(has(e, "write it as, e.g., \"<|x|>\""));
  e = refusal("[INST");
  CHECK(has(e, "\"<|INST|>\""));
  e = refusal("<|us\xC2\xADr|>");
  CHECK(has(e, "holds an invisible character (U+00AD)"));
  CHECK(has(refusal("<|a\xE2\x80\x8B" "b|>"), "invisible"));
  CHECK(troupe::parse_special_tokens("<|user|>").size() == 1);
}

TEST_CASE("a local rank set without a launcher's rank and world says so", "[launch][hostile]") {
  auto env = [](const char* n) -> const char* {
    const std::string k = n;
    return k == "TROUPE_LOCAL_RANK" ? "9" : k == "TROUPE_LOCAL_WORLD_SIZE" ? "2" : nullptr;
  };
  try {
    troupe::read_launch_env(env);
    FAIL("accepted");
  } catch (const troupe::UserError& e) {
    CHECK(has(e.what(), "TROUPE_LOCAL_RANK='9' is set without TROUPE_RANK and TROUPE_WORLD_SIZE"));
    CHECK_FALSE(has(e.what(), "[0, 0]"));
  }
  auto zero = [](const char* n) -> const char* { return std::string(n) == "TROUPE_LOCAL_RANK" ? "0" : nullptr; };
  CHECK(troupe::read_launch_env(zero).local_rank == 0);
}

TEST_CASE("prose passed as a config is no nesting, and a generation's bidi overrides are not printed", "[hostile]") {
  // a line of prose has dots, but is no dotted key: the parser refuses it ("not valid TOML")
  std::string prose;
  for (int i = 0; i < 80; ++i) prose += "It rained. ";
  CHECK_NOTHROW(troupe::check_toml_nesting(prose + "\n", "config file 'p'"));
  std::string deep = "x", spaced = "x";
  for (int i = 0; i < 70; ++i) deep += ".y", spaced += " . y";
  CHECK_THROWS_WITH(troupe::check_toml_nesting(deep + " = 1\n", "config file 'd'"),
                    Catch::Contains("nests deeper than 64 levels at line 1"));
  CHECK_THROWS_WITH(troupe::check_toml_nesting(spaced + " = 1\n", "config file 'd'"),
                    Catch::Contains("nests deeper than 64 levels at line 1"));
  CHECK_THROWS_WITH(troupe::check_toml_nesting("[a" + deep.substr(1) + "]\n", "config file 'h'"),
                    Catch::Contains("nests deeper"));
  troupe::Utf8Stream u;
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(u.push("a\xE2\x80\xAE" "b\xE2\x81\xA6" "c\xE2\x80\x8E") == "a" + fffd + "b" + fffd + "c\xE2\x80\x8E");
}
