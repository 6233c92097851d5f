// Hostile inputs, issue 14: trial 55's findings. A --run-dir that is itself a prepared data
// cache was written into (F1); prepare took a run directory or a folder of snapshots as
// data.cache_dir, which then blocked the run's resume (F2); TROUPE_EVENT_LOG mixed events into
// a run's metrics.jsonl or wrote inside a snapshot (F3); the run directory's writability probe
// touched a snapshot before the refusal (F4); an output in a loop of links was "a terminal,
// pipe or device" (F5); a preparation waiting for a stopped one gave up (F6); words (F7).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"
#include "datasets/cache_folder.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial55";

void fake_snapshot(const std::string& dir) {
  fs::create_directories(dir);
  std::ofstream(dir + "/manifest.capnp") << "x";
}

long long mtime_ns(const std::string& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("a run directory that is a data cache, or a cache folder a run holds, is refused by train and prepare",
          "[cli][hostile]") {
  Scratch s(kGroup, "caches");
  // F1: the cache itself, and a folder holding a cache's files
  fake_cache(s.path("c/abc-v512"));
  const std::string cache_named = "data cache " + s.path("c/abc-v512");
  for (const std::string& dir : {s.path("c/abc-v512"), s.path("c/abc-v512/sub")}) {
    expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1 --run-dir '" + dir + "'", s),
                      {cache_named.c_str()});
    CHECK_FALSE(fs::exists(dir + "/config.toml"));
    CHECK_FALSE(fs::exists(dir + "/.lock"));
  }
  // F2: prepare refuses a run directory and a folder of snapshots as data.cache_dir
  fs::create_directories(s.path("run"));
  std::ofstream(s.path("run/config.toml")) << "[train]\n";
  std::ofstream(s.path("run/metrics.jsonl")) << "{\"step\":1}\n";
  fake_snapshot(s.path("run/checkpoints/step-00000001"));
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("run") + "'", s),
                    {"is the run directory of a troupe run"});
  expect_user_error(
      run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("run/checkpoints") + "'", s),
      {"holds snapshots"});
  CHECK(fs::directory_iterator(s.path("run/checkpoints"))->path().filename() == "step-00000001");
  // a run directory holding a cache names how to continue the run there
  fake_cache(s.path("run/abc-v512"));
  expect_user_error(
      run_troupe("train --config configs/tiny.toml --run-dir '" + s.path("run") + "' --resume latest", s),
      {"holds the prepared data cache", "to continue a run there, move the cache out"});
}

TEST_CASE("the run directory's probe never touches a snapshot, TROUPE_EVENT_LOG keeps out of records",
          "[cli][hostile]") {
  Scratch s(kGroup, "probe");
  // F4: --run-dir inside a snapshot is refused before the probe creates a file there
  fake_snapshot(s.path("ck/step-00000003"));
  const long long before = mtime_ns(s.path("ck/step-00000003"));
  for (const std::string& dir : {s.path("ck/step-00000003"), s.path("ck/step-00000003/sub")})
    expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir '" + dir + "'", s), {"snapshot"});
  CHECK(mtime_ns(s.path("ck/step-00000003")) == before);
  CHECK_FALSE(fs::exists(s.path("ck/step-00000003/sub")));
  // F3: the run's own metrics.jsonl, or a file in a snapshot, takes no events
  const Run r = run_troupe(tiny_train(s, "run", 1), s, 120, "env TROUPE_EVENT_LOG='" + s.path("run/metrics.jsonl") + "'");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(has(r.err, "is a run's own record; no events are written"));
  CHECK_FALSE(has(slurp(s.path("run/metrics.jsonl")), "\"event\""));
  const Run l = run_troupe("launch --nprocs 1 -- true", s, 60,
                           "env TROUPE_EVENT_LOG='" + s.path("ck/step-00000003/ev.log") + "'");
  CHECK(l.rc == 0);
  CHECK(has(l.err, "inside the snapshot"));
  CHECK_FALSE(fs::exists(s.path("ck/step-00000003/ev.log")));
  // an events file elsewhere still gets them
  CHECK(run_troupe("launch --nprocs 1 -- true", s, 60, "env TROUPE_EVENT_LOG='" + s.path("ev.jsonl") + "'").rc == 0);
  CHECK(has(slurp(s.path("ev.jsonl")), "\"event\""));
}

TEST_CASE("an output in a loop of links is said as one, and the words of --cost and plot", "[cli][hostile]") {
  Scratch s(kGroup, "words");
  fs::create_symlink(s.path("loop2"), s.path("loop1"));
  fs::create_symlink(s.path("loop1"), s.path("loop2"));
  const std::string loop = "(to " + s.path("loop2") + ") in a loop of links";
  expect_user_error(run_troupe("simulate --quiet --dump '" + s.path("loop1") + "'", s), {loop.c_str()});
  // F7: a --cost item without a key; a key before its value
  expect_user_error(run_troupe("simulate --quiet --cost ',,,='", s), {"has an empty item between its commas"});
  expect_user_error(run_troupe("simulate --quiet --cost '='", s), {"--cost item '=' has no key before '='"});
  expect_user_error(run_troupe("simulate --quiet --cost 'zz=abc'", s), {"--cost key 'zz' is unknown"});
  // a metrics.jsonl of one unreadable line: said, with or without its newline
  fs::create_directories(s.path("run"));
  s.write("run/metrics.jsonl", std::string(100000, '{'));
  expect_user_error(run_troupe("plot '" + s.path("run") + "'", s), {"100000 bytes without a newline"});
  s.write("run/metrics.jsonl", std::string(100000, '{') + "\n");
  expect_user_error(run_troupe("plot '" + s.path("run") + "'", s), {"line 1 is not a JSON object"});
  CHECK_FALSE(fs::exists(s.path("run/plot.png")));
}

TEST_CASE("a preparation waiting for one that is stopped prepares the cache itself", "[cli][hostile]") {
  Scratch s(kGroup, "takeover");
  // (CacheLock on a folder that is gone: the type prepare retries on)
  CHECK_THROWS_AS(troupe::CacheLock(s.path("gone"), nullptr, 1), troupe::CacheFolderRemoved);
  const std::string prep = "'" + troupe_bin() + "' prepare --config configs/tiny.toml --set model.vocab_size=1500 " +
                           "--set data.cache_dir='" + s.path("cache") + "'";
  // A holds the lock and is stopped (SIGSTOP); B waits; A gets SIGTERM and goes on: it removes
  // what it wrote; B then prepares the cache and ends with 0
  const std::string script =
      "cd '" + std::string(TROUPE_SOURCE_DIR) + "'\n" + prep + " > /dev/null 2> '" + s.path("a.err") +
      "' & A=$!\ni=0; until grep -qs . '" + s.path("cache") +
      "'/*/.lock || [ $i -ge 2400 ]; do sleep 0.05; i=$((i+1)); done\nkill -STOP $A\n"
      "timeout 200 " + prep + " > /dev/null 2> '" + s.path("b.err") + "' & B=$!\n"
      "i=0; until grep -qs 'waiting for' '" + s.path("b.err") + "' || [ $i -ge 2400 ]; do sleep 0.05; i=$((i+1)); done\n"
      "kill -TERM $A; kill -CONT $A\nwait $A\necho $? > '" + s.path("a.rc") + "'\nwait $B\necho $? > '" +
      s.path("b.rc") + "'\n";
  s.write("takeover.sh", script);
  REQUIRE(shell_status("timeout 400 sh '" + s.path("takeover.sh") + "'") == 0);
  INFO("a: " << slurp(s.path("a.err")) << "\nb: " << slurp(s.path("b.err")));
  CHECK(slurp(s.path("a.rc")) == "2\n");
  CHECK(slurp(s.path("b.rc")) == "0\n");
  bool committed = false;
  for (const auto& e : fs::directory_iterator(s.path("cache")))
    committed = committed || troupe::is_prepared_cache(e.path().string());
  CHECK(committed);
}
