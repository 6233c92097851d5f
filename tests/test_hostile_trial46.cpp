// Hostile inputs, issue 14's fixes after the forty-fifth trial's remaining findings: a
// checkpoint.dir with room for one snapshot but not for the two that keep_last = 1 needs at
// once started and then lost steps (M3).
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
