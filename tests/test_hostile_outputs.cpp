// Hostile inputs, ninth trial (review 14i): what troupe writes. A file --report did not
// write is never replaced; a picture cut short by a full disk is removed, not reported; a
// stopped many-source preparation leaves nothing; a data cache whose token files are a FIFO
// or were changed inside the vocabulary is refused; a run dir or checkpoint.dir inside a
// snapshot is refused; runs started in the same second each get their own run dir.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using troupe::test::expect_user_error;
using troupe::test::Run;
using troupe::test::run_on_tmpfs;
using troupe::test::run_troupe;
using troupe::test::shell_status;
using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("hostile-out", name) {}
};

// The one cache folder (<key>-v<V>) under `cache`.
std::string cache_key_dir(const std::string& cache) {
  for (auto& e : fs::directory_iterator(cache))
    if (e.is_directory()) return e.path().string();
  return "";
}

size_t count_entries(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}
}  // namespace

TEST_CASE("prepare --report: a file of the companion's name that --report did not write is refused, not emptied",
          "[cli][hostile]") {
  Scratch s("report");
  const std::string cache = "--config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "' ";
  for (const std::string& report : {s.path("rep.json"), s.path("rep2")}) {
    const std::string companion = fs::path(report).replace_extension(".removed.jsonl").string();
    s.write(fs::path(companion).filename().string(), "precious user data\n");
    expect_user_error(run_troupe("prepare " + cache + "--report '" + report + "'", s, 120),
                      {"--report", companion.c_str(), "move it away"});
    CHECK(slurp(companion) == "precious user data\n");
    CHECK_FALSE(fs::exists(report));
  }
  // a companion an earlier --report wrote (removed samples, or empty) is replaced as before
  s.write("rep3.removed.jsonl", "{\"source\": \"corpus\", \"reason\": \"exact_duplicate\", \"text\": \"x\"}\n");
  const Run ok = run_troupe("prepare " + cache + "--report '" + s.path("rep3.json") + "'", s, 120);
  INFO(ok.err);
  CHECK(ok.rc == 0);
  CHECK(fs::exists(s.path("rep3.json")));
  CHECK(run_troupe("prepare " + cache + "--report '" + s.path("rep3.json") + "'", s, 120).rc == 0);
}

TEST_CASE("simulate --png on a disk without room for the picture: exit 2 before drawing, no picture left", "[cli][hostile]") {
  if (shell_status("command -v gnuplot > /dev/null 2>&1") != 0) {
    WARN("skipped: gnuplot is not installed (scripts/setup.sh installs it)");
    return;
  }
  Scratch s("pngfull");
  const std::string mnt = s.path("mnt"), out = s.path("out");
  fs::create_directories(out);
  // 8 KiB left: gnuplot's picture (about 30 KiB) would be cut at a block boundary, and
  // pngcairo exits 0 then: the room (512 KiB) is asked for before gnuplot runs (trial 46, L4)
  const std::string body = "dd if=/dev/zero of='" + mnt + "/fill' bs=1k count=2040 > /dev/null 2>&1 || true\nset +e\n'" +
                           troupe_bin() + "' simulate --quiet --stages 8 --microbatches 64 --png '" + mnt +
                           "/s.png' > '" + out + "/out' 2> '" + out + "/err'\necho $? > '" + out + "/rc'\nls -a '" +
                           mnt + "' > '" + out + "/ls'\n";
  std::string why;
  if (!run_on_tmpfs(s, mnt, 2, body, &why)) {
    WARN("skipped: cannot mount a small tmpfs in a mount namespace here (needs root): " << why);
    return;
  }
  const Run r{std::atoi(slurp(out + "/rc").c_str()), slurp(out + "/err")};
  INFO(slurp(s.path("tmpfs.log")));
  expect_user_error(r, {"cannot write ", "s.png: it needs about 512.0 KiB but its filesystem has ", "free space there",
                        "--png"});
  CHECK(slurp(out + "/out").find("wrote") == std::string::npos);
  const std::string left = slurp(out + "/ls");
  CHECK(left.find("s.png") == std::string::npos);  // neither the picture nor its temporary
}

TEST_CASE("a many-source preparation stopped by SIGTERM leaves no scratch file behind", "[cli][hostile][datasets]") {
  Scratch s("blendstop");
  const std::string corpus = std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt";
  std::string cfg = slurp(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml");
  cfg.replace(cfg.find("corpus = \"tests/data/tiny_corpus.txt\"\n"), 38, "");
  for (int i = 0; i < 3000; ++i)
    cfg += "\n[[data.sources]]\nname = \"s" + std::to_string(10000 + i) + "\"\npath = \"" + corpus + "\"\n";
  s.write("blend.toml", cfg);
  const std::string cache = s.path("cache");
  std::string key;  // the cache folder, seen while it is prepared
  // Starts the preparation, stops it with SIGTERM once pass 1 has left `files` scratch
  // files (polled for at most 60 s), and returns its exit status and stderr.
  auto stop_after = [&](size_t files) {
    const std::string cmd = "exec timeout -k 5 120 '" + troupe_bin() + "' prepare --config '" + s.path("blend.toml") +
                            "' --set data.cache_dir='" + cache + "' > /dev/null 2> '" + s.path("err") + "'";
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
      ::_exit(127);
    }
    size_t scratch = 0;
    for (int i = 0; i < 1200 && scratch < files; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      scratch = 0;
      std::error_code ec;
      if (fs::exists(cache) && !cache_key_dir(cache).empty()) key = cache_key_dir(cache);
      for (fs::directory_iterator it(key.empty() ? cache : key, ec), end; !key.empty() && !ec && it != end; it.increment(ec))
        scratch += it->path().extension() == ".scratch";
    }
    ::kill(pid, SIGTERM);  // (timeout forwards it to troupe)
    int st = 0;
    ::waitpid(pid, &st, 0);
    CHECK(scratch >= files);
    return Run{WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(s.path("err"))};
  };
  // the cache folder is this run's: it goes whole
  expect_user_error(stop_after(100), {"stopped by SIGTERM", "partial files were removed"});
  CHECK(count_entries(cache) == 0);
  // the cache and its key folder were there before (an earlier stop's or a user's): what
  // the run wrote into them goes, although it keeps writing while the folder is cleaned
  REQUIRE_FALSE(key.empty());
  fs::create_directories(key);
  expect_user_error(stop_after(100), {"stopped by SIGTERM", "partial files were removed"});
  CHECK(count_entries(cache) == 0);
  for (auto& e : fs::directory_iterator(s.dir)) CHECK(e.path().filename().string().rfind(".troupe-stopped", 0) != 0);
}

TEST_CASE("a data cache whose token file is a FIFO, or changed inside the vocabulary, is refused at once",
          "[cli][hostile][datasets]") {
  Scratch s("cachelies");
  const std::string args = "prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'";
  REQUIRE(run_troupe(args, s, 120).rc == 0);
  const std::string key = cache_key_dir(s.path("cache"));
  const std::string bin = key + "/corpus.train.bin";
  const std::string saved = slurp(bin);
  REQUIRE(saved.size() > 4096);
  // a FIFO: refused without waiting for a writer (the timeout would make it rc 124)
  fs::remove(bin);
  REQUIRE(::mkfifo(bin.c_str(), 0644) == 0);
  expect_user_error(run_troupe(args, s, 60), {"corpus.train.bin", "not a regular file", "delete that folder"});
  fs::remove(bin);
  // low-bit flips that stay inside the vocabulary (512): caught by the checksum in meta.json
  std::string flipped = saved;
  for (size_t at = 64; at + 1 < flipped.size(); at += 97 * 2) flipped[at] ^= 1;  // u16 ids: the low byte
  std::ofstream(bin, std::ios::binary) << flipped;
  expect_user_error(run_troupe(args, s, 60), {"corpus.train.bin", "checksum", "delete that folder"});
  std::ofstream(bin, std::ios::binary) << saved;  // restored: reused as before
  const Run ok = run_troupe(args, s, 60);
  INFO(ok.err);
  CHECK(ok.rc == 0);
  CHECK(ok.err.find("reusing") != std::string::npos);
  // a garbage meta.json: a sentence, not the JSON library's exception text
  std::ofstream(key + "/meta.json") << "{\n garbage";
  const Run meta = run_troupe(args, s, 60);
  expect_user_error(meta, {"meta.json", "delete that folder"});
  CHECK(meta.err.find("json.exception") == std::string::npos);
}

TEST_CASE("checkpoint.dir or --run-dir inside a snapshot folder is refused before anything is written",
          "[cli][hostile]") {
  Scratch s("insnap");
  const std::string snap = s.path("base/checkpoints/step-00000004");
  fs::create_directories(snap);
  s.write("base/checkpoints/step-00000004/manifest.capnp", "a manifest");
  const std::string args = "train --config configs/tiny.toml --set train.steps=1 --set data.cache_dir='" +
                           s.path("cache") + "' ";
  expect_user_error(run_troupe(args + "--run-dir '" + s.path("r1") + "' --set checkpoint.dir='" + snap + "/ck'", s, 60),
                    {"checkpoint.dir", "lies inside the snapshot", "outside it"});
  expect_user_error(run_troupe(args + "--run-dir '" + snap + "/run'", s, 60), {"--run-dir", "lies inside the snapshot"});
  expect_user_error(run_troupe(args + "--run-dir '" + snap + "'", s, 60), {"--run-dir", "is the snapshot"});
  CHECK(count_entries(snap) == 1);  // only its manifest
  CHECK_FALSE(fs::exists(s.path("r1")));
  CHECK_FALSE(fs::exists(s.path("cache")));
}

TEST_CASE("three default-named runs started together each get a run directory of their own", "[cli][hostile]") {
  Scratch s("samesecond");
  const std::string src = TROUPE_SOURCE_DIR;
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'", s, 120).rc == 0);
  std::string script = "cd '" + s.dir.string() + "'\n";
  for (int i = 0; i < 3; ++i)
    script += "timeout 300 '" + troupe_bin() + "' train --config '" + src + "/configs/tiny.toml' --set data.corpus='" +
              src + "/tests/data/tiny_corpus.txt' --set data.cache_dir='" + s.path("cache") +
              "' --set train.steps=1 --set train.eval_interval=0 --set train.sample_tokens=0 > /dev/null 2> err" +
              std::to_string(i) + " & p" + std::to_string(i) + "=$!\n";
  script += "for i in 0 1 2; do eval wait \\$p$i; echo $? >> rcs; done\n";
  s.write("three.sh", script);
  REQUIRE(shell_status("sh '" + s.path("three.sh") + "'") == 0);
  INFO(slurp(s.path("err0")) << slurp(s.path("err1")) << slurp(s.path("err2")));
  CHECK(slurp(s.path("rcs")) == "0\n0\n0\n");
  std::set<std::string> runs;
  for (auto& e : fs::directory_iterator(s.path("runs"))) {
    runs.insert(e.path().filename().string());
    CHECK(fs::file_size(e.path() / "metrics.jsonl") > 0);
  }
  CHECK(runs.size() == 3);
}
