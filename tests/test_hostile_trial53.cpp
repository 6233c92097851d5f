// Hostile inputs, issue 14: trial 53's findings. A bad TROUPE_FAULT_* switch was refused only
// after the run directory had its config.toml and train.log (F1); an output could take a
// snapshot's name in a folder of snapshots, blocking that run's resume (F2); data.cache_dir
// could be a prepared cache, a folder of snapshots or another run's directory (F3); an
// invisible character beside a key was called "spaces" (F4).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial53";
}  // namespace

TEST_CASE("fault switches are checked before anything is written", "[cli][hostile]") {
  Scratch s(kGroup, "switches");
  fs::create_directories(s.path("run"));
  s.write("run/notes.txt", "keep\n");
  for (const char* env : {"TROUPE_FAULT_KILL_STEP=abc", "TROUPE_FAULT_KILL=1", "TROUPE_FAULT_DELAY_S=x"}) {
    const Run r = run_troupe(tiny_train(s, "run", 2), s, 120, env);
    INFO(env << "\n" << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find("TROUPE_FAULT_") != std::string::npos);
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(s.path("run"))) entries += e.path().filename() != "notes.txt";
    CHECK(entries == 0);  // no config.toml, train.log, .lock or checkpoints/
  }
}

TEST_CASE("outputs never take a snapshot's name, and data.cache_dir is a folder for caches alone",
          "[cli][hostile][data]") {
  Scratch s(kGroup, "roles");
  REQUIRE(run_troupe(tiny_train(s, "run", 1), s).rc == 0);
  const std::string ck = s.path("run/checkpoints"), snap = ck + "/step-00000001";
  for (const std::string& cmd : {"export '" + snap + "' '" + ck + "/step-00000009'",
                                 "simulate --dump '" + ck + "/step-00000011'",
                                 "generate '" + snap + "' --tokens 1 --logits-out '" + ck + "/step-00000012.tmp-1'"}) {
    const Run r = run_troupe(cmd, s);
    INFO(cmd << "\n" << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find("takes a snapshot's name in the folder of snapshots") != std::string::npos);
  }
  std::string cache;
  for (const auto& e : fs::directory_iterator(s.path("cache")))
    if (fs::exists(e.path() / "meta.json")) cache = e.path().string();
  REQUIRE(!cache.empty());
  const std::vector<std::pair<std::string, std::string>> places = {
      {cache, "the prepared data cache"}, {ck, "holds snapshots"}, {s.path("run"), "is the run directory"}};
  for (const auto& [dir, why] : places) {
    const Run r = run_troupe("train --config configs/tiny.toml --set data.cache_dir='" + dir + "' --run-dir '" +
                                 s.path("other") + "'",
                             s);
    INFO(dir << "\n" << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find(why) != std::string::npos);
    CHECK_FALSE(fs::exists(s.path("other")));
  }
  // an invisible character beside a key is no space
  const Run r = run_troupe("train --config configs/tiny.toml --set 'train.steps\xE2\x80\x8B=2' --run-dir '" +
                               s.path("other") + "'",
                           s);
  expect_user_error(r, {"has an invisible character beside it"});
}
