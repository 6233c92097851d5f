// Hostile inputs, issue 14's fixes after the forty-fifth trial's remaining findings: a
// checkpoint.dir with room for one snapshot but not for the two that keep_last = 1 needs at
// once started and then lost steps (M3); a draw killed in another pid namespace left its
// folder (M4); a deep --set value, a live run's directory and --trace beside --tensorboard
// were named unclearly (L2-L4).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/disk.h"
#include "cli_helpers.h"
#include "core/config.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial46";
constexpr uint64_t kMiB = 1 << 20;
}  // namespace

TEST_CASE("first_failing_save counts the kept snapshots, the one being written and the old ones", "[checkpoint]") {
  using troupe::first_failing_save;
  // keep_last = 1: two at once from the second save on
  CHECK(first_failing_save(15 * kMiB, 10 * kMiB, {}, 1, 6) == 2);
  CHECK(first_failing_save(20 * kMiB, 10 * kMiB, {}, 1, 6) == 0);
  CHECK(first_failing_save(15 * kMiB, 10 * kMiB, {}, 1, 1) == 0);  // one save: one snapshot
  // keep_last = 3 on room for 3: the fourth save has nowhere to go
  CHECK(first_failing_save(30 * kMiB, 10 * kMiB, {}, 3, 10) == 4);
  CHECK(first_failing_save(30 * kMiB, 10 * kMiB, {}, 3, 3) == 0);
  CHECK(first_failing_save(40 * kMiB, 10 * kMiB, {}, 3, 1000) == 0);
  // old snapshots (a resume): total counts them; the first save needs them all kept
  const std::vector<uint64_t> one{10 * kMiB};
  CHECK(first_failing_save(20 * kMiB, 10 * kMiB, one, 1, 100) == 0);  // 10 free + 10 old: the old goes after save 1
  CHECK(first_failing_save(19 * kMiB, 10 * kMiB, one, 1, 100) == 1);  // save 1 does not fit beside the old one
  const std::vector<uint64_t> three{10 * kMiB, 10 * kMiB, 10 * kMiB};
  CHECK(first_failing_save(40 * kMiB, 10 * kMiB, three, 3, 100) == 0);  // steady: 3 kept + 1 written
  CHECK(first_failing_save(40 * kMiB, 10 * kMiB, three, 5, 100) == 2);  // keep 5: 1 new + 3 old + 1 written
  // larger old snapshots (another model's) are removed oldest first
  CHECK(first_failing_save(60 * kMiB, 10 * kMiB, {40 * kMiB, 5 * kMiB}, 2, 100) == 0);
  CHECK(first_failing_save(30 * kMiB, 10 * kMiB, {5 * kMiB, 40 * kMiB}, 2, 100) == 1);
}

TEST_CASE("snapshot_bytes is a little more than a snapshot takes", "[checkpoint][cli]") {
  Scratch s(kGroup, "snapbytes");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=1 --set "
                           "checkpoint.interval=1 --run-dir '" + s.path("run") + "'",
                           s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const troupe::Config c = troupe::Config::load(s.path("run/config.toml"));
  const uint64_t real = troupe::snapshot_folder_bytes(s.path("run/checkpoints/step-00000001"));
  const uint64_t est = troupe::snapshot_bytes(c);
  INFO(real << " bytes written, " << est << " estimated");
  CHECK(real > 8 * kMiB);
  CHECK(est >= real);
  CHECK(est <= real + real / 8);  // (the old per-parameter bound was 17 % over: refusals on disks that fit)
  CHECK(troupe::snapshot_folder_bytes(s.path("nothing")) == 0);
}

// M4: a draw killed inside another pid namespace (a container sharing /tmp) left its folder
// for good, as its pid cannot be checked from here. A draw locks its folder (flock) before it
// names it; a later draw removes any named folder whose lock is free, and keeps one in use.
TEST_CASE("a killed draw's folder from another pid namespace is removed, a live one stays", "[cli][hostile][figures]") {
  Scratch s(kGroup, "drawns");
  if (shell_status("command -v gnuplot > /dev/null 2>&1 && command -v python3 > /dev/null 2>&1") != 0) {
    WARN("skipped: gnuplot or python3 is not installed (scripts/setup.sh installs them)");
    return;
  }
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --run-dir '" +
                         s.path("run") + "'",
                     s).rc == 0);
  const std::string tmp = s.path("tmp");
  const std::string dead = tmp + "/troupe-gnuplot-4026599999-1-AAAAAA", live = tmp + "/troupe-gnuplot-4026599999-2-BBBBBB",
                    fresh = tmp + "/.troupe-gnuplot-4026599999-3-CCCCCC", old = tmp + "/.troupe-gnuplot-4026599999-4-DDDDDD";
  for (const auto& d : {dead, live, fresh, old}) fs::create_directories(d);
  // (a draw's own lock, held by another process: a live draw of another pid namespace)
  REQUIRE(shell_status("touch -d '1 hour ago' '" + dead + "' '" + live + "' '" + old + "' && python3 -c \"import fcntl, os, sys, "
                       "time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
                       "open(sys.argv[2], 'w').close(); time.sleep(60)\" '" + live + "' '" + s.path("locked") +
                       "' > /dev/null 2>&1 & echo $! > '" + s.path("holder.pid") + "'; for i in $(seq 1 100); do [ -e '" +
                       s.path("locked") + "' ] && break; sleep 0.1; done") == 0);
  REQUIRE(fs::exists(s.path("locked")));
  const Run r = run_troupe("plot '" + s.path("run") + "' --out '" + s.path("a.png") + "'", s, 60,
                           "env TMPDIR='" + tmp + "'");
  shell_status("kill $(cat '" + s.path("holder.pid") + "') 2> /dev/null");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK_FALSE(fs::exists(dead));
  CHECK(fs::exists(live));
  // not named yet: a draw between mkdtemp and its lock, unless a minute old
  CHECK(fs::exists(fresh));
  CHECK_FALSE(fs::exists(old));
  // once the holder is gone, the next draw removes it
  for (int i = 0; i < 50 && shell_status("kill -0 $(cat '" + s.path("holder.pid") + "') 2> /dev/null") == 0; ++i)
    shell_status("sleep 0.1");
  REQUIRE(run_troupe("plot '" + s.path("run") + "' --out '" + s.path("b.png") + "'", s, 60, "env TMPDIR='" + tmp + "'").rc == 0);
  CHECK_FALSE(fs::exists(live));
}

// L2: a too-deep --set value was reported "at line 1 ... fix the file" (there is no file)
TEST_CASE("a too-deep --set value names the option, not a file", "[cli][hostile][config]") {
  Scratch s(kGroup, "deepset");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=2 --set \"data.special_tokens=$(printf '%0.s[' $(seq 1 5000))\" --run-dir '" +
                               s.path("run") + "'",
                           s, 60);
  expect_user_error(r, {"--set data.special_tokens nests deeper than 64 levels (brackets or braces)",
                        "fix the value of --set data.special_tokens"});
  CHECK(r.err.find("fix the file") == std::string::npos);
  CHECK(r.err.find("at line") == std::string::npos);
  CHECK_FALSE(fs::exists(s.path("run")));
}

// L4: --trace and --tensorboard at one path said "--trace F lies inside F"
TEST_CASE("train's --trace and --tensorboard at one path, or one inside the other, are named", "[cli][hostile]") {
  Scratch s(kGroup, "tbtrace");
  const std::string train = "train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --run-dir '" +
                            s.path("run") + "' ";
  expect_user_error(run_troupe(train + "--trace '" + s.path("o.json") + "' --tensorboard '" + s.path("o.json") + "'", s, 60),
                    {"--trace and --tensorboard (train.tensorboard_dir) are the same path", "pass two paths"});
  const Run r = run_troupe(train + "--trace '" + s.path("tb/o.json") + "' --tensorboard '" + s.path("tb") + "'", s, 60);
  expect_user_error(r, {"lies inside the folder of --tensorboard", "event files"});
  CHECK(r.err.find("--trace " + s.path("tb/o.json")) != std::string::npos);
  CHECK_FALSE(fs::exists(s.path("run")));
  CHECK_FALSE(fs::exists(s.path("tb")));
}

// L3: --resume latest into a live run's directory whose checkpoint.dir is elsewhere said "no
// snapshot there ... (or start without --resume)"; after it ended, the same said nothing of
// where its snapshots are
TEST_CASE("resume latest into a live run's directory names the run and its checkpoint.dir", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "liveresume");
  const std::string base = "train --config configs/tiny.toml --set train.sample_tokens=0 --set data.cache_dir='" +
                           s.path("cache") + "' --run-dir '" + s.path("run") + "' ";
  REQUIRE(run_troupe("tokenize --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'", s).rc == 0);
  REQUIRE(shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && { '" + troupe_bin() + "' " + base +
                       "--set train.steps=100000 --set checkpoint.interval=5 --set checkpoint.dir='" + s.path("ck") +
                       "' > /dev/null 2>&1 & echo $! > '" + s.path("live.pid") + "'; } ; for i in $(seq 1 300); do [ -e '" +
                       s.path("ck") + "/step-00000005/manifest.capnp' ] && break; sleep 0.1; done") == 0);
  const Run r = run_troupe(base + "--set train.steps=3 --resume latest", s, 60);
  const Run fresh = run_troupe(base + "--set train.steps=3", s, 60);
  shell_status("kill -INT $(cat '" + s.path("live.pid") + "'); for i in $(seq 1 300); do kill -0 $(cat '" +
               s.path("live.pid") + "') 2> /dev/null || break; sleep 0.1; done");
  expect_user_error(r, {"run directory '", "is in use by another troupe run (process ",
                        "(then continue it with --resume latest --set checkpoint.dir=", "its snapshots are there"});
  CHECK(r.err.find(s.path("ck")) != std::string::npos);
  expect_user_error(fresh, {"is in use by another troupe run (process ", "wait for it to end, or pass another --run-dir"});
  // once it ended: where its snapshots are
  expect_user_error(run_troupe(base + "--set train.steps=100000 --resume latest", s, 60),
                    {"--resume latest looks in ", "saved its snapshots in its checkpoint.dir ", "add --set checkpoint.dir="});
  // with it, the snapshots are found (train.steps = 1: nothing left to train, said of the newest)
  expect_user_error(run_troupe(base + "--set train.steps=1 --resume latest --set checkpoint.dir='" + s.path("ck") + "'", s, 60),
                    {"nothing left to train"});
}

// Trial 45's remarks: text after a closed quote was told to "close the quotes" (RN5g); a
// program named gnuplot that is not one was "troupe's script failed: report it" (GN4)
TEST_CASE("text after a closed quote in --set, and a gnuplot that is not one, get advice that fits", "[cli][hostile]") {
  Scratch s(kGroup, "advice");
  const std::string train = "train --config configs/tiny.toml --set train.steps=2 --run-dir '" + s.path("run") + "' ";
  expect_user_error(run_troupe(train + "--set 'parallel.schedule=\"1f1b\" x'", s, 60),
                    {"text follows the closing quote: quote the whole value"});
  expect_user_error(run_troupe(train + "--set 'parallel.schedule=\"1f1b'", s, 60), {"(close the quotes;"});
  CHECK_FALSE(fs::exists(s.path("run")));
  REQUIRE(run_troupe(train + "--set train.sample_tokens=0", s).rc == 0);
  fs::create_directories(s.path("bin"));
  s.write("bin/gnuplot", "#!/bin/sh\necho 'not a plotter' >&2\nexit 1\n");
  fs::permissions(s.path("bin/gnuplot"), fs::perms::owner_all);
  expect_user_error(run_troupe("plot '" + s.path("run") + "' --out '" + s.path("a.png") + "'", s, 60,
                               "env PATH='" + s.path("bin") + ":/usr/bin:/bin'"),
                    {"(gnuplot: not a plotter)", "check that it is gnuplot 5 or later", "bin/gnuplot --version)"});
  CHECK_FALSE(fs::exists(s.path("a.png")));
}

// Trial 46: a snapshot whose folder fsync failed was called lost while it stayed complete
// and --resume latest took it (M2); a missing TROUPE_JOB_SECRET_FILE was "not a regular
// file" (L1); a data plane that cannot listen in a fresh process was retried four times as
// damaged UCX state, then exit 1 (L3); a damaged document-index header went unnoticed (L5).
TEST_CASE("an unsynced snapshot folder is a warning, not a loss, and a failed first UCX start is exit 2", "[cli][hostile]") {
  Scratch s(kGroup, "unsynced");
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it)");
    return;
  }
  const std::string ck = s.path("run/checkpoints");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --set "
                           "checkpoint.interval=1 --run-dir '" + s.path("run") + "'",
                           s, 120,
                           "strace -f -qq -o /dev/null -P '" + ck + "' -e trace=fsync -e inject=fsync:error=EIO:when=2");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("the snapshot of step 2 is complete in ") != std::string::npos);
  CHECK(r.err.find("could not be synced to disk (cannot fsync directory ") != std::string::npos);
  CHECK(r.err.find("in no snapshot") == std::string::npos);
  CHECK(fs::exists(ck + "/step-00000002/manifest.capnp"));
  // every listen() refused (EADDRINUSE): the first UCX start of each process fails, which a
  // new process would repeat: exit 2 at once, no run directory
  const Run l = run_troupe("launch --nprocs 2 -- '" + troupe_bin() + "' train --config configs/tiny.toml --set "
                           "train.sample_tokens=0 --set train.steps=2 --run-dir '" + s.path("ucx") + "'",
                           s, 120, "strace -f -qq -o /dev/null -e trace=listen -e inject=listen:error=EADDRINUSE");
  INFO(l.err);
  CHECK(l.rc == 2);
  CHECK(l.err.find("in a process where UCX had not run before, so starting it again would fail the same way") !=
        std::string::npos);
  CHECK(l.err.find("exits with status 75") == std::string::npos);
  CHECK_FALSE(fs::exists(s.path("ucx")));
}

TEST_CASE("a missing secret file and a damaged document-index header are named", "[cli][hostile]") {
  Scratch s(kGroup, "secretidx");
  const std::string hand = "env TROUPE_WORLD_SIZE=2 TROUPE_RANK=1 TROUPE_COORDINATOR=127.0.0.1:9 TROUPE_JOB_SECRET_FILE=";
  const std::string train = "train --config configs/tiny.toml --set train.steps=2 --run-dir '" + s.path("run") + "'";
  expect_user_error(run_troupe(train, s, 60, hand + "'" + s.path("none") + "'"),
                    {"TROUPE_JOB_SECRET_FILE=", "none does not exist; point it at the file"});
  expect_user_error(run_troupe(train, s, 60, hand + "'" + s.path("") + "'"), {"is not a regular file; point it at"});
  // a cache whose document index has bytes changed in its header
  REQUIRE(run_troupe("tokenize --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'", s).rc == 0);
  std::string key;
  for (const auto& e : fs::directory_iterator(s.path("cache"))) key = e.path().filename().string();
  REQUIRE_FALSE(key.empty());
  const std::string idx = s.path("cache/" + key + "/corpus.train.idx");
  REQUIRE(shell_status("printf '\\377\\377\\377\\377\\377\\377\\377\\377' | dd of='" + idx +
                       "' bs=1 seek=44 conv=notrunc 2> /dev/null") == 0);
  const std::string t = "train --config configs/tiny.toml --set train.steps=2 --set train.sample_tokens=0 --set "
                        "data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'";
  expect_user_error(run_troupe(t, s, 60), {"is damaged: document index", "has a damaged header", "delete that folder"});
  // its vocab_size changed (reserved bytes whole again): 512 -> 256
  REQUIRE(shell_status("printf '\\000\\001\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000' | dd of='" + idx +
                       "' bs=1 seek=40 conv=notrunc 2> /dev/null") == 0);
  expect_user_error(run_troupe(t, s, 60), {"corpus.train.idx records vocab_size 256, not the 512 of its tokenizer"});
  CHECK_FALSE(fs::exists(s.path("run")));
}
