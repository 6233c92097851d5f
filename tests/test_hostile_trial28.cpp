// Hostile inputs, issue 14's twenty-eighth trial (a fresh reviewer's 240 cases): an output's
// temporary file left by a killed export stayed, unnamed (G01); a plot title starting with
// a single quote broke gnuplot's quoting and was blamed on the figure's size (PL11);
// generate read the snapshot's tokenizer.model after the snapshot was validated, racing
// retention (R5); a hex integer past 2^63 - 1 got the wrong reason (R4d); a JSON --config
// was said to nest too deep (C01); an unreadable corpus named no fix (D10).
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "checkpoint/snapshot.h"
#include "cli_helpers.h"
#include "core/config.h"
#include "datasets/tokenizer.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial28";

// A finished one-step run of configs/tiny.toml with a snapshot at step 1.
void tiny_run(const Scratch& s, const std::string& dir) {
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 --set "
                     "train.sample_tokens=0 --run-dir '" + dir + "'",
                     s)
              .rc == 0);
}

// The pid of a process that has ended (a child, reaped).
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int st = 0;
  ::waitpid(p, &st, 0);
  return p;
}
}  // namespace

TEST_CASE("an output's temporary file left by a killed writer is removed and named", "[cli][hostile][outputs]") {
  Scratch s(kGroup, "stale");
  tiny_run(s, s.path("run"));
  const std::string out = s.path("model.safetensors");
  const std::string stale = out + ".tmp-" + std::to_string(dead_pid());
  const std::string live = out + ".tmp-" + std::to_string(::getpid());  // this process is alive: not touched
  s.write("model.safetensors.tmp-" + stale.substr(stale.rfind('-') + 1), "half an export");
  s.write("model.safetensors.tmp-" + std::to_string(::getpid()), "another writer's");
  const Run r = run_troupe("export '" + s.path("run/checkpoints/step-00000001") + "' '" + out + "'", s);
  INFO("stderr: " << r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("note: removed " + stale + ", left by a troupe command") != std::string::npos);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(live));
  CHECK(fs::file_size(out) > 0);
}

TEST_CASE("a plot title may hold single quotes anywhere", "[cli][hostile][plot]") {
  Scratch s(kGroup, "title");
  tiny_run(s, s.path("run"));
  for (const std::string title : {"'best' run", "run 'best'", "''", "it's `id` $(id)"}) {
    const Run r = run_troupe("plot '" + s.path("run") + "' --out '" + s.path("p.png") + "' --title \"" + title + "\"", s);
    INFO("title: " << title << "\nstderr: " << r.err);
    CHECK(r.rc == 0);
    CHECK(fs::file_size(s.path("p.png")) > 0);
    fs::remove(s.path("p.png"));
  }
}

TEST_CASE("a snapshot's tokenizer is read with the snapshot, once", "[hostile][checkpoint]") {
  Scratch s(kGroup, "tok");
  tiny_run(s, s.path("run"));
  const std::string snap = s.path("run/checkpoints/step-00000001");
  const troupe::Config c = troupe::Config::load(s.path("run/config.toml"));
  const troupe::TrainState st = troupe::load_snapshot(snap, c);
  const std::string bytes = slurp(snap + "/tokenizer.model");
  REQUIRE_FALSE(bytes.empty());
  CHECK(st.tokenizer_model == bytes);
  // what generate builds from them is the file's tokenizer, whatever happens to the file after
  fs::remove(snap + "/tokenizer.model");
  const troupe::Tokenizer tok = troupe::Tokenizer::from_bytes(st.tokenizer_model, snap + "/tokenizer.model");
  CHECK(std::to_string(tok.hash()) == st.tokenizer_hash);
}

TEST_CASE("a hex integer past 64 bits names the bound, and a JSON config is called JSON", "[cli][hostile][config]") {
  Scratch s(kGroup, "hexjson");
  const std::string run = "train --config configs/tiny.toml --set train.steps=1 --run-dir '" + s.path("r") + "' ";
  expect_user_error(run_troupe(run + "--set train.seed=0x8000000000000000", s),
                    {"at most 9223372036854775807 = 0x7FFFFFFFFFFFFFFF"});
  expect_user_error(run_troupe(run + "--set train.seed=0b102", s), {"must be a non-negative integer, got '0b102'"});
  std::string floats = "{\"logits\": [";
  for (int i = 0; i < 600; ++i) floats += (i ? ", " : "") + std::to_string(i * 0.125);
  s.write("l.json", floats + "]}\n");
  s.write("a.json", "[1.5, 2.5]\n");
  for (const char* f : {"l.json", "a.json"})
    expect_user_error(run_troupe("train --config '" + s.path(f) + "' --run-dir '" + s.path("r") + "'", s),
                      {"is JSON, not TOML", "configs/sotu.toml"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a corpus this user cannot read names the source and chmod", "[cli][hostile][data]") {
  Scratch s(kGroup, "unreadable");
  if (!nobody_can_run()) {
    SUCCEED("no user nobody who can run the binary here: nothing to check");
    return;
  }
  fs::copy_file(std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt", s.path("m000.txt"));
  fs::permissions(s.path("m000.txt"), fs::perms::none);
  fs::create_directories(s.path("n"));
  fs::permissions(s.dir, fs::perms::all);
  fs::permissions(s.path("n"), fs::perms::all);
  expect_user_error(run_troupe_as_nobody("train --config configs/tiny.toml --set train.steps=1 --set data.corpus='" +
                                             s.path("m000.txt") + "' --set data.cache_dir='" + s.path("n/cache") +
                                             "' --run-dir '" + s.path("n/run") + "'",
                                         s, 60),
                    {"source 'corpus': cannot read '", "Permission denied", "chmod a+r"});
  CHECK_FALSE(fs::exists(s.path("n/run")));
}
