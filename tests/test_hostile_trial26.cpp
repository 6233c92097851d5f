// Hostile inputs, issue 14's twenty-sixth trial (a fresh reviewer's 133 cases): a data cache
// folder or checkpoint.dir that is a symbolic link to nothing was called "File exists" /
// "cannot be created or written" without naming the link (P09, P05); --set train.steps=02
// was "not an integer in 32-bit range" (T03); TROUPE_LOCAL_WORLD_SIZE above the job's
// TROUPE_WORLD_SIZE passed (H09); an export racing a run's keep_last deletion called the
// snapshot an interrupted save (CC01).
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "cli_helpers.h"
#include "core/error.h"
#include "core/paths.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial26";

std::string train_args(const Scratch& s) {
  return "train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 --run-dir '" + s.path("r") +
         "' ";
}
}  // namespace

TEST_CASE("a data cache folder or checkpoint.dir that is a link to nothing names the link", "[cli][hostile][paths]") {
  Scratch s(kGroup, "links");
  fs::create_symlink(s.path("nowhere"), s.path("dangling"));
  expect_user_error(run_troupe(train_args(s) + "--set data.cache_dir='" + s.path("dangling") + "'", s),
                    {"cannot create the data cache folder", "dangling' is a symbolic link to nothing", "nowhere",
                     "data.cache_dir"});
  // the link as a parent of the folder asked for
  expect_user_error(run_troupe(train_args(s) + "--set data.cache_dir='" + s.path("dangling/sub") + "'", s),
                    {"dangling' is a symbolic link to nothing"});
  expect_user_error(run_troupe(train_args(s) + "--set checkpoint.dir='" + s.path("dangling") + "'", s),
                    {"checkpoint.dir = '", "dangling' is a symbolic link to nothing", "set checkpoint.dir to another"});
  CHECK_FALSE(fs::exists(s.path("r")));
  CHECK_FALSE(fs::exists(s.path("nowhere")));
  // a loop of links is named as one
  fs::create_symlink(s.path("loop-b"), s.path("loop-a"));
  fs::create_symlink(s.path("loop-a"), s.path("loop-b"));
  expect_user_error(run_troupe(train_args(s) + "--set data.cache_dir='" + s.path("loop-a/x") + "'", s),
                    {"is a loop of symbolic links"});
}

TEST_CASE("broken_link_on finds the first link to nothing on a path", "[hostile][paths]") {
  Scratch s(kGroup, "brokenlink");
  CHECK(troupe::broken_link_on(s.path("a/b/c")).empty());
  CHECK(troupe::broken_link_on("").empty());
  fs::create_symlink(s.path("none"), s.path("a"));
  std::string want = "'";  // (piece by piece: GCC 12's -Wrestrict misfires on "'" + string)
  want += s.path("a");
  want += "' is a symbolic link to nothing";
  CHECK(troupe::broken_link_on(s.path("a/b/c")).find(want) == 0);
  CHECK(troupe::broken_link_on(s.path("a") + "//").find(want) == 0);
  fs::create_directories(s.path("none"));  // the link now leads somewhere
  CHECK(troupe::broken_link_on(s.path("a/b/c")).empty());
  CHECK(troupe::resolved_path(s.path("a/b/../c")) == fs::path(s.path("none/c")));
  // a loop of links resolves to itself, not to "" (which would lie inside every folder)
  fs::create_symlink(s.path("loop-b"), s.path("loop-a"));
  fs::create_symlink(s.path("loop-a"), s.path("loop-b"));
  CHECK(troupe::resolved_path(s.path("loop-a/./x")) == fs::path(s.path("loop-a/x")));
  CHECK(troupe::resolved_path("").empty());
}

TEST_CASE("an integer written with leading zeros names TOML's rule", "[cli][hostile][config]") {
  Scratch s(kGroup, "zeros");
  expect_user_error(run_troupe(train_args(s) + "--set train.steps=02", s),
                    {"train.steps", "without leading zeros", "got '02'"});
  expect_user_error(run_troupe(train_args(s) + "--set train.steps=-03", s), {"without leading zeros"});
  expect_user_error(run_troupe(train_args(s) + "--set train.seed=007", s), {"train.seed", "without leading zeros"});
  // a plain 0 is no leading zero
  expect_user_error(run_troupe(train_args(s) + "--set train.seq_len=0", s), {"train.seq_len = 0"});
  CHECK_FALSE(fs::exists(s.path("r")));
}

TEST_CASE("a weight decay of exactly 1 / lr says the factor is 0", "[cli][hostile][config]") {
  Scratch s(kGroup, "wd");
  expect_user_error(run_troupe(train_args(s) + "--set optim.lr=0.3 --set optim.weight_decay=3.3333333333333335", s),
                    {"1 - lr * weight_decay = 0 each step"});
}

TEST_CASE("a snapshot deleted by retention while export reads it is named as removed", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "race");
  // what keep_last leaves between deleting the manifest and the rest: shard files, no manifest
  fs::create_directories(s.path("step-4"));
  s.write("step-4/shard-0.bin", "bytes");
  std::thread remover([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    fs::remove_all(s.path("step-4"));
  });
  const Run r = run_troupe("export '" + s.path("step-4") + "' --format safetensors '" + s.path("out.st") + "'", s);
  remover.join();
  expect_user_error(r, {"was removed while it was being read", "keep_last"});
  CHECK_FALSE(fs::exists(s.path("out.st")));
  // one that stays without its manifest is still called incomplete
  fs::create_directories(s.path("step-5"));
  s.write("step-5/shard-0.bin", "bytes");
  expect_user_error(run_troupe("export '" + s.path("step-5") + "' --format safetensors '" + s.path("out.st") + "'", s),
                    {"has no manifest.capnp", "not a complete snapshot"});
}
