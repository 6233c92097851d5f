// core/launch_env.h: rank/world from troupe's, Slurm's or Open MPI's variables, with
// precedence and a named error for every malformed value (groundwork for issue 6).
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "core/error.h"
#include "core/launch_env.h"

using namespace troupe;

namespace {
LaunchEnv read(const std::map<std::string, std::string>& vars) {
  return read_launch_env([&](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}
}  // namespace

TEST_CASE("rank and world come from the launcher's environment", "[launch]") {
  auto none = read({});
  CHECK(none.world == 1);
  CHECK(none.source == "none");
  auto t = read({{"TROUPE_RANK", "3"}, {"TROUPE_WORLD_SIZE", "4"}, {"TROUPE_COORDINATOR", "node1:29500"}});
  CHECK(t.rank == 3);
  CHECK(t.world == 4);
  CHECK(t.host == "node1");
  CHECK(t.port == 29500);
  auto s = read({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"TROUPE_COORDINATOR", "h:1"}});
  CHECK(s.source == "slurm");
  CHECK(s.rank == 5);
  CHECK(s.local_rank == 1);
  auto o = read({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"TROUPE_COORDINATOR", "h:2"}});
  CHECK(o.source == "openmpi");
  // troupe's variables win over Slurm's, Slurm's over Open MPI's
  auto both = read({{"TROUPE_RANK", "0"}, {"TROUPE_WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},
                    {"TROUPE_COORDINATOR", "h:3"}});
  CHECK(both.source == "troupe");
  CHECK(both.rank == 0);
}

TEST_CASE("malformed launcher variables are refused by name", "[launch]") {
  CHECK_THROWS_WITH(read({{"TROUPE_RANK", "4"}, {"TROUPE_WORLD_SIZE", "4"}, {"TROUPE_COORDINATOR", "h:1"}}),
                    Catch::Contains("TROUPE_RANK"));
  CHECK_THROWS_WITH(read({{"TROUPE_RANK", "x"}, {"TROUPE_WORLD_SIZE", "4"}, {"TROUPE_COORDINATOR", "h:1"}}),
                    Catch::Contains("TROUPE_RANK='x'"));
  CHECK_THROWS_WITH(read({{"TROUPE_RANK", "0"}}), Catch::Contains("TROUPE_WORLD_SIZE is missing"));
  CHECK_THROWS_WITH(read({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}), Catch::Contains("TROUPE_COORDINATOR"));
  CHECK_THROWS_WITH(read({{"TROUPE_COORDINATOR", "nohostport"}}), Catch::Contains("host:port"));
  CHECK_THROWS_WITH(read({{"TROUPE_COORDINATOR", "h:70000"}}), Catch::Contains("port"));
  CHECK_THROWS_AS(read({{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"TROUPE_COORDINATOR", "h:1"}}),
                  UserError);
}
