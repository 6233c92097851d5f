// Hostile inputs, issue 14's thirty-first trial (a fresh reviewer's 106 cases): a server
// that closed this process's connection mid-greeting was said to have answered nothing, or
// to have sent no bytes (H1, H2); retention that could not remove an old snapshot said
// nothing (H3); a umask without the owner's permissions made troupe create folders it could
// not use (H4); generate to a file under `ulimit -f` blamed its reader (H5); plan told the
// user to lower cluster.nodes = 1 (H6).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial31";

}  // namespace

TEST_CASE("a server that closes the connection mid-greeting is named so, whether it listens on or goes away",
          "[cli][hostile][launch]") {
  {
    Scratch s(kGroup, "bannerexit");  // an SSH banner, then the connection and the listener closed
    const std::string port = one_shot_server(s, "c.sendall(b'SSH-2.0-OpenSSH_9.6\\\\r\\\\n')\nc.close()\ns.close()");
    REQUIRE_FALSE(port.empty());
    const Run r = join_at(s, port, 4);
    expect_user_error(r, {"nothing answered", "connection refused",
                          "closed this process's connection before a whole troupe greeting arrived"});
  }
  {
    Scratch s(kGroup, "httpkeep");  // an HTTP 400 (28 bytes), the connection closed, the listener kept
    const std::string port =
        one_shot_server(s, "c.sendall(b'HTTP/1.1 400 Bad Request\\\\r\\\\n\\\\r\\\\n')\nc.close()\ntime.sleep(30)");
    REQUIRE_FALSE(port.empty());
    const Run r = join_at(s, port, 4);
    expect_user_error(r, {"is not a troupe coordinator", "closed this process's first connection before a whole troupe "
                                                         "greeting had arrived"});
    CHECK(r.err.find("a probe's connection got no bytes") == std::string::npos);
  }
}

TEST_CASE("retention that cannot remove an older snapshot names it once, and training goes on",
          "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "retention");
  const std::string train = "train --config configs/tiny.toml --set checkpoint.interval=1 --set checkpoint.keep_last=1 "
                            "--set train.sample_tokens=0 --set train.eval_interval=0 --run-dir '" + s.path("run") + "'";
  REQUIRE(run_troupe(train + " --set train.steps=2", s).rc == 0);
  const std::string old = s.path("run/checkpoints/step-00000002");
  REQUIRE(fs::exists(old));
  if (shell_status("chattr +i '" + old + "' 2> /dev/null") != 0) {
    SUCCEED("chattr +i is not supported on this filesystem: nothing to check");
    return;
  }
  const Run r = run_troupe(train + " --set train.steps=4 --resume latest", s);
  shell_status("chattr -i '" + old + "'");
  INFO(r.err);
  CHECK(r.rc == 0);
  const std::string warning = "could not remove the older snapshot " + old + " (Operation not permitted)";
  size_t n = 0;
  for (size_t at = r.err.find(warning); at != std::string::npos; at = r.err.find(warning, at + 1)) ++n;
  CHECK(n == 1);  // once, not at every later snapshot
  CHECK(r.err.find("removed older step-00000003") != std::string::npos);
  CHECK(fs::exists(s.path("run/checkpoints/step-00000004")));
}

TEST_CASE("a umask without the owner's permissions is refused before anything is created", "[cli][hostile]") {
  Scratch s(kGroup, "umask");
  if (!nobody_can_run()) {
    SUCCEED("no user nobody who can run the binary here: nothing to check");
    return;
  }
  fs::permissions(s.dir, fs::perms::all);
  for (const char* mask : {"777", "277"}) {
    INFO("umask " << mask);
    const Run r = run_troupe_as_nobody("train --config configs/tiny.toml --set train.steps=2 --set data.cache_dir='" +
                                           s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                                       s, 60, std::string("umask ") + mask + ";");
    expect_user_error(r, {"the umask (0", "umask 022"});
    CHECK_FALSE(fs::exists(s.path("cache")));
    CHECK_FALSE(fs::exists(s.path("run")));
  }
  // help, --version and commands that write no file still answer (trial 32, F4: generate and
  // plan were refused)
  auto as_nobody = [&](const std::string& args) {
    return shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && su nobody -s /bin/sh -c 'umask 777; \"" +
                        troupe_bin() + "\" " + args + "' > /dev/null 2>&1");
  };
  CHECK(as_nobody("--version") == 0);
  CHECK(as_nobody("plan --config configs/gpt2-124m.toml") == 0);
  CHECK(as_nobody("simulate --schedule 1f1b --stages 2 --microbatches 4 --quiet") == 0);
}

TEST_CASE("generate into a file under a small ulimit -f names the file-size limit", "[cli][hostile]") {
  Scratch s(kGroup, "fsize");
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 --set "
                     "train.sample_tokens=0 --set train.eval_interval=0 --run-dir '" + s.path("run") + "'",
                     s)
              .rc == 0);
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && (ulimit -f 1; '" + troupe_bin() +
                          "' generate '" + s.path("run/checkpoints/step-00000001") +
                          "' --tokens 3000 --prompt a > '" + s.path("out.txt") + "' 2> '" + s.path("err.txt") + "')";
  const int rc = shell_status(cmd);
  const Run r{rc, slurp(s.path("err.txt"))};
  expect_user_error(r, {"cannot write to standard output", "the file-size limit (ulimit -f) of ", " bytes stopped it"});
  CHECK(r.err.find("its reader closed it") == std::string::npos);
}

TEST_CASE("plan names the cluster key that is too large", "[cli][hostile][plan]") {
  Scratch s(kGroup, "plandevices");
  expect_user_error(
      run_troupe("plan --config configs/gpt2-124m.toml --set cluster.gpus_per_node=1000000000", s),
      {"1 x 1000000000", "lower cluster.gpus_per_node"});
  expect_user_error(run_troupe("plan --config configs/gpt2-124m.toml --set cluster.nodes=100000000", s),
                    {"lower cluster.nodes"});
}
