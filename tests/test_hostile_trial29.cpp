// Hostile inputs, issue 14's twenty-ninth trial (a fresh reviewer's 241 cases): a path inside
// a folder this user may not enter was called missing (F1: corpus, snapshot, plot); an IPv6
// coordinator was quoted as a mis-split fragment (F2); a server that greets once was said to
// have sent nothing (F3); a --set key given twice took its last value silently (F4).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial29";
}  // namespace

TEST_CASE("a path behind a folder this user may not enter is named as such, not as missing", "[cli][hostile][paths]") {
  Scratch s(kGroup, "blocked");
  if (!nobody_can_run()) {
    SUCCEED("no user nobody who can run the binary here: nothing to check");
    return;
  }
  fs::create_directories(s.path("n/nodir/run/checkpoints/step-00000001"));
  fs::copy_file(std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt", s.path("n/nodir/c.txt"));
  s.write("n/nodir/run/metrics.jsonl", "{\"step\": 1}\n");
  fs::permissions(s.dir, fs::perms::all);
  fs::permissions(s.path("n"), fs::perms::all);
  fs::permissions(s.path("n/nodir"), fs::perms::owner_all);  // root's, 700
  const std::string blocked = "it may not enter the folder '" + s.path("n/nodir") + "'";
  expect_user_error(run_troupe_as_nobody("train --config configs/tiny.toml --set train.steps=1 --set data.corpus='" +
                                             s.path("n/nodir/c.txt") + "' --set data.cache_dir='" + s.path("n/cache") +
                                             "' --run-dir '" + s.path("n/run") + "'",
                                         s, 60),
                    {"cannot be reached by this user", blocked.c_str(), "chmod a+x"});
  expect_user_error(run_troupe_as_nobody("generate '" + s.path("n/nodir/run/checkpoints/step-00000001") + "' --tokens 1", s),
                    {"snapshot directory", blocked.c_str()});
  expect_user_error(run_troupe_as_nobody("plot '" + s.path("n/nodir/run") + "' --out '" + s.path("n/p.png") + "'", s),
                    {"metrics.jsonl' cannot be reached by this user", blocked.c_str()});
  CHECK_FALSE(fs::exists(s.path("n/run")));
}

TEST_CASE("an IPv6 coordinator is quoted whole", "[cli][hostile][launch]") {
  Scratch s(kGroup, "ipv6");
  const Run r = run_troupe("launch --nprocs 2 --coordinator '[::1' -- true", s);
  expect_user_error(r, {"--coordinator '[::1'", "names an IPv6 address"});
  CHECK(r.err.find("address [:;") == std::string::npos);
  expect_user_error(run_troupe("train --config configs/tiny.toml", s, 60,
                               "TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR='[::1]:29500'"),
                    {"TROUPE_COORDINATOR='[::1]:29500' names an IPv6 address"});
}

TEST_CASE("a server that greets one connection with other bytes is not said to have sent nothing",
          "[cli][hostile][launch]") {
  Scratch s(kGroup, "banner");
  // a one-shot server: it accepts one connection, answers it with an HTTP response, then
  // keeps listening without accepting (a second connection gets no bytes)
  const std::string port = one_shot_server(
      s, "c.sendall(b'HTTP/1.1 400 Bad Request\\\\r\\\\nContent-Length: 0\\\\r\\\\nConnection: close\\\\r\\\\n\\\\r\\\\n')\n"
         "time.sleep(40)");
  REQUIRE_FALSE(port.empty());
  const Run r = join_at(s, port, 5);
  expect_user_error(r, {"is not a troupe coordinator", "troupe greeting"});
  CHECK(r.err.find("sent nothing") == std::string::npos);
}

TEST_CASE("a --set key given twice takes the last value and says so", "[cli][hostile][config]") {
  Scratch s(kGroup, "twice");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=2 --set train.sample_tokens=0 --set "
                           "train.steps=3 --run-dir '" + s.path("r") + "'",
                           s);
  INFO("stderr: " << r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("note: --set train.steps is given more than once (--set train.steps=2, then --set train.steps=3): "
                   "the last one is used") != std::string::npos);
  CHECK(slurp(s.path("r/metrics.jsonl")).find("{\"step\":3,") != std::string::npos);
}

TEST_CASE("a job secret file other users can read is warned about", "[cli][hostile][launch]") {
  Scratch s(kGroup, "secretfile");
  s.write("secret", "0123456789abcdef0123456789abcdef\n");
  const std::string env = "TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=127.0.0.1:9 TROUPE_JOB_SECRET_FILE='" +
                          s.path("secret") + "'";
  const std::string args = "train --config configs/tiny.toml --set fault.join_timeout_s=1 --run-dir '" + s.path("r") + "'";
  fs::permissions(s.path("secret"), fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  Run r = run_troupe(args, s, 60, env);
  CHECK(r.rc == 2);  // nobody listens at port 9
  CHECK(r.err.find("can be read by other users (mode 604)") != std::string::npos);
  CHECK(r.err.find("chmod 600") != std::string::npos);
  fs::permissions(s.path("secret"), fs::perms::owner_read | fs::perms::owner_write);
  r = run_troupe(args, s, 60, env);
  INFO("stderr: " << r.err);
  CHECK(r.err.find("can be read by other users") == std::string::npos);
}
