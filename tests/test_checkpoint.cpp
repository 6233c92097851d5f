// Snapshots (issue 7): exact resume, resharding to other layouts, retention, and a table
// of corruptions, each detected and named. The command-line side (--resume, signals, a
// writer killed mid-save) is in test_cli.cpp.
#include <catch2/catch.hpp>

#include <cerrno>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "actors/job.h"
#include "checkpoint/snapshot.h"
#include "core/error.h"
#include "tests/job_helpers.h"

using namespace troupe;
using namespace troupe::test;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path dir;
  explicit TempDir(const std::string& name) {
    dir = fs::temp_directory_path() / ("troupe-ckpt-" + name + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string path(const std::string& f = "") const { return (dir / f).string(); }
};

void same_params(const JobResult& a, const JobResult& b) {
  auto pa = by_name(a), pb = by_name(b);
  REQUIRE(pa.size() == pb.size());
  for (auto& [n, t] : pa) {
    INFO(n);
    CHECK(std::memcmp(t.data(), pb[n].data(), t.nbytes()) == 0);
  }
}
}  // namespace

TEST_CASE("stop at step k, resume, run to n: bitwise the run that never stopped", "[checkpoint][dp][tp]") {
  struct Case {
    const char* what;
    std::function<void(Config&, JobContext&)> set;
  };
  const Case cases[] = {
      {"fp16, PP=2 TP=2 DP=2, M=2, an overflow skipped at step 2 (before the snapshot)",
       [](Config& c, JobContext& x) {
         c.parallel.dp = 2;
         c.parallel.tp = 2;
         c.train.precision = "fp16";
         c.train.initial_loss_scale = 1024;
         c.train.hysteresis = 1;
         x.fault_inf_step = 2;
         x.fault_inf_rank = 3;
       }},
      {"bf16, PP=2 DP=2 (ZeRO-1), zb-h1, dropout", [](Config& c, JobContext&) {
         c.parallel.dp = 2;
         c.parallel.schedule = "zb-h1";
         c.train.precision = "bf16";
         c.model.dropout = 0.1;
       }},
      {"fp32, PP=2, interleaved (2 chunks), M=4", [](Config& c, JobContext&) {
         c.parallel.schedule = "interleaved";
         c.parallel.chunks = 2;
         c.parallel.microbatches = 4;
       }},
  };
  for (const auto& cs : cases) {
    INFO(cs.what);
    TempDir t("resume");
    Config c = tiny(2, 2);
    c.train.steps = 6;
    c.checkpoint.interval = 3;
    JobContext x = ctx();
    cs.set(c, x);
    x.checkpoint_dir = t.path("ck");
    auto straight = run_job(c, x);
    REQUIRE(straight.snapshots.size() == 2);
    CHECK(straight.snapshots[0].ok);
    auto state = std::make_shared<TrainState>(load_snapshot(t.path("ck/step-00000003"), c));
    CHECK(state->step == 3);
    JobContext y = ctx();
    cs.set(c, y);
    y.fault_inf_step = -1;  // step 2 is behind us
    y.resume = state;
    y.checkpoint_dir = t.path("ck2");
    auto resumed = run_job(c, y);
    CHECK(resumed.first_step == 4);
    REQUIRE(resumed.losses.size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK(resumed.losses[i] == straight.losses[3 + i]);
      CHECK(resumed.loss_scales[i] == straight.loss_scales[3 + i]);
    }
    if (c.train.precision == "fp16") CHECK(straight.skipped[1]);
    same_params(straight, resumed);
    // and the snapshot of step 6 the resumed run wrote is byte for byte the straight run's
    for (auto& e : fs::directory_iterator(t.path("ck/step-00000006"))) {
      if (e.path().filename() == "manifest.capnp") continue;
      std::ifstream a(e.path(), std::ios::binary), b(t.path("ck2/step-00000006/") + e.path().filename().string(),
                                                         std::ios::binary);
      std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
      INFO(e.path().filename());
      CHECK((sa == sb && !sa.empty()));
    }
  }
}

TEST_CASE("a snapshot taken at (TP, PP, DP) = (2, 2, 2) continues at (1, 4, 1) and (1, 1, 4)", "[checkpoint][reshard]") {
  TempDir t("reshard");
  Config c = tiny(2, 1);
  c.parallel.tp = 2;
  c.parallel.dp = 2;
  c.train.steps = 4;
  c.checkpoint.interval = 3;
  JobContext x = ctx();
  x.checkpoint_dir = t.path("ck");
  auto orig = run_job(c, x);  // continues at the original layout to step 4
  auto state = std::make_shared<TrainState>(load_snapshot(t.path("ck/step-00000003"), c));
  struct Layout {
    int tp, pp, dp, M;
  };
  for (Layout l : {Layout{1, 4, 1, 2}, Layout{1, 1, 4, 1}, Layout{2, 1, 1, 2}}) {
    INFO("TP=" << l.tp << " PP=" << l.pp << " DP=" << l.dp);
    Config r = tiny(l.pp, l.M);
    r.parallel.tp = l.tp;
    r.parallel.dp = l.dp;
    r.train.steps = 4;
    JobContext y = ctx();
    y.resume = state;
    auto res = run_job(r, y);
    REQUIRE(res.losses.size() == 1);
    CHECK(res.losses[0] == Approx(orig.losses[3]).epsilon(1e-5));
    // parameters after the step: the same within the rounding of another summation order
    auto a = by_name(orig), b = by_name(res);
    for (auto& [n, tt] : a) {
      INFO(n);
      CHECK(rel_diff(b[n], tt) <= 1e-4);
    }
  }
}

TEST_CASE("retention keeps the newest complete snapshots and never touches unfinished ones", "[checkpoint]") {
  TempDir t("retention");
  Config c = tiny(2, 2);
  c.train.steps = 5;
  c.checkpoint.interval = 1;
  c.checkpoint.keep_last = 2;
  fs::create_directories(t.path("ck/step-00000009.tmp-1"));  // a save interrupted earlier: no manifest
  JobContext x = ctx();
  x.checkpoint_dir = t.path("ck");
  auto r = run_job(c, x);
  REQUIRE(r.snapshots.size() == 5);
  for (auto& s : r.snapshots) CHECK(s.ok);
  auto all = list_snapshots(t.path("ck"));
  REQUIRE(all.size() == 2);
  CHECK(all[0].first == 4);
  CHECK(all[1].first == 5);
  CHECK(fs::exists(t.path("ck/step-00000009.tmp-1")));
  {  // snapshots of later steps than the one written (a timeline this run resumed before) stay
    for (int k : {1, 2, 3, 7, 8}) {
      const std::string d = t.path("other/step-0000000" + std::to_string(k));
      fs::create_directories(d);
      std::ofstream(d + "/manifest.capnp") << "x";
    }
    auto gone = apply_retention(t.path("other"), 1, 3);
    CHECK(gone.size() == 2);  // steps 1 and 2; 3 (just written), 7 and 8 stay
    std::vector<int64_t> left;
    for (auto& [k, d] : list_snapshots(t.path("other"))) left.push_back(k);
    CHECK(left == std::vector<int64_t>{3, 7, 8});
  }
  // a save that fails (here: the directory cannot be created) is reported; training goes on
  std::ofstream(t.path("afile")) << "x";
  JobContext y = ctx();
  y.checkpoint_dir = t.path("afile/ck");
  c.checkpoint.max_failures = 6;  // 5 failures: logged, the run goes on
  auto f = run_job(c, y);
  CHECK(f.losses.size() == 5);
  REQUIRE(f.snapshots.size() == 5);
  CHECK_FALSE(f.snapshots[0].ok);
  CHECK(f.snapshots[0].error.find("afile") != std::string::npos);
  CHECK(f.snapshots[0].code == ENOTDIR);  // the cause's errno travels with it, for a fix by cause
  // failing again and again is not a glitch: the run stops, naming the limit and the fix
  c.checkpoint.max_failures = 2;
  try {
    run_job(c, y);
    FAIL("the run should have stopped after 2 failed snapshots");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("checkpoint.max_failures = 2") != std::string::npos);
    CHECK(std::string(e.what()).find("afile") != std::string::npos);
    CHECK(std::string(e.what()).find("a part of it that should be a folder is a file") != std::string::npos);
    CHECK(std::string(e.what()).find("no snapshot of this run is on disk") != std::string::npos);
  }
}

TEST_CASE("each corruption of a snapshot is detected and named", "[checkpoint][corrupt]") {
  TempDir t("corrupt");
  Config c = tiny(2, 2);
  c.train.steps = 2;
  c.checkpoint.interval = 1;
  JobContext x = ctx();
  x.checkpoint_dir = t.path("ck");
  run_job(c, x);
  const std::string good = t.path("ck/step-00000002");
  REQUIRE_NOTHROW(load_snapshot(good, c));
  auto fresh = [&](const std::string& name) {
    const std::string d = t.path(name);
    fs::copy(good, d, fs::copy_options::recursive);
    return d;
  };
  auto flip = [](const std::string& f, long at) {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(at);
    char ch;
    s.get(ch);
    s.seekp(at);
    s.put((char)(ch ^ 0x5a));
  };
  const std::string shard = "/shard-dp0-pp1-tp0.bin";
  struct Corruption {
    const char* what;
    std::function<void(const std::string&)> apply;
    std::vector<std::string> needles;
  };
  const Corruption table[] = {
      {"a flipped byte in tensor data", [&](const std::string& d) { flip(d + shard, (long)fs::file_size(d + shard) - 7); },
       {"shard-dp0-pp1-tp0.bin", "checksum"}},
      {"a truncated shard file",
       [&](const std::string& d) { fs::resize_file(d + shard, fs::file_size(d + shard) / 2); },
       {"shard-dp0-pp1-tp0.bin", "truncated"}},
      {"a missing shard file", [&](const std::string& d) { fs::remove(d + shard); }, {"missing", "shard-dp0-pp1-tp0.bin"}},
      {"no manifest (an interrupted save)", [&](const std::string& d) { fs::remove(d + "/manifest.capnp"); },
       {"manifest.capnp", "incomplete"}},
      {"a garbage manifest",
       [&](const std::string& d) { std::ofstream(d + "/manifest.capnp", std::ios::binary) << std::string(64, 'x'); },
       {"manifest.capnp", "damaged"}},
      {"a flipped byte in the manifest (its step field)", [&](const std::string& d) { flip(d + "/manifest.capnp", 24); },
       {"manifest.capnp", "checksum"}},
      {"a truncated manifest",
       [&](const std::string& d) { fs::resize_file(d + "/manifest.capnp", 24); },
       {"manifest.capnp", "damaged"}},
  };
  int i = 0;
  for (const auto& cr : table) {
    INFO(cr.what);
    const std::string d = fresh("bad" + std::to_string(i++));
    cr.apply(d);
    try {
      load_snapshot(d, c);
      FAIL("not detected");
    } catch (const UserError& e) {
      const std::string msg = e.what();
      INFO(msg);
      for (auto& n : cr.needles) CHECK(msg.find(n) != std::string::npos);
    }
  }
  {  // a manifest from another model: the resuming run's config differs in a model key
    Config other = c;
    other.model.n_embd = 64;
    CHECK_THROWS_WITH(load_snapshot(good, other), Catch::Contains("model.n_embd") && Catch::Contains("32"));
    Config lr = c;
    lr.optim.lr = 5e-3;
    CHECK_THROWS_WITH(load_snapshot(good, lr), Catch::Contains("optim.lr"));
    Config ok = c;  // what may differ
    ok.train.steps = 50;
    ok.parallel.pp = 4;
    ok.checkpoint.interval = 7;
    CHECK_NOTHROW(load_snapshot(good, ok));
  }
  {  // `latest` falls back past a damaged newest snapshot, and says so
    flip(t.path("ck/step-00000002") + shard, 40);
    std::vector<std::string> skipped;
    TrainState st = load_latest(t.path("ck"), c, &skipped);
    CHECK(st.step == 1);
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("step-00000002") != std::string::npos);
    // the unreadable newer snapshot is moved aside, not left to be replaced or deleted
    CHECK(skipped[0].find("moved aside to " + t.path("ck/step-00000002.unreadable")) != std::string::npos);
    CHECK(fs::is_directory(t.path("ck/step-00000002.unreadable")));
    CHECK(list_snapshots(t.path("ck")).size() == 1);
    CHECK_THROWS_WITH(load_latest(t.path("nothing-here"), c, &skipped), Catch::Contains("no usable snapshot"));
  }
}
