// Hostile inputs, issue 14's thirtieth trial (a fresh reviewer's 228 cases): a schedule file
// this user may not read, or one behind a folder it may not enter, was told to be written
// again (G1); plot under a small file-size limit blamed a full disk (G3); a one-shot server
// that greeted with fewer bytes than a BASP header was said to give no bytes (G2).
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial30";
}  // namespace

TEST_CASE("a schedule file this user may not read is named as such, not as one to write", "[cli][hostile][schedule]") {
  Scratch s(kGroup, "schedperm");
  if (!nobody_can_run()) {
    SUCCEED("no user nobody who can run the binary here: nothing to check");
    return;
  }
  fs::create_directories(s.path("d"));
  REQUIRE(run_troupe("simulate --schedule 1f1b --stages 2 --microbatches 2 --dump '" + s.path("d/s.txt") + "'", s).rc == 0);
  fs::permissions(s.dir, fs::perms::all);
  fs::permissions(s.path("d"), fs::perms::owner_all);  // root's, 700: nobody may not enter it
  expect_user_error(run_troupe_as_nobody("simulate --schedule '" + s.path("d/s.txt") + "' --quiet", s),
                    {"cannot be reached by this user", "chmod a+x"});
  fs::permissions(s.path("d"), fs::perms::all);
  fs::permissions(s.path("d/s.txt"), fs::perms::none);
  expect_user_error(run_troupe_as_nobody("simulate --schedule '" + s.path("d/s.txt") + "' --quiet", s),
                    {"cannot be read (Permission denied)", "chmod a+r"});
}

TEST_CASE("plot under a small file-size limit names ulimit -f, not a full disk", "[cli][hostile][plot]") {
  Scratch s(kGroup, "plotfsize");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 --run-dir '" +
                         s.path("run") + "'",
                     s)
              .rc == 0);
  // the limit is the shell's own (ulimit -f in 1024-byte blocks), inherited by troupe and gnuplot
  const Run r = run_troupe("plot '" + s.path("run") + "' --out '" + s.path("p.png") + "'", s, 60, "ulimit -f 2;");
  // (gnuplot's script, written first, may meet the limit before the picture does: either names it)
  expect_user_error(r, {"ulimit -f"});
  CHECK(r.err.find("disk fills") == std::string::npos);
  CHECK_FALSE(fs::exists(s.path("p.png")));
}

TEST_CASE("a one-shot server that greets with a short banner is named by the bytes this process got, early",
          "[cli][hostile][launch]") {
  Scratch s(kGroup, "shortbanner");
  // accepts one connection, sends an SSH banner (21 bytes, fewer than a BASP header), keeps
  // it open and listens on without accepting: CAF's connection waits for the rest
  const std::string port = one_shot_server(s, "c.sendall(b'SSH-2.0-OpenSSH_9.6\\\\r\\\\n')\ntime.sleep(60)");
  REQUIRE_FALSE(port.empty());
  const auto t0 = std::chrono::steady_clock::now();
  const Run r = join_at(s, port, 90, 120);
  expect_user_error(r, {"is not a troupe coordinator", "sent this process's connection 21 byte(s)",
                        "fewer than a troupe greeting"});
  // told once the banner has sat short for a few seconds, not at fault.join_timeout_s
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(45));
}
