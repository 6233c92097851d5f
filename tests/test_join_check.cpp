// Join decisions (actors/join_check.h): what process 0 refuses when a process joins, as a
// pure function of the two join requests and process 0's config.
#include <catch2/catch.hpp>

#include "actors/join_check.h"
#include "job_helpers.h"

using namespace troupe;

namespace {
JoinRequest request(const Config& c, int process) {
  return JoinRequest{process, 2, "ab12cd34ef56ab78cd90", c.to_toml(), "", "tok1", "2e80b7acaf2bbcf0"};
}
}  // namespace

TEST_CASE("a join like process 0's is let in, with train.threads and data paths that may differ", "[join]") {
  const Config ours = test::tiny(2, 2);
  Config theirs = ours;
  theirs.train.threads = 5;
  theirs.data.cache_dir = "/elsewhere";
  CHECK(check_join(request(theirs, 1), request(ours, 0), ours).empty());
}

TEST_CASE("a join is refused naming the first difference and the fix", "[join]") {
  const Config ours = test::tiny(2, 2);
  const JoinRequest me = request(ours, 0);
  JoinRequest j = request(ours, 1);
  j.tokenizer_hash = "tok2";
  j.world = 3;  // the tokenizer is checked first
  CHECK(check_join(j, me, ours).find("process 1 prepared its data with tokenizer tok2 but process 0 with tok1") == 0);
  j.tokenizer_hash = "tok1";
  j.resume = "step-00000004";
  CHECK(check_join(j, me, ours) ==
        "process 1 continues from step-00000004 but process 0 from no snapshot (a fresh start); give every process "
        "the same --resume");
  j.resume = "";
  CHECK(check_join(j, me, ours).find("was started for 3 processes but the job has 2") != std::string::npos);
  j.world = 2;
  j.binary_hash = "ffffffffffffffffffff";
  CHECK(check_join(j, me, ours).find("runs a different troupe binary (sha256 ffffffffffffffff vs ab12cd34ef56ab78)") !=
        std::string::npos);
  j.binary_hash = me.binary_hash;
  j.config_toml = "[train\nsteps = ";
  CHECK(check_join(j, me, ours).find("process 1 sent a config that does not parse") == 0);
  Config other = ours;
  other.train.steps = 7;
  j.config_toml = other.to_toml();
  CHECK(check_join(j, me, ours) ==
        "process 1 has train.steps = 7 but process 0 has 3; start every process with the same config");
  // the same config over other bytes (trial 32, F0: each host's copy of the corpus differs)
  j.config_toml = ours.to_toml();
  j.data_key = "c7c8cd2acb72c3d8";
  CHECK(check_join(j, me, ours).find("process 1 prepared data c7c8cd2acb72c3d8 but process 0 prepared "
                                     "2e80b7acaf2bbcf0 from the same config: the sources' bytes differ") == 0);
  j.data_key = me.data_key;
  CHECK(check_join(j, me, ours).empty());
}
