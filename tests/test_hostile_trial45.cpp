// Hostile inputs, issue 14's forty-fifth trial (a fresh reviewer's 198 cases, 11 failed, none
// high): a SIGCHLD inherited as ignored made plot call gnuplot missing (M1); launch with no
// getrandom ended in a check-failed line (M2); an empty TMPDIR was a path (L1).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial45";
}  // namespace

TEST_CASE("an inherited ignored SIGCHLD, no getrandom and an empty TMPDIR change nothing", "[cli][hostile]") {
  Scratch s(kGroup, "env");
  if (shell_status("command -v gnuplot > /dev/null 2>&1 && command -v perl > /dev/null 2>&1") == 0) {
    REQUIRE(run_troupe("train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=2 --run-dir '" +
                           s.path("run") + "'",
                       s).rc == 0);
    // (perl leaves SIGCHLD ignored across its exec, as some daemons and shells do)
    const Run r = run_troupe("plot '" + s.path("run") + "' --out '" + s.path("a.png") + "'", s, 60,
                             "perl -e '$SIG{CHLD}=\"IGNORE\"; exec @ARGV' -- env TMPDIR=");
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(fs::exists(s.path("a.png")));
    expect_user_error(run_troupe("plot '" + s.path("run") + "' --out '" + s.path("b.png") + "'", s, 60,
                                 "env TMPDIR='" + s.path("none") + "'"),
                      {"TMPDIR='", "' is not a usable folder for temporary files", "unset it (/tmp)"});
  } else {
    WARN("plot part skipped: gnuplot or perl is not installed (scripts/setup.sh installs gnuplot)");
  }
  if (!have_strace()) {
    WARN("getrandom part skipped: strace is not installed (scripts/setup.sh installs it)");
    return;
  }
  const Run l = run_troupe("launch --nprocs 2 --grace 2 -- /bin/true", s, 60,
                           "strace -f -qq -o /dev/null -e trace=getrandom -e inject=getrandom:error=ENOSYS");
  INFO(l.err);
  CHECK(l.rc == 0);  // the secret comes from /dev/urandom
  CHECK(l.err.find("check failed") == std::string::npos);
}
