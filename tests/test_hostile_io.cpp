// Hostile inputs, second part (issue 14's second trial): a disk that fills while a run
// writes its logs, a trace with no room, numbers CLI11 cannot convert, flags the wrong
// command gets, and `troupe launch` with a bad coordinator or N copies of one error line.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "core/tensorboard.h"

namespace fs = std::filesystem;

namespace {
using troupe::test::expect_user_error;
using troupe::test::Run;
using troupe::test::run_on_tmpfs;
using troupe::test::run_troupe;
using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("hostile-io", name) {}
};

// How many times `needle` occurs in `text`.
int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("a disk that fills during a run: every log keeps whole records, each loss is said once, the run finishes",
          "[cli][hostile]") {
  Scratch s("fill");
  const std::string mnt = s.path("mnt"), out = s.path("out");
  fs::create_directories(out);
  // the run dir and the TensorBoard folder on a 1 MiB tmpfs that dd fills once a few steps
  // are logged; snapshots elsewhere
  const std::string body =
      "set +e\n'" + troupe_bin() + "' train --config configs/tiny.toml --set train.steps=60 --set train.eval_interval=0 "
      "--set train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") + "' --set checkpoint.dir='" +
      s.path("ck") + "' --run-dir '" + mnt + "/run' --tensorboard '" + mnt + "/tb' > /dev/null 2> '" + out +
      "/err' &\npid=$!\n"
      "for i in $(seq 1 1200); do [ -f '" + mnt + "/run/metrics.jsonl' ] && [ $(wc -l < '" + mnt +
      "/run/metrics.jsonl') -ge 3 ] && break; sleep 0.05; done\n"
      "dd if=/dev/zero of='" + mnt + "/fill' bs=4k > /dev/null 2>&1\nwait $pid; echo $? > '" + out + "/rc'\n"
      "cp -r '" + mnt + "/run' '" + mnt + "/tb' '" + out + "/'\n";
  std::string why;
  if (!run_on_tmpfs(s, mnt, 1, body, &why)) {
    WARN("skipped: cannot mount a small tmpfs in a mount namespace here (needs root): " << why);
    return;
  }
  const std::string err = slurp(out + "/err");
  INFO(slurp(s.path("tmpfs.log")) << "\n--- stderr:\n" << err);
  CHECK(std::atoi(slurp(out + "/rc").c_str()) == 0);  // training and snapshots went on
  CHECK(err.find("LOG ERROR") == std::string::npos);   // spdlog's own complaint, once per line
  CHECK(count(err, "cannot write " + mnt + "/run/metrics.jsonl") == 1);
  CHECK(count(err, "cannot write " + mnt + "/run/train.log") == 1);
  CHECK(count(err, "cannot write the TensorBoard event file") == 1);
  CHECK(err.find("could not be written (disk full)") != std::string::npos);
  // metrics.jsonl: whole lines only, the first steps among them
  std::ifstream in(out + "/run/metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(in, l); ++lines) CHECK_NOTHROW(nlohmann::json::parse(l));
  CHECK(lines >= 3);
  CHECK(lines < 60);
  // the event file reads to its end (no torn record)
  int files = 0;
  for (auto& e : fs::directory_iterator(out + "/tb")) {
    ++files;
    std::vector<std::string> records;
    CHECK_NOTHROW(records = troupe::read_tfrecords(e.path().string()));
    CHECK(records.size() >= 2);
  }
  CHECK(files == 1);
}

TEST_CASE("a trace with no room on its disk is refused before training", "[cli][hostile]") {
  Scratch s("trace");
  const std::string mnt = s.path("mnt");
  // 1000 steps need a few MiB of trace; the tmpfs has 1 MiB
  const std::string body = "set +e\n'" + troupe_bin() + "' train --config configs/tiny.toml --set train.steps=1000 " +
                           "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") +
                           "' --trace '" + mnt + "/t.json' > /dev/null 2> '" + s.path("err") + "'; echo $? > '" +
                           s.path("rc") + "'\nls -A '" + mnt + "' > '" + s.path("ls") + "'\n";
  std::string why;
  if (!run_on_tmpfs(s, mnt, 1, body, &why)) {
    WARN("skipped: cannot mount a small tmpfs in a mount namespace here (needs root): " << why);
    return;
  }
  INFO(slurp(s.path("tmpfs.log")));
  expect_user_error(Run{std::atoi(slurp(s.path("rc")).c_str()), slurp(s.path("err"))}, {"--trace", "free"});
  CHECK(slurp(s.path("ls")).empty());  // no empty trace file
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("numbers CLI11 cannot convert, unknown options and flags of the wrong command are named with their range",
          "[cli][hostile]") {
  Scratch s("flags");
  const std::string snap = s.path("nosnap");
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 1000000000000", s, 30),
                    {"--tokens", "1000000000000", "1 to 100000"});
  expect_user_error(run_troupe("generate '" + snap + "' --seed abc", s, 30), {"--seed", "'abc'", ">= 0"});
  expect_user_error(run_troupe("simulate --quiet --stages 1e9", s, 30), {"--stages", "1 to 1024"});
  expect_user_error(run_troupe("--bogus", s, 30), {"--bogus", "train", "launch"});
  expect_user_error(run_troupe("simulate --quiet --chunks 4", s, 30), {"--chunks 4", "--schedule interleaved"});
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --tokens inf", s, 30),
                    {"--tokens inf", "1e18"});
  // the report path is checked before any data work: no cache folder is made
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") +
                                   "' --report '" + s.dir.string() + "'",
                               s, 30),
                    {"--report", "is a directory"});
  CHECK_FALSE(fs::exists(s.path("cache")));
}

TEST_CASE("troupe launch: a coordinator that is not this host is refused at once, and an error every process "
          "prints is printed once",
          "[cli][hostile][launch]") {
  Scratch s("launch");
  // 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this host
  const auto t0 = std::chrono::steady_clock::now();
  expect_user_error(run_troupe("launch --nprocs 2 --coordinator 192.0.2.1:29500 -- true", s, 60),
                    {"192.0.2.1", "not an address of this host", "127.0.0.1"});
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));  // not the 35 s grace
  Run r = run_troupe("launch --nprocs 3 -- '" + troupe_bin() + "' train --config configs/tiny.toml --set train.steps=abc",
                     s, 60);
  expect_user_error(r, {"train.steps", "abc"});  // exactly one error line, not three
  CHECK(count(r.err, "exited with status 2") == 3);
}
