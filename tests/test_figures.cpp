// What a user sees of a run besides its log: TensorBoard event files (TFRecord framing,
// masked CRC-32C, Event/Summary protobufs) that hold exactly metrics.jsonl's numbers, and
// the pictures `troupe plot` and `troupe simulate --png` draw with gnuplot.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "actors/metrics_log.h"
#include "cli_helpers.h"
#include "core/error.h"
#include "core/tensorboard.h"
#include "schemas/tensorboard.pb.h"

namespace fs = std::filesystem;
using troupe::test::shell_status;
using troupe::test::slurp;
using troupe::test::troupe_bin;

namespace {
const std::string kSrc = TROUPE_SOURCE_DIR;

struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("figures", name) {}
};

// Runs troupe from the source folder; stdout and stderr go to the scratch folder.
int run_troupe(const Scratch& s, const std::string& args, int timeout_s = 300) {
  return shell_status("cd '" + kSrc + "' && timeout " + std::to_string(timeout_s) + " '" + troupe_bin() + "' " + args +
                      " > '" + s.path("stdout.txt") + "' 2> '" + s.path("stderr.txt") + "'");
}

bool is_png(const std::string& path) { return slurp(path).rfind("\x89PNG\r\n\x1a\n", 0) == 0; }

std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}
}  // namespace

TEST_CASE("CRC-32C and TFRecord framing follow TensorFlow's", "[tensorboard]") {
  // RFC 3720's check value and TensorFlow's crc32c_test.cc values
  CHECK(troupe::crc32c("123456789", 9) == 0xe3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff');
  CHECK(troupe::crc32c(zeros.data(), 32) == 0x8a9136aau);
  CHECK(troupe::crc32c(ones.data(), 32) == 0x62a8ab43u);
  // Mask: rotate right by 15, add 0xa282ead8 (TensorFlow's crc32c::Mask)
  const uint32_t c = troupe::crc32c("foo", 3);
  CHECK(troupe::masked_crc32c("foo", 3) == (((c >> 15) | (c << 17)) + 0xa282ead8u));
  const std::string rec = troupe::tfrecord_frame("hello");
  REQUIRE(rec.size() == 8 + 4 + 5 + 4);
  CHECK(rec[0] == 5);
  CHECK(rec.substr(12, 5) == "hello");

  Scratch s("tfrecord");
  s.write("two.tfrecord", troupe::tfrecord_frame("first") + troupe::tfrecord_frame(""));
  auto recs = troupe::read_tfrecords(s.path("two.tfrecord"));
  REQUIRE(recs.size() == 2);
  CHECK(recs[0] == "first");
  CHECK(recs[1].empty());
  std::string bad = rec;
  bad[13] ^= 1;  // one flipped bit in the data
  s.write("bad.tfrecord", bad);
  CHECK_THROWS_WITH(troupe::read_tfrecords(s.path("bad.tfrecord")), Catch::Contains("data CRC mismatch"));
  s.write("short.tfrecord", rec.substr(0, rec.size() - 1));
  CHECK_THROWS_WITH(troupe::read_tfrecords(s.path("short.tfrecord")), Catch::Contains("truncated"));
}

TEST_CASE("an event holds every scalar, 0 included, at its step", "[tensorboard]") {
  Scratch s("writer");
  std::string path;
  {
    troupe::EventWriter w(s.path("tb"));
    w.add_scalars(7, {{"lr", 0.0}, {"loss", 2.5}}, 1.75e9);
    path = w.path();
  }
  auto recs = troupe::read_tfrecords(path);
  REQUIRE(recs.size() == 2);
  troupe::tensorboard::Event ev;
  REQUIRE(ev.ParseFromString(recs[1]));
  CHECK(ev.step() == 7);
  CHECK(ev.wall_time() == 1.75e9);
  REQUIRE(ev.summary().value_size() == 2);
  CHECK(ev.summary().value(0).tag() == "lr");
  CHECK(ev.summary().value(0).has_simple_value());  // TensorBoard skips a value without it
  CHECK(ev.summary().value(0).simple_value() == 0.0f);
  CHECK(ev.summary().value(1).simple_value() == 2.5f);
}

TEST_CASE("the scalars of a metrics record: numbers by key, markers and nulls left out", "[tensorboard]") {
  auto sc = troupe::tensorboard_scalars(
      {{"step", 3}, {"loss", 2.5}, {"grad_norm", nullptr}, {"skipped", false}, {"val", {{"a", 1.0}}}});
  REQUIRE(sc.size() == 2);
  CHECK(sc[0] == std::make_pair(std::string("loss"), 2.5));
  CHECK(sc[1] == std::make_pair(std::string("val/a"), 1.0));
  CHECK(troupe::tensorboard_scalars({{"resumed_from", "x"}, {"step", 4}}).empty());
  CHECK(troupe::tensorboard_scalars({{"summary", true}, {"steps", 4}, {"val_loss", 1.0}}).empty());
}

TEST_CASE("train --tensorboard writes event files whose scalars equal metrics.jsonl", "[tensorboard][cli]") {
  Scratch s("events");
  const int rc = run_troupe(s, "train --config configs/tiny.toml --run-dir '" + s.path("run") + "' --tensorboard '" +
                               s.path("tb") + "' --set data.cache_dir='" + s.path("cache") +
                               "' --set train.steps=4 --set train.eval_interval=2 --set train.eval_batches=1"
                               " --set train.sample_tokens=0");
  INFO(slurp(s.path("stderr.txt")));
  REQUIRE(rc == 0);
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(s.path("tb"))) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  CHECK(files[0].filename().string().find("events.out.tfevents.") == 0);

  // every record decodes (both CRCs checked) as an Event; the first is the file version
  auto records = troupe::read_tfrecords(files[0].string());
  REQUIRE(records.size() > 1);
  troupe::tensorboard::Event first;
  REQUIRE(first.ParseFromString(records[0]));
  CHECK(first.file_version() == "brain.Event:2");
  std::map<std::pair<int64_t, std::string>, float> events;
  for (size_t i = 1; i < records.size(); ++i) {
    troupe::tensorboard::Event ev;
    REQUIRE(ev.ParseFromString(records[i]));
    REQUIRE(ev.has_summary());
    CHECK(ev.wall_time() > 1.7e9);
    for (auto& v : ev.summary().value()) events[{ev.step(), v.tag()}] = v.simple_value();
  }
  // ... and holds each number of metrics.jsonl (as float), and nothing else
  size_t expected = 0;
  int steps = 0, evals = 0;
  for (auto& j : jsonl(s.path("run/metrics.jsonl"))) {
    if (!j.contains("step") || j.contains("summary")) continue;
    steps += j.contains("loss");
    evals += j.contains("val_loss");
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "ms_per_step", "loss_scale", "mfu", "val_loss"}) {
      if (!j.contains(key)) continue;
      ++expected;
      auto it = events.find({j["step"].get<int64_t>(), key});
      INFO("step " << j["step"] << " " << key);
      REQUIRE(it != events.end());
      CHECK(it->second == (float)j[key].get<double>());
    }
  }
  CHECK(steps == 4);
  CHECK(evals == 2);
  CHECK(events.size() == expected);
  CHECK(events.count({4, "val_loss"}) == 1);
  CHECK(events.at({1, "mfu"}) > 0);

  // a TensorBoard directory that cannot be made is refused before the run directory exists
  s.write("file", "x");
  CHECK(run_troupe(s, "train --config configs/tiny.toml --run-dir '" + s.path("run2") + "' --tensorboard '" +
                          s.path("file/tb") + "' --set data.cache_dir='" + s.path("cache") + "' --set train.steps=1") == 2);
  CHECK(slurp(s.path("stderr.txt")).find("error: cannot create TensorBoard directory") != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("run2")));
}

TEST_CASE("troupe plot draws a run, marks its resumes and recoveries and refuses a folder that is no run",
          "[plot][cli]") {
  Scratch s("plot");
  // a run that was resumed (at step 2) and recovered after a failure (at step 3), as
  // metrics.jsonl records them (actors/job.cpp)
  std::string m;
  auto step = [&](int k, double loss) {
    m += nlohmann::json({{"step", k}, {"loss", loss}, {"lr", 1e-3 * k}, {"grad_norm", 1.0 / k}, {"tokens_per_s", 1000.0 + k},
                         {"ms_per_step", 50.0}, {"skipped", false}, {"loss_scale", 1.0}, {"mfu", 0.01 * k}})
             .dump() + "\n";
  };
  step(1, 6.0), step(2, 5.5), step(3, 5.2);
  m += nlohmann::json({{"resumed_from", "run/checkpoints/step-00000002"}, {"step", 2}}).dump() + "\n";
  step(3, 5.2), step(4, 5.0);
  m += nlohmann::json({{"step", 4}, {"val_loss", 5.1}}).dump() + "\n";
  m += nlohmann::json({{"resumed_from", "the memory snapshot of step 3"}, {"step", 3}, {"recovery", 1}}).dump() + "\n";
  step(4, 5.0), step(5, 4.8), step(6, 4.7);
  m += nlohmann::json({{"step", 6}, {"val_loss", 4.9}}).dump() + "\n";
  fs::create_directories(s.path("run"));
  s.write("run/metrics.jsonl", m);
  fs::copy_file(kSrc + "/configs/tiny.toml", s.path("run/config.toml"));
  REQUIRE(run_troupe(s, "plot '" + s.path("run") + "' --out '" + s.path("run.png") + "'", 60) == 0);
  const std::string out = slurp(s.path("stdout.txt"));
  INFO(out << slurp(s.path("stderr.txt")));
  CHECK(out.find("resume at step 2") != std::string::npos);
  CHECK(out.find("recovery at step 3") != std::string::npos);
  CHECK(is_png(s.path("run.png")));
  CHECK_FALSE(fs::exists(s.path("run.png.tmp")));

  // a folder without metrics.jsonl: exit 2, one sentence naming the fix, no picture
  fs::create_directories(s.path("empty"));
  CHECK(run_troupe(s, "plot '" + s.path("empty") + "' --out '" + s.path("no.png") + "'", 60) == 2);
  const std::string err = slurp(s.path("stderr.txt"));
  CHECK(err.rfind("error: ", 0) == 0);
  CHECK(err.find("is not a troupe run directory") != std::string::npos);
  CHECK(err.find("--run-dir") != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("no.png")));
}

TEST_CASE("troupe simulate --png draws the timeline", "[plot][schedules]") {
  Scratch s("simulate");
  REQUIRE(run_troupe(s, "simulate --schedule zb-h1 --stages 4 --microbatches 8 --quiet --png '" + s.path("zb.png") + "'",
                 60) == 0);
  CHECK(is_png(s.path("zb.png")));
  CHECK(slurp(s.path("stdout.txt")).find("wrote " + s.path("zb.png")) != std::string::npos);
  // an unwritable destination is refused before the report is printed or gnuplot runs
  CHECK(run_troupe(s, "simulate --png '" + s.path("missing/zb.png") + "'", 60) == 2);
  CHECK(slurp(s.path("stderr.txt")).rfind("error: cannot write", 0) == 0);
  CHECK(slurp(s.path("stdout.txt")).empty());
  // a directory: exit 2, one line naming the fix, no NAME.tmp* left beside it
  fs::create_directories(s.path("dir"));
  CHECK(run_troupe(s, "simulate --png '" + s.path("dir") + "'", 60) == 2);
  const std::string err = slurp(s.path("stderr.txt"));
  INFO(err);
  CHECK(err.rfind("error: --png " + s.path("dir") + " is a directory; pass a file path", 0) == 0);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(slurp(s.path("stdout.txt")).empty());
  for (auto& e : fs::directory_iterator(s.path("")))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

TEST_CASE("plot --out that gnuplot cannot write: one sentence, no temporary left", "[plot][cli]") {
  Scratch s("plotfail");
  fs::create_directories(s.path("run"));
  s.write("run/metrics.jsonl", nlohmann::json({{"step", 1}, {"loss", 5.0}, {"lr", 1e-3}, {"grad_norm", 1.0},
                                               {"tokens_per_s", 1000.0}, {"ms_per_step", 50.0}, {"mfu", 0.01}})
                                       .dump() + "\n");
  CHECK(run_troupe(s, "plot '" + s.path("run") + "' --out '" + s.path("run") + "'", 60) == 2);
  std::string err = slurp(s.path("stderr.txt"));
  CHECK(err.rfind("error: --out " + s.path("run") + " is a directory", 0) == 0);
  // /proc accepts no new files: refused up front, exit 2, one line
  CHECK(run_troupe(s, "plot '" + s.path("run") + "' --out /proc/troupe-test.png", 60) == 2);
  err = slurp(s.path("stderr.txt"));
  INFO(err);
  CHECK(err.rfind("error: cannot write /proc/troupe-test.png", 0) == 0);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  for (auto& e : fs::directory_iterator(s.path("run")))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

TEST_CASE("train --trace-png draws the measured timeline of the last step", "[plot][cli]") {
  Scratch s("trace");
  REQUIRE(run_troupe(s, "train --config configs/tiny.toml --run-dir '" + s.path("run") + "' --set data.cache_dir='" +
                            s.path("cache") + "' --set train.steps=2 --set train.eval_interval=0 --set train.eval_batches=1"
                            " --set train.sample_tokens=0 --trace '" + s.path("t.json") + "' --trace-png '" +
                            s.path("t.png") + "'") == 0);
  CHECK(is_png(s.path("t.png")));
  CHECK(slurp(s.path("stdout.txt")).find("measured timeline of step 2") != std::string::npos);
  // without --trace there is nothing to draw: refused before anything runs
  CHECK(run_troupe(s, "train --config configs/tiny.toml --run-dir '" + s.path("run2") + "' --trace-png '" +
                          s.path("u.png") + "'") == 2);
  CHECK(slurp(s.path("stderr.txt")).find("error: --trace-png draws the measured trace: pass --trace") != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("run2")));
  // a directory as --trace-png: refused before the run directory or the trace exists
  CHECK(run_troupe(s, "train --config configs/tiny.toml --run-dir '" + s.path("run3") + "' --set data.cache_dir='" +
                          s.path("cache") + "' --trace '" + s.path("t3.json") + "' --trace-png '" + s.path("") + "'") == 2);
  CHECK(slurp(s.path("stderr.txt")).find("error: --trace-png ") == 0);
  CHECK_FALSE(fs::exists(s.path("run3")));
  CHECK_FALSE(fs::exists(s.path("t3.json")));
}
