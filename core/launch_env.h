// core/launch_env.h — a process's rank, world size and coordinator address, read from the
// launcher's environment (groundwork for issue 6, like torchrun's):
//   Slurm  (srun):   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; coordinator host from
//                    TROUPE_COORDINATOR (host:port) — Slurm does not name one;
//   Open MPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK;
//   troupe's own:    TROUPE_RANK, TROUPE_WORLD_SIZE, TROUPE_LOCAL_RANK, TROUPE_COORDINATOR.
// TROUPE_* wins over Slurm, which wins over Open MPI. No variables at all: a single process
// (rank 0 of 1). Errors: UserError naming the variable and the fix (non-numeric, out of
// range, rank >= world, a world > 1 without TROUPE_COORDINATOR, a malformed host:port).
#pragma once
#include <functional>
#include <string>

namespace troupe {

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string source = "none";   // which launcher the values came from: troupe | slurm | openmpi | none
  std::string host = "127.0.0.1"; // coordinator host (rank 0 listens there)
  int port = 0;
};

// `get` reads a variable (nullptr when unset); std::getenv by default.
LaunchEnv read_launch_env(const std::function<const char*(const char*)>& get = nullptr);

// Refuses (UserError) an IPv6 coordinator host ("[::1]", "::1", "fe80::1"): the
// coordinator and the data plane listen on IPv4 only; also a URL or a path given for the
// host ("http://10.0.0.1"). `what` names where it came from ("TROUPE_COORDINATOR", "--coordinator").
void refuse_ipv6_host(const std::string& host, const std::string& what);

// Variables troupe launch sets for its children, checked where read (a hand-started process
// may set them): each throws UserError naming the variable, its value and what it takes.
// TROUPE_RESTART_COUNT and the like: an integer in [lo, hi]; `if_unset` when absent.
// `get` reads a variable (nullptr when unset); std::getenv by default.
int launch_env_int(const char* name, int lo, int hi, int if_unset,
                   const std::function<const char*(const char*)>& get = nullptr);
// TROUPE_LOCAL_WORLD_SIZE (processes sharing this host's cores): an integer in [1, world],
// `world` the job's processes (TROUPE_WORLD_SIZE); 1 when absent. UserError otherwise.
int launch_local_world_size(int world, const std::function<const char*(const char*)>& get = nullptr);
// TROUPE_RESPAWN: "process" or "job"; "" when absent.
std::string launch_env_respawn();
// TROUPE_FAILURE_TIME: unix seconds, a finite number >= 0; 0 when absent.
double launch_env_failure_time();

}  // namespace troupe
