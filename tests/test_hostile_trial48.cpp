// Hostile inputs, issue 14's forty-eighth trial (258 cases, 14 failed, 2 high): a user's file
// named like the next snapshot was replaced (H1); a stop signal after the last step promised
// a snapshot it never wrote (H2); U+00A0 paths, set-aside snapshots, a hand-renamed step-3, a
// swapped manifest, odd .tmp entries and one-character special tokens were misnamed.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial48";

}  // namespace

TEST_CASE("a file named like a snapshot, odd .tmp entries and set-aside snapshots are named", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "names");
  REQUIRE(run_troupe(tiny_train(s, "run", 3), s).rc == 0);
  const std::string ck = s.path("run/checkpoints");
  s.write("run/checkpoints/step-00000004", "a user's notes\n");
  expect_user_error(run_troupe(tiny_train(s, "run", 5, " --resume latest"), s),
                    {"holds step-00000004, a file, not a snapshot folder", "move it out"});
  CHECK(slurp(ck + "/step-00000004") == "a user's notes\n");
  fs::remove(ck + "/step-00000004");
  // a FIFO and a file of an unfinished snapshot's name: left, and named
  REQUIRE(shell_status("mkfifo '" + ck + "/step-00000005.tmp-99996'") == 0);
  s.write("run/checkpoints/step-00000008.tmp-99994", "x\n");
  const Run r = run_troupe(tiny_train(s, "run", 4, " --resume latest"), s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("left " + ck + "/step-00000005.tmp-99996 alone: a link or file named like an unfinished snapshot") !=
        std::string::npos);
  CHECK(fs::exists(ck + "/step-00000008.tmp-99994"));
  // a hand-renamed step-3 is step 3
  fs::rename(ck + "/step-00000003", ck + "/step-3");
  const Run h = run_troupe(tiny_train(s, "run", 5, " --resume '" + ck + "/step-3'"), s);
  INFO(h.err);
  CHECK(h.rc == 0);
  CHECK(h.err.find("not the step its name says") == std::string::npos);
  // only snapshots troupe set aside: --resume latest names the newest
  Scratch t(kGroup, "aside");
  fs::create_directories(t.path("ck"));
  fs::copy(ck + "/step-00000005", t.path("ck/step-00000005.superseded"), fs::copy_options::recursive);
  const Run a = run_troupe("train --config configs/tiny.toml --set train.steps=9 --set checkpoint.dir='" + t.path("ck") +
                               "' --run-dir '" + t.path("run") + "' --resume latest",
                           t);
  expect_user_error(a, {"only snapshots troupe set aside are there", "pass --resume "});
  CHECK(a.err.find("pass --resume " + t.path("ck/step-00000005.superseded")) != std::string::npos);
}

TEST_CASE("a manifest of another run with other settings is named as swapped, not as the settings", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "swap");
  REQUIRE(run_troupe(tiny_train(s, "a", 3), s).rc == 0);
  REQUIRE(run_troupe(tiny_train(s, "b", 3, " --set train.seed=7"), s).rc == 0);
  fs::copy_file(s.path("b/checkpoints/step-00000003/manifest.capnp"), s.path("a/checkpoints/step-00000003/manifest.capnp"),
                fs::copy_options::overwrite_existing);
  const Run r = run_troupe(tiny_train(s, "a", 5, " --resume '" + s.path("a/checkpoints/step-00000003") + "'"), s);
  expect_user_error(r, {"its manifest does not describe its files", "copied or swapped"});
  CHECK(r.err.find("resume with the same value") == std::string::npos);
}

TEST_CASE("blank-looking and padded paths and one-character special tokens are refused", "[cli][hostile][config]") {
  Scratch s(kGroup, "blank");
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir \"$(printf '\\302\\240')\"", s, 60),
                    {"--run-dir of troupe train is '\\u{00A0}', only blanks"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'checkpoint.dir=\" x \"'", s, 60),
                    {"checkpoint.dir = ' x ' starts or ends with a blank"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir 'runs/x '", s, 60),
                    {"which starts or ends with a blank"});
  for (const char* t : {".", "\\303\\251"})
    expect_user_error(run_troupe("prepare --config configs/tiny.toml --set \"data.special_tokens=\\\"$(printf '" +
                                     std::string(t) + "')\\\"\" --set data.cache_dir='" + s.path("c") + "'",
                                 s, 60),
                      {"is one character, so every one in the corpus's text would become that token"});
  CHECK_FALSE(fs::exists(s.path("c")));
}

// H2: SIGTERM while an earlier snapshot is still being written, after the last step
TEST_CASE("a stop signal after the last step saves that step", "[cli][hostile][signals]") {
  Scratch s(kGroup, "laststop");
  if (!have_strace()) {
    WARN("skipped: strace is not installed (scripts/setup.sh installs it)");
    return;
  }
  // each fsync takes 1 s: step 2's snapshot is still being written when step 3 ends
  const std::string cmd =
      "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && { strace -f -qq -o /dev/null -e trace=fsync,fdatasync -e "
      "inject=fsync,fdatasync:delay_enter=1000000 '" + troupe_bin() + "' " +
      tiny_train(s, "run", 3, " --set checkpoint.interval=2") + " > /dev/null 2> '" + s.path("err") + "' & p=$!; } ; "
      "for i in $(seq 1 600); do grep -qE 'step +3/3 \\| val loss' '" + s.path("err") + "' 2> /dev/null && break; sleep 0.1; done; "
      "kill -TERM $(pgrep -P $p) 2> /dev/null; wait $p; echo $? > '" + s.path("rc") + "'";
  REQUIRE(shell_status("timeout 300 sh -c \"$(cat <<'EOS'\n" + cmd + "\nEOS\n)\"") == 0);
  const std::string err = slurp(s.path("err"));
  INFO(err);
  CHECK(slurp(s.path("rc")) == "0\n");
  // acknowledged as "stopping after step 3 ... saving a snapshot": step 3 is saved, by
  // whichever path saw the signal first
  if (err.find("stopping after step 3") != std::string::npos)
    CHECK(fs::exists(s.path("run/checkpoints/step-00000003/manifest.capnp")));
  else
    WARN("the signal came after the run had ended its steps (no acknowledgement): nothing to check");
  if (err.find("every step is trained") == std::string::npos)
    WARN("the signal came before the last step's hand-off: the usual path saved it");
}

// Trial 49: invisible characters (U+FEFF, U+2028, a bidi override) and a blank part inside a
// path; a manifest that is a FIFO passed over without a word; .kept left out of the message
TEST_CASE("invisible path parts and a FIFO manifest are named", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "invisible");
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir \"$(printf '\\357\\273\\277')\"", s, 60),
                    {"--run-dir of troupe train is '\\u{FEFF}', only blanks"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir \"" + s.path("a") + "/$(printf '\\302\\240')/b\"",
                               s, 60),
                    {"with a part made only of blanks or invisible characters"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set \"checkpoint.dir=\\\"$(printf '\\342\\200\\256')\\\"\"",
                               s, 60),
                    {"holds only blanks or invisible characters"});
  CHECK_FALSE(fs::exists(s.path("a")));
  REQUIRE(run_troupe(tiny_train(s, "run", 3), s).rc == 0);
  const std::string ck = s.path("run/checkpoints");
  fs::remove(ck + "/step-00000003/manifest.capnp");
  REQUIRE(shell_status("mkfifo '" + ck + "/step-00000003/manifest.capnp'") == 0);
  const Run r = run_troupe(tiny_train(s, "run", 4, " --resume latest"), s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("step-00000003: its manifest.capnp is not a regular file") != std::string::npos);
  CHECK(fs::exists(ck + "/step-00000003.unreadable"));
  // only a .kept snapshot: named as set aside, not as missing its manifest
  Scratch t(kGroup, "keptonly");
  fs::create_directories(t.path("ck"));
  fs::copy(ck + "/step-00000002", t.path("ck/step-00000002.kept"), fs::copy_options::recursive);
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=9 --set checkpoint.dir='" + t.path("ck") +
                                   "' --run-dir '" + t.path("run") + "' --resume latest",
                               t),
                    {"only snapshots troupe set aside are there"});
}
