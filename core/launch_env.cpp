#include "core/launch_env.h"
#include <cstring>
#include <string>
#include <cctype>
#include <algorithm>

#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace troupe {
namespace {
int parse_int(const char* name, const char* v, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  TROUPE_USER_CHECK(end != v && *end == '\0' && errno == 0 && x >= lo && x <= hi)
      << "environment variable " << name << "='" << v << "' must be an integer in [" << lo << ", " << hi
      << "]; fix or unset it";
  return (int)x;
}
}  // namespace

LaunchEnv read_launch_env(const std::function<const char*(const char*)>& get_in) {
  auto get = get_in ? get_in : [](const char* n) -> const char* { return std::getenv(n); };
  LaunchEnv e;
  struct Src {
    const char *name, *rank, *world, *local;
  };
  const Src srcs[] = {{"troupe", "TROUPE_RANK", "TROUPE_WORLD_SIZE", "TROUPE_LOCAL_RANK"},
                      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
                      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}};
  for (const Src& s : srcs) {
    const char* r = get(s.rank);
    const char* w = get(s.world);
    if (!r && !w) continue;
    TROUPE_USER_CHECK(r && w) << "environment: " << (r ? s.world : s.rank) << " is missing while "
                              << (r ? s.rank : s.world) << " is set; set both (or neither)";
    e.source = s.name;
    e.world = parse_int(s.world, w, 1, 1 << 20);
    e.rank = parse_int(s.rank, r, 0, e.world - 1);
    const char* l = get(s.local);
    e.local_rank = l ? parse_int(s.local, l, 0, e.world - 1) : 0;
    // a later launcher's variables that count more processes (a TROUPE_WORLD_SIZE=1 left
    // exported under srun -n 2: every task would train the whole job alone). A larger world
    // here is troupe launch run inside an allocation (srun -n 1 troupe launch --nprocs 4): fine.
    for (const Src* o = &s + 1; o != std::end(srcs); ++o) {
      const char* orank = get(o->rank);
      const char* oworld = get(o->world);
      if (!orank || !oworld) continue;
      char* end = nullptr;
      const long long ow = std::strtoll(oworld, &end, 10);
      if (end == oworld || *end != '\0' || ow <= e.world) continue;
      throw UserError(std::string("environment: ") + s.rank + "/" + s.world + " say rank " + std::to_string(e.rank) +
                      " of " + std::to_string(e.world) + " but " + o->rank + "/" + o->world + " say " + orank + " of " +
                      oworld + ": this process would train the job alone as one of a smaller world; unset " + s.rank +
                      " and " + s.world + " (left exported?) so that " + o->world + " counts, or set them for the "
                      "whole job");
    }
    break;
  }
  // troupe launch's own record of the rank it gave (a command that sets TROUPE_RANK over
  // it, `env TROUPE_RANK=0 troupe train`, makes two processes 0 that fight over the run)
  if (const char* lr = get("TROUPE_LAUNCH_RANK"); lr && e.source == "troupe") {
    const int launched = parse_int("TROUPE_LAUNCH_RANK", lr, 0, 1 << 20);
    TROUPE_USER_CHECK(launched == e.rank)
        << "environment: TROUPE_RANK=" << e.rank << " but troupe launch started this process as rank " << launched
        << " (TROUPE_LAUNCH_RANK): the command sets TROUPE_RANK over the launcher's, so two processes would be rank "
        << e.rank << "; remove TROUPE_RANK from the command after `troupe launch ... --`";
  }
  // a local rank without a launcher's rank and world (checked: a one-process run is local rank 0)
  if (e.source == "none")
    if (const char* l = get("TROUPE_LOCAL_RANK"); l && std::string(l) != "0") {
      parse_int("TROUPE_LOCAL_RANK", l, 0, 1 << 20);  // (not a number: said so first)
      TROUPE_USER_FAIL() << "environment variable TROUPE_LOCAL_RANK='" << l << "' is set without TROUPE_RANK and "
                         << "TROUPE_WORLD_SIZE, so this is a one-process run, whose only process is local rank 0: "
                         << "unset TROUPE_LOCAL_RANK (and TROUPE_LOCAL_WORLD_SIZE), or start the job with troupe "
                         << "launch, which sets them all";
    }
  if (const char* c = get("TROUPE_COORDINATOR")) {
    const std::string hp = c;
    // a host name or address: letters, digits, '.', '-', '_', ':' and IPv6's brackets (an
    // escape sequence in it reached the terminal through every log line)
    const bool plain = hp.size() <= 300 && std::all_of(hp.begin(), hp.end(), [](char ch) {
                         return std::isalnum((unsigned char)ch) || std::strchr(".-_:[]", ch) != nullptr;
                       });
    TROUPE_USER_CHECK(plain) << "environment variable TROUPE_COORDINATOR holds characters a host:port cannot have; set "
                             << "it to process 0's address and a port, e.g. 10.0.0.1:29500 (troupe launch sets it)";
    const auto colon = hp.rfind(':');
    TROUPE_USER_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < hp.size())
        << "environment variable TROUPE_COORDINATOR='" << hp << "' must be host:port, e.g. 10.0.0.1:29500";
    e.host = hp.substr(0, colon);
    refuse_ipv6_host(e.host, "environment variable TROUPE_COORDINATOR='" + hp + "'");
    e.port = parse_int("TROUPE_COORDINATOR (port)", hp.c_str() + colon + 1, 1, 65535);
  } else {
    TROUPE_USER_CHECK(e.world == 1) << "environment: a world of " << e.world << " processes (from " << e.source
                                    << ") needs TROUPE_COORDINATOR=host:port (where rank 0 listens)";
  }
  return e;
}

void refuse_ipv6_host(const std::string& host, const std::string& what) {
  TROUPE_USER_CHECK(host.find("://") == std::string::npos && host.find('/') == std::string::npos)
      << what << " holds a URL or a path (" << host << "...); it takes HOST:PORT, e.g. 127.0.0.1:29500";
  // one ':' is no IPv6 address (those have two or more): a second port, 127.0.0.1:5000 of "127.0.0.1:5000:6000"
  TROUPE_USER_CHECK(std::count(host.begin(), host.end(), ':') != 1 || host.find_first_of("[]") != std::string::npos)
      << what << " holds more than one ':' (HOST:PORT:PORT?); it takes one HOST:PORT, e.g. 127.0.0.1:29500";
  TROUPE_USER_CHECK(host.find_first_of(":[]") == std::string::npos)
      << what << " names an IPv6 address; troupe's coordinator and data plane use IPv4 only: use an "
      << "IPv4 address (e.g. 127.0.0.1) or a host name that resolves to one";
}

int launch_env_int(const char* name, int lo, int hi, int if_unset, const std::function<const char*(const char*)>& get) {
  const char* v = get ? get(name) : std::getenv(name);
  return v ? parse_int(name, v, lo, hi) : if_unset;
}

int launch_local_world_size(int world, const std::function<const char*(const char*)>& get) {
  const int local = launch_env_int("TROUPE_LOCAL_WORLD_SIZE", 1, 1 << 20, 1, get);
  TROUPE_USER_CHECK(local <= std::max(1, world))
      << "environment variable TROUPE_LOCAL_WORLD_SIZE='" << local << "' is more than the job's " << world
      << " process" << (world == 1 ? "" : "es") << " (TROUPE_WORLD_SIZE); it counts the processes on this host "
      << "(troupe launch sets it): fix or unset it";
  return local;
}

std::string launch_env_respawn() {
  const char* v = std::getenv("TROUPE_RESPAWN");
  if (!v) return "";
  const std::string s = v;
  TROUPE_USER_CHECK(s == "process" || s == "job")
      << "environment variable TROUPE_RESPAWN='" << s << "' must be process or job (troupe launch --respawn sets it); "
      << "fix or unset it";
  return s;
}

double launch_env_failure_time() {
  const char* v = std::getenv("TROUPE_FAILURE_TIME");
  if (!v) return 0;
  char* end = nullptr;
  errno = 0;
  const double t = std::strtod(v, &end);
  TROUPE_USER_CHECK(end != v && *end == '\0' && errno == 0 && t >= 0 && t < 1e12)
      << "environment variable TROUPE_FAILURE_TIME='" << v << "' must be unix seconds, a number >= 0 (troupe launch "
      << "sets it); fix or unset it";
  return t;
}

}  // namespace troupe
