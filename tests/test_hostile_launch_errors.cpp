// Hostile inputs, issue 14's ninth trial (review 14i, A2): a job under troupe launch says one
// "error:" line, the first cause, however many processes the cause reaches (a refusal that
// makes the launcher stop the others, a signal to one process while the job assembles, a
// stop signal to the launcher while every process prepares data); the launcher's note names
// that cause; and a stopped preparation leaves no folder it made (datasets/cache_folder.h).
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "cli_helpers.h"
#include "datasets/cache_folder.h"

namespace fs = std::filesystem;

namespace {
using troupe::test::error_lines;
using troupe::test::Run;
using troupe::test::run_and_signal;
using troupe::test::run_troupe;
using troupe::test::shell_status;
using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("hostile-launch-errors", name) {}
};

// A corpus of about `mb` MB whose preparation (cleaning, a 2048-piece tokenizer, tokenizing)
// takes seconds: documents of made-up words and common ones, separated by blank lines.
std::string write_corpus(const Scratch& s, int mb) {
  std::mt19937 rng(14);
  std::vector<std::string> words = {"the", "and", "be", "have", "of", "to", "in", "that", "it", "with"};
  for (int i = 0; i < 3000; ++i) {
    std::string w;
    const int len = 2 + (int)(rng() % 8);
    for (int c = 0; c < len; ++c) w += (char)('a' + rng() % 26);
    words.push_back(w);
  }
  std::string text;
  while (text.size() < (size_t)mb << 20) {
    for (int w = 0; w < 220; ++w) text += words[rng() % words.size()] + (w % 20 == 19 ? "\n" : " ");
    text += "\n\n";
  }
  return s.write("corpus.txt", text);
}
}  // namespace

TEST_CASE("launch: a process that refuses makes one error line, and the launcher's note says it refused",
          "[cli][hostile][launch]") {
  Scratch s("refuse");
  // process 1 refuses a setting at once; process 0 waits for it to join until the launcher's
  // SIGTERM, which must not add a line of its own
  const Run r = run_troupe("launch --nprocs 2 -- /bin/sh -c 'if [ \"$TROUPE_RANK\" = 1 ]; then set -- \"$@\" --set "
                           "bogus.key=1; fi; exec \"$0\" \"$@\"' '" + troupe_bin() + "' train --config configs/tiny.toml "
                           "--set parallel.pp=2 --set train.steps=2 --set data.cache_dir='" + s.path("cache") +
                           "' --run-dir '" + s.path("run") + "'",
                           s, 120);
  INFO(r.err);
  CHECK(r.rc == 2);
  const auto lines = error_lines(r.err);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("unknown config key 'bogus.key'") != std::string::npos);
  CHECK(r.err.find("stopping the other processes (SIGTERM): process 1 refused to run") != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("launch: SIGTERM to one process while the job assembles makes one error line, named in the launcher's note",
          "[cli][hostile][launch]") {
  Scratch s("joinsig");
  // process 2 never joins (a sleep), so processes 0 and 1 wait in the join until process 1 is
  // stopped; the launcher then stops process 0, which waits for the others
  const std::string find_rank1 =
      "for c in $(pgrep -P $p); do tr '\\0' '\\n' < /proc/$c/environ 2>/dev/null | grep -qx TROUPE_RANK=1 && "
      "kill -TERM $c; done";
  const Run r = run_and_signal(
      s,
      "launch --nprocs 3 -- /bin/sh -c 'if [ \"$TROUPE_RANK\" = 2 ]; then exec sleep 120; fi; exec \"$0\" \"$@\"' '" +
          troupe_bin() + "' train --config configs/tiny.toml --set parallel.pp=3 --set model.n_layer=3 --set "
          "train.steps=2 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'",
      "\\[process 1\\] joining the job", find_rank1);
  INFO(r.err);
  CHECK(r.rc == 2);
  const auto lines = error_lines(r.err);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("[process 1] stopped by signal 15") != std::string::npos);
  CHECK(r.err.find("stopping the other processes (SIGTERM): process 1 was stopped by SIGTERM") != std::string::npos);
  CHECK(r.err.find("refused") == std::string::npos);
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("launch: SIGTERM to the launcher while its processes prepare data makes one error line and leaves no folder "
          "it made",
          "[cli][hostile][launch]") {
  Scratch s("prepsig");
  const std::string corpus = write_corpus(s, 8);
  fs::create_directories(s.path("had"));  // a cache folder that was there before the run stays
  for (const std::string& cache : {s.path("new/cache"), s.path("had/cache")}) {
    INFO(cache);
    fs::create_directories(s.path("had/cache"));
    const Run r = run_and_signal(
        s,
        "launch --nprocs 2 -- '" + troupe_bin() + "' train --config configs/tiny.toml --set parallel.pp=2 --set "
            "train.steps=2 --set model.vocab_size=2048 --set data.corpus='" + corpus + "' --set data.cache_dir='" +
            cache + "' --run-dir '" + s.path("run") + "'",
        "data: preparing", "kill -TERM $p");
    INFO(r.err);
    CHECK(r.rc == 2);
    CHECK(error_lines(r.err).size() == 1);
    CHECK(r.err.find("stopped by SIGTERM") != std::string::npos);
    CHECK_FALSE(fs::exists(s.path("new")));  // neither the key folder nor the two made above it
    CHECK(fs::is_directory(s.path("had/cache")));
    CHECK(fs::is_empty(s.path("had/cache")));
    CHECK_FALSE(fs::exists(s.path("run")));
  }
}

TEST_CASE("cache folder: the process that builds removes the folders another process made for the preparation",
          "[datasets][hostile]") {
  Scratch s("made");
  const std::string key = s.path("a/b/key-v512");
  // process A makes the folders; process B finds them there, takes the lock and builds
  const std::string made_a = troupe::make_cache_folder(key);
  CHECK(made_a == s.path("a"));
  const std::string made_b = troupe::make_cache_folder(key);
  CHECK(made_b.empty());
  std::ofstream(key + "/tokenizer.model") << "partial";
  // A, stopped while waiting: the folder is in use (B's .lock), so nothing goes
  std::ofstream(key + "/.lock");
  troupe::remove_made_if_empty(key, made_a);
  CHECK(fs::exists(key + "/tokenizer.model"));
  // B is stopped while building: its partial folder goes, and so do the folders A made
  CHECK(troupe::remove_stopped(key, made_b));
  CHECK_FALSE(fs::exists(s.path("a")));
  CHECK(fs::is_directory(s.dir));
  // a folder that was there before stays, even when B made the ones below it
  fs::create_directories(s.path("kept"));
  const std::string made = troupe::make_cache_folder(s.path("kept/c/key-v512"));
  CHECK(made == s.path("kept/c"));
  CHECK(troupe::remove_stopped(s.path("kept/c/key-v512"), made));
  CHECK_FALSE(fs::exists(s.path("kept/c")));
  CHECK(fs::is_directory(s.path("kept")));
  // a process stopped while waiting, after the builder left: the folders it made go (its own
  // line in .made is all the key folder held)
  const std::string made_w = troupe::make_cache_folder(s.path("w/x/key-v512"));
  troupe::remove_made_if_empty(s.path("w/x/key-v512"), made_w);
  CHECK_FALSE(fs::exists(s.path("w")));
  // the commit: .made goes, the folders are the cache's
  const std::string made_c = troupe::make_cache_folder(s.path("c/key-v512"));
  CHECK(fs::exists(s.path("c/key-v512/.made")));
  troupe::forget_made(s.path("c/key-v512"));
  CHECK(fs::is_empty(s.path("c/key-v512")));
}
