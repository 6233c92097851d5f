// Hostile inputs, issue 14's forty-seventh trial (233 cases, 10 failed, 2 high): the clean-up
// of unfinished snapshots followed a symbolic link and deleted the snapshot it pointed at
// (H1); blank paths made folders named with spaces (M1); a moved document boundary, a plain
// word as a special token, an immutable output and a re-written step were not named (L1-L4).
#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <string>

#include "cli_helpers.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial47";

}  // namespace

TEST_CASE("an unfinished-snapshot name that is a symbolic link is never followed", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "tmplink");
  REQUIRE(run_troupe(tiny_train(s, "run", 3), s).rc == 0);
  const std::string ck = s.path("run/checkpoints");
  fs::copy(ck + "/step-00000002", s.path("outside"));
  fs::create_directory_symlink("step-00000002", ck + "/step-00000007.tmp-99997");
  fs::create_directory_symlink(s.path("outside"), ck + "/step-00000011.tmp-99998");
  REQUIRE(shell_status("touch -h -d '1 hour ago' '" + ck + "/step-00000007.tmp-99997' '" + ck +
                       "/step-00000011.tmp-99998'") == 0);
  const Run r = run_troupe(tiny_train(s, "run", 5) + " --resume latest", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(fs::exists(s.path("outside/manifest.capnp")));
  CHECK(fs::exists(s.path("outside/shard-dp0-pp0-tp0.bin")));
  CHECK(fs::exists(ck + "/step-00000004/manifest.capnp"));  // (retention keeps 3: steps 3-5)
  CHECK(fs::is_symlink(ck + "/step-00000011.tmp-99998"));
}

TEST_CASE("paths of blanks, a plain word as a special token and a moved document boundary are refused",
          "[cli][hostile][data]") {
  Scratch s(kGroup, "blanks");
  expect_user_error(run_troupe("train --config configs/tiny.toml --run-dir '   '", s, 60),
                    {"--run-dir of troupe train is '   ', only blanks"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'checkpoint.dir=\"   \"'", s, 60),
                    {"checkpoint.dir = '   ' holds only blanks"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'data.cache_dir=\"  \"'", s, 60),
                    {"data.cache_dir = '  ' holds only blanks"});
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --report '   '", s, 60),
                    {"--report of troupe prepare is '   ', only blanks"});
  for (const auto& e : fs::directory_iterator(TROUPE_SOURCE_DIR))
    CHECK(e.path().filename().string().find_first_not_of(' ') != std::string::npos);  // no folder of blanks made
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set 'data.special_tokens=\"a\"' --set "
                               "data.cache_dir='" + s.path("c2") + "'",
                               s, 60),
                    {"\"a\" is made only of letters, digits or '_'", "\"<|a|>\""});
  CHECK_FALSE(fs::exists(s.path("c2")));
  // the first document's end moved one token back: the token before it is no end-of-text
  REQUIRE(run_troupe("tokenize --config configs/tiny.toml --set data.cache_dir='" + s.path("cache") + "'", s).rc == 0);
  std::string key;
  for (const auto& e : fs::directory_iterator(s.path("cache"))) key = e.path().filename().string();
  REQUIRE_FALSE(key.empty());
  const std::string idx = s.path("cache/" + key + "/corpus.train.idx");
  REQUIRE(shell_status("python3 -c \"import struct, sys; b = bytearray(open(sys.argv[1], 'rb').read()); "
                       "o = struct.unpack_from('<Q', b, 72)[0]; struct.pack_into('<Q', b, 72, o - 1); "
                       "open(sys.argv[1], 'wb').write(b)\" '" + idx + "'") == 0);
  expect_user_error(run_troupe(tiny_train(s, "run", 1), s, 60),
                    {"is damaged: corpus.train.idx puts the end of document 1 at token ", "no end-of-text token"});
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("EPERM's advice names immutable files, and a re-written step sets the old one aside", "[cli][hostile][checkpoint]") {
  CHECK(std::string(troupe::path_error_fix(EPERM)).find("chattr -i") != std::string::npos);
  CHECK(std::string(troupe::path_error_fix(EACCES)).find("chattr") == std::string::npos);
  Scratch s(kGroup, "rewrite");
  REQUIRE(run_troupe(tiny_train(s, "run", 3), s).rc == 0);
  const std::string ck = s.path("run/checkpoints");
  // continue from step 2 another way (PP 1): its step 3 is another line's
  const Run r = run_troupe(tiny_train(s, "run", 3) + " --resume '" + ck + "/step-00000002' --set parallel.pp=1", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("snapshot " + ck + "/step-00000003 is of this run's step 3 or a later one") != std::string::npos);
  CHECK(fs::exists(ck + "/step-00000003.superseded/manifest.capnp"));
  CHECK(fs::exists(ck + "/step-00000003/manifest.capnp"));
}
