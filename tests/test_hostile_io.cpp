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
  CHECK(err.find("could not be written (No space left on device)") != std::string::npos);
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
  expect_user_error(run_troupe("generate '" + snap + "' --seed abc", s, 30), {"--seed", "'abc'", "0 to 2^63 - 1"});
  // past int64: CLI11 2.1 would saturate it silently
  expect_user_error(run_troupe("generate '" + snap + "' --seed 99999999999999999999999", s, 30),
                    {"--seed", "out of range", "at most 9223372036854775807"});
  expect_user_error(run_troupe("simulate --quiet --stages 1e9", s, 30), {"--stages", "1 to 1024"});
  expect_user_error(run_troupe("--bogus", s, 30), {"--bogus", "train", "launch"});
  expect_user_error(run_troupe("--version --bogus", s, 30), {"--version", "--bogus", "nothing after it"});
  expect_user_error(run_troupe("simulate --quiet --cost f=1,f=2", s, 30), {"--cost f", "twice"});
  // a huge value is quoted back shortened, in one line
  Run lr = run_troupe("train --config configs/tiny.toml --set optim.lr=" + std::string(5000, '7') + "x", s, 30);
  expect_user_error(lr, {"optim.lr", "e.g. optim.lr = "});
  CHECK(lr.err.size() < 3000);
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

TEST_CASE("an output path that is one of the command's own inputs or files is refused, and nothing is overwritten",
          "[cli][hostile][export]") {
  Scratch s("self");
  const std::string tiny = "train --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") +
                           "' --set train.steps=2 --set train.sample_tokens=0 --set train.eval_interval=0 "
                           "--set train.eval_batches=1 --set checkpoint.interval=2";
  Run t = run_troupe(tiny + " --run-dir '" + s.path("run") + "'", s);
  INFO(t.err);
  REQUIRE(t.rc == 0);
  const std::string run = s.path("run"), snap = run + "/checkpoints/step-00000002";
  REQUIRE(fs::exists(snap + "/manifest.capnp"));
  const std::string manifest = slurp(snap + "/manifest.capnp"), metrics = slurp(run + "/metrics.jsonl");
  expect_user_error(run_troupe("export '" + snap + "' '" + snap + "/manifest.capnp'", s), {"output", "lies inside"});
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 2 --logits-out '" + snap + "/../step-00000002/x.json'", s),
                    {"--logits-out", "lies inside"});
  expect_user_error(run_troupe("plot '" + run + "' --out '" + run + "/metrics.jsonl'", s), {"--out", "metrics.jsonl"});
  CHECK(slurp(snap + "/manifest.capnp") == manifest);
  CHECK(slurp(run + "/metrics.jsonl") == metrics);
  // train --trace onto its own config, its run's files, its data
  const std::string cfg = s.write("c.toml", slurp(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml"));
  expect_user_error(run_troupe("train --config '" + cfg + "' --run-dir '" + s.path("r2") + "' --trace '" + cfg + "'", s),
                    {"--trace", "c.toml", "destroy"});
  expect_user_error(run_troupe(tiny + " --run-dir '" + run + "' --resume latest --trace '" + run + "/metrics.jsonl'", s),
                    {"--trace", "metrics.jsonl"});
  expect_user_error(run_troupe(tiny + " --run-dir '" + s.path("r3") + "' --trace tests/data/tiny_corpus.txt", s),
                    {"--trace", "tiny_corpus.txt"});
  CHECK(slurp(cfg) == slurp(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml"));
  CHECK(slurp(run + "/metrics.jsonl") == metrics);
  CHECK_FALSE(fs::exists(s.path("r2")));
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") +
                                   "' --report tests/data/tiny_corpus.txt",
                               s),
                    {"--report", "tiny_corpus.txt"});
}

TEST_CASE("files a user names are read with a bound, environment switches are checked before anything is written, "
          "and a failed write to standard output is an error",
          "[cli][hostile]") {
  Scratch s("bounds3");
  const std::string base = "train --config configs/tiny.toml --set train.steps=2 --set data.cache_dir='" +
                           s.path("cache") + "' --run-dir '" + s.path("run") + "'";
  // sparse files: no disk is used
  REQUIRE(troupe::test::shell_status("truncate -s 300M '" + s.path("tok.model") + "' && truncate -s 20M '" +
                                     s.path("big.toml") + "'") == 0);
  expect_user_error(run_troupe(base + " --set data.tokenizer='" + s.path("tok.model") + "'", s),
                    {"tokenizer model", "268435456"});
  expect_user_error(run_troupe("train --config '" + s.path("big.toml") + "'", s), {"16 MiB"});
  expect_user_error(run_troupe(base + " --set parallel.pp=2", s, 60,
                               "env -u TROUPE_JOB_SECRET TROUPE_RANK=0 TROUPE_WORLD_SIZE=2 "
                               "TROUPE_COORDINATOR=127.0.0.1:29556 TROUPE_JOB_SECRET_FILE=/dev/zero"),
                    {"TROUPE_JOB_SECRET_FILE", "regular file"});
  expect_user_error(run_troupe(base + " --set data.threads=2000000000", s), {"data.threads", "per core"});
  expect_user_error(run_troupe(base + " --set train.initial_loss_scale=1e39", s), {"initial_loss_scale", "2^64"});
  expect_user_error(run_troupe(base + " --set data.cache_dir=", s), {"data.cache_dir is empty"});
  expect_user_error(run_troupe(base, s, 60, "env TROUPE_GEMM=cublas"), {"TROUPE_GEMM=cublas"});
  CHECK_FALSE(fs::exists(s.path("run")));
  CHECK_FALSE(fs::exists(s.path("cache")));
  expect_user_error(run_troupe("help train export", s, 30), {"one command"});
  // standard output on a full device, or closed
  const std::string bin = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && '" + troupe_bin() + "' ";
  CHECK(troupe::test::shell_status(bin + "simulate --quiet > /dev/full 2> '" + s.path("e1") + "'") == 2);
  CHECK(slurp(s.path("e1")).find("cannot write to standard output") != std::string::npos);
  CHECK(troupe::test::shell_status(bin + "simulate --quiet >&- 2> '" + s.path("e2") + "'") == 2);
  CHECK(slurp(s.path("e2")).find("standard output is closed") != std::string::npos);
  CHECK(troupe::test::shell_status(bin + "--version > /dev/full 2> /dev/null") == 2);
}

TEST_CASE("SIGTERM or SIGINT stops a process that waits for the others to join at once, not at the join timeout, "
          "and leaves no run directory",
          "[cli][hostile][multiprocess]") {
  Scratch s("joinsig");
  for (const char* sig : {"TERM", "INT"}) {
    const std::string rank = std::string(sig) == "TERM" ? "0" : "1";  // the hub and a joiner
    const std::string port = std::to_string(troupe::test::quiet_port(rank[0]));
    const std::string cmd =
        "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && t0=$(date +%s); TROUPE_RANK=" + rank +
        " TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=127.0.0.1:" + port +
        " TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef timeout 120 '" + troupe_bin() +
        "' train --config configs/tiny.toml --set parallel.pp=2 --set fault.join_timeout_s=90 --set data.cache_dir='" +
        s.path("cache") + "' --run-dir '" + s.path(std::string("run") + sig) + "' 2> '" + s.path("err") +
        "' & p=$!; for i in $(seq 1 600); do grep -q 'joining the job' '" + s.path("err") +
        "' && break; sleep 0.1; done; sleep 0.5; kill -" + sig + " $p; wait $p; echo $? > '" + s.path("rc") + "'; echo $(( $(date +%s) - t0 )) > '" +
        s.path("s") + "'";
    troupe::test::shell_status(cmd);
    const std::string err = slurp(s.path("err"));
    INFO(sig << ": " << err);
    expect_user_error(Run{std::atoi(slurp(s.path("rc")).c_str()), err}, {"stopped by signal", "join"});
    CHECK(std::atoi(slurp(s.path("s")).c_str()) < 30);  // fault.join_timeout_s is 90
    CHECK_FALSE(fs::exists(s.path(std::string("run") + sig)));  // nothing trained: the run dir it made is gone
  }
}

TEST_CASE("an output that is a symbolic link or shared by two outputs is refused, time settings have a floor, and "
          "launch prints a sentence every process says once",
          "[cli][hostile][launch]") {
  Scratch s("links");
  fs::create_symlink(s.path("target.txt"), s.path("link.txt"));
  expect_user_error(run_troupe("simulate --quiet --dump '" + s.path("link.txt") + "'", s, 30),
                    {"--dump", "symbolic link", "target.txt"});
  CHECK(fs::is_symlink(s.path("link.txt")));
  expect_user_error(run_troupe("simulate --quiet --trace '" + s.path("x") + "' --png '" + s.path("x") + "'", s, 30),
                    {"--trace and --png", "same path"});
  CHECK_FALSE(fs::exists(s.path("x")));
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.timeout_s=1e-9", s, 30),
                    {"train.timeout_s", "0.5"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set fault.heartbeat_s=1e-9", s, 30),
                    {"fault.heartbeat_s", "0.05"});
  // every process finds parallel.pp = 1 too few for its 2 processes: one line, not one per process
  Run r = run_troupe("launch --nprocs 3 -- '" + troupe_bin() + "' train --config configs/tiny.toml --set parallel.pp=1 "
                     "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                     s, 120);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(count(r.err, "error: ") == 1);
}
