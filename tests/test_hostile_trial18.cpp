// Hostile inputs, issue 14's eighteenth trial (a fresh reviewer's 100 cases): its two highs —
// a special token holding a space accepted but never produced (H1), a run directory inside a
// data cache folder deleted by a later preparation (H2) — and its lows: a nested jsonl field,
// a prompt longer than the context, an output path ending in '/', --calibrate of a missing
// path, a launcher's folder left by a SIGKILL, a FIFO in a dir source, plan's layout fix.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"
#include "core/temp_folder.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial18";

// The one cache folder under `cache_dir` (a tiny run's), or "" when there is none.
std::string cache_folder(const std::string& cache_dir) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(cache_dir, ec))
    if (e.is_directory()) return e.path().string();
  return "";
}
}  // namespace

TEST_CASE("a special token holding a space is refused: the tokenizer would never produce it", "[cli][hostile][data]") {
  Scratch s(kGroup, "special");
  expect_user_error(run_troupe("tokenize --config configs/tiny.toml --set 'data.special_tokens=<a b>,<c>' --set "
                               "data.cache_dir='" + s.path("c") + "'", s),
                    {"\"<a b>\" holds a space", "\"<a_b>\""});
  CHECK_FALSE(fs::exists(s.path("c")));
}

TEST_CASE("a run directory inside the data cache is refused, and a preparation removes only its own files",
          "[cli][hostile][data]") {
  Scratch s(kGroup, "cacherun");
  const std::string cache_opt = " --set data.cache_dir='" + s.path("c") + "'";
  REQUIRE(run_troupe("prepare --config configs/tiny.toml" + cache_opt, s).rc == 0);
  const std::string folder = cache_folder(s.path("c"));
  REQUIRE_FALSE(folder.empty());
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache_opt + " --run-dir '" +
                                   folder + "/run'", s),
                    {"--run-dir", "lies inside", "pass a path outside"});
  CHECK_FALSE(fs::exists(folder + "/run"));
  // a user's files put there by hand survive a rebuild of the folder (its meta.json gone)
  fs::create_directories(folder + "/mine/checkpoints");
  s.write(fs::path(folder).lexically_relative(s.dir).string() + "/notes.txt", "keep me\n");
  fs::remove(folder + "/meta.json");
  const Run r = run_troupe("prepare --config configs/tiny.toml" + cache_opt, s);
  INFO(r.err << slurp(s.path("stdout.txt")));
  CHECK(r.rc == 0);
  CHECK(fs::exists(folder + "/meta.json"));
  CHECK(fs::exists(folder + "/mine/checkpoints"));
  CHECK(slurp(folder + "/notes.txt") == "keep me\n");
  CHECK((r.err + slurp(s.path("stdout.txt"))).find("data: kept ") != std::string::npos);
  // a preparation that fails there (the file-size limit) removes its own files, not the user's
  fs::remove(folder + "/meta.json");
  const Run f = run_troupe("prepare --config configs/tiny.toml" + cache_opt, s, 120, "ulimit -f 40;");
  INFO(f.err);
  CHECK(f.rc == 2);
  CHECK(slurp(folder + "/notes.txt") == "keep me\n");
  CHECK(fs::exists(folder + "/mine/checkpoints"));
  CHECK_FALSE(fs::exists(folder + "/corpus.train.bin"));
  CHECK_FALSE(fs::exists(folder + "/meta.json"));
}

TEST_CASE("sources and prompts: a nested jsonl field, a FIFO a dir glob matches, a prompt longer than the context",
          "[cli][hostile][data]") {
  Scratch s(kGroup, "sources");
  s.write("n.jsonl", "{\"meta\": {\"body\": \"x\"}}\n");
  const std::string n = s.write("n.toml", "[data]\ncache_dir = '" + s.path("cn") + "'\n[[data.sources]]\nname = 'n'\n"
                                          "format = 'jsonl'\nfield = 'meta.body'\npath = '" + s.path("n.jsonl") + "'\n");
  expect_user_error(run_troupe("prepare --config '" + n + "'", s), {"field names a top-level key", "is not followed"});
  fs::create_directories(s.path("d"));
  s.write("d/a.txt", "hello there\n");
  REQUIRE(::mkfifo(s.path("d/f.txt").c_str(), 0600) == 0);
  const std::string d = s.write("d.toml", "[data]\ncache_dir = '" + s.path("cd") + "'\n[[data.sources]]\nname = 'd'\n"
                                          "format = 'dir'\nglob = '*.txt'\npath = '" + s.path("d") + "'\n");
  expect_user_error(run_troupe("prepare --config '" + d + "'", s), {"f.txt", "is not a regular file", "narrow the glob"});
  // a prompt of more tokens than model.block_size: generated, with a note naming what is kept
  const Run t = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 --set "
                           "train.sample_tokens=0 --set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path("run") + "'",
                           s);
  REQUIRE(t.rc == 0);
  const Run g = run_troupe("generate '" + s.path("run/checkpoints/step-00000001") + "' --tokens 2 --prompt \"$(head -c 3000 "
                           "tests/data/tiny_corpus.txt)\"", s);
  CHECK(g.rc == 0);
  CHECK(g.err.find("note: the prompt is ") != std::string::npos);
  CHECK(g.err.find("(model.block_size)") != std::string::npos);
}

TEST_CASE("outputs and plans: a path ending in '/', --calibrate of a missing path, a layout the cluster cannot hold",
          "[cli][hostile]") {
  Scratch s(kGroup, "outputs");
  expect_user_error(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet --trace '" + s.path("new") + "/'", s),
                    {"ends with '/', so it names a folder"});
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("none") + "'", s),
                    {"none does not exist", "pass the run directory"});
  expect_user_error(run_troupe("plan --config configs/gpt2-124m.toml --set cluster.gpu=h100-sxm --set cluster.gpus_per_node=3 "
                               "--set parallel.tp=2", s),
                    {"= 1 x 3 = 3", "cluster.nodes = 2 with parallel.dp = 3", "cluster.gpus_per_node = 2"});
  expect_user_error(run_troupe("plan --config configs/gpt2-124m.toml --set cluster.gpu=h100-sxm --set cluster.gpus_per_node=4 "
                               "--set parallel.tp=2", s),
                    {"set parallel.dp = 2"});
}

TEST_CASE("a launcher removes the folders of launchers killed before they could, in any pid namespace, not a live one's",
          "[launch][hostile]") {
  Scratch s(kGroup, "said");
  std::error_code ec;
  // a pid that runs nowhere: above the kernel's pid_max
  long dead = 1;
  std::ifstream("/proc/sys/kernel/pid_max") >> dead;
  ++dead;
  char orphan[] = "/tmp/troupe-said-XXXXXX", foreign[] = "/tmp/troupe-said-XXXXXX", old[] = "/tmp/troupe-said-XXXXXX",
       live[] = "/tmp/troupe-said-XXXXXX";
  char users[] = "/tmp/troupe-said-XXXXXX";  // a folder of that name with a subfolder: not troupe's
  for (char* d : {orphan, foreign, old, live, users}) REQUIRE(::mkdtemp(d));
  fs::create_directories(std::string(users) + "/notes");
  std::ofstream(std::string(orphan) + "/launcher") << dead << "\n" << troupe::pid_namespace_id() << "\n";
  std::ofstream(std::string(foreign) + "/launcher") << dead << "\n1\n";  // another pid namespace's launcher
  std::ofstream(std::string(old) + "/launcher") << dead << "\n";          // an older troupe's: no namespace recorded
  // a live launcher (of any namespace) holds its folder's lock (core/temp_folder.h)
  if (shell_status("command -v python3 > /dev/null 2>&1") != 0) {
    WARN("python3 is not installed: the live folder's part is skipped");
    fs::remove_all(live, ec);
  } else {
    REQUIRE(shell_status("python3 -c \"import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                         "fcntl.flock(fd, fcntl.LOCK_EX); open(sys.argv[2], 'w').close(); time.sleep(60)\" '" +
                         std::string(live) + "' '" + s.path("locked") + "' > /dev/null 2>&1 & echo $! > '" +
                         s.path("holder.pid") + "'; for i in $(seq 1 100); do [ -e '" + s.path("locked") +
                         "' ] && break; sleep 0.1; done") == 0);
  }
  const Run r = run_troupe("launch --nprocs 1 -- /bin/true", s);
  CHECK(r.rc == 0);
  CHECK_FALSE(fs::exists(orphan));
  CHECK_FALSE(fs::exists(foreign));
  CHECK_FALSE(fs::exists(old));
  CHECK(fs::exists(std::string(users) + "/notes"));
  fs::remove_all(users, ec);
  if (fs::exists(s.path("holder.pid"))) {
    CHECK(fs::exists(live));
    shell_status("kill $(cat '" + s.path("holder.pid") + "') 2> /dev/null");
    fs::remove_all(live, ec);
  }
}
