// `troupe launch` as a user meets it (cli/launch.h): the children's environment, the exit
// status of the first failure, stragglers killed after --grace, signals forwarded, no
// orphans when the launcher is SIGKILLed, a lost process started again alone (--respawn
// process) or the whole job started again (--respawn job), and one "error:" line (exit 2)
// for bad input.
// Every launcher runs with a deadline and is SIGKILLed on failure (its children follow it
// through PR_SET_PDEATHSIG); the children are `sh` scripts that end by themselves.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_helpers.h"

extern char** environ;

namespace fs = std::filesystem;

namespace {

using troupe::test::slurp;
std::string launch_bin() { return troupe::test::troupe_bin(); }

double now_s() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void nap() { usleep(10 * 1000); }

struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("launch", name) {}
};

// A process that is gone: no /proc entry, or a zombie (reparented to an init that may not reap).
bool gone(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z';
}

// `troupe launch ARGS...` started as our child, stderr to a file; `env` entries (NAME=value)
// replace or add variables. SIGKILLed and reaped when it goes out of scope still running.
struct Launcher {
  pid_t pid = -1;
  std::string err_path;
  double t0 = 0;

  Launcher(const std::vector<std::string>& args, const Scratch& s, const std::vector<std::string>& env = {}) {
    err_path = s.path("launcher.err");
    std::vector<std::string> argv_s = {launch_bin(), "launch"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    auto overridden = [&](const std::string& kv) {
      const std::string name = kv.substr(0, kv.find('=') + 1);
      if (name == "TROUPE_JOB_SECRET=" || name.rfind("TROUPE_", 0) == 0) return true;  // a clean start
      for (auto& e : env)
        if (e.rfind(name, 0) == 0) return true;
      return false;
    };
    for (char** e = environ; *e; ++e)
      if (!overridden(*e)) env_s.push_back(*e);
    env_s.insert(env_s.end(), env.begin(), env.end());
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string out_path = s.path("launcher.out");
    t0 = now_s();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // async-signal-safe calls only: the test process may have threads
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err < 0 || out < 0) _exit(126);
      dup2(err, 2);
      dup2(out, 1);
      execve(argv[0], argv.data(), envp.data());
      _exit(126);
    }
  }
  ~Launcher() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // The launcher's exit status (128 + signal when killed), or -1 if it is still running after
  // timeout_s (then it is SIGKILLed, and its children with it).
  int wait(double timeout_s) {
    const double end = now_s() + timeout_s;
    while (pid > 0) {
      int st = 0;
      const pid_t p = ::waitpid(pid, &st, WNOHANG);
      if (p == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (now_s() > end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
        return -1;
      }
      nap();
    }
    return -1;
  }
  double elapsed() const { return now_s() - t0; }
  std::string err() const { return slurp(err_path); }
};

struct Result {
  int rc;
  std::string err;
};

Result launch(const std::vector<std::string>& args, const Scratch& s, const std::vector<std::string>& env = {},
              double timeout_s = 10) {
  Launcher l(args, s, env);
  const int rc = l.wait(timeout_s);
  return {rc, l.err()};
}

// Waits up to timeout_s for every file to exist.
bool wait_files(const std::vector<std::string>& paths, double timeout_s) {
  const double end = now_s() + timeout_s;
  for (;;) {
    bool all = true;
    for (auto& p : paths) all = all && fs::exists(p) && fs::file_size(p) > 0;
    if (all) return true;
    if (now_s() > end) return false;
    nap();
  }
}

// Pids written by the children as "$$" (their sh execs `sleep`, so the pid stays the same).
std::vector<pid_t> read_pids(const Scratch& s, int from, int to) {
  std::vector<pid_t> pids;
  for (int r = from; r < to; ++r) pids.push_back((pid_t)std::atoi(slurp(s.path("pid." + std::to_string(r))).c_str()));
  return pids;
}

// Makes sure no child of a failed test outlives it.
struct KillOnExit {
  std::vector<pid_t> pids;
  ~KillOnExit() {
    for (pid_t p : pids)
      if (p > 0 && !gone(p)) ::kill(p, SIGKILL);
  }
};

bool all_gone(const std::vector<pid_t>& pids, double timeout_s) {
  const double end = now_s() + timeout_s;
  for (;;) {
    bool ok = true;
    for (pid_t p : pids) ok = ok && gone(p);
    if (ok) return true;
    if (now_s() > end) return false;
    nap();
  }
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

struct ChildEnv {
  std::string rank, world, local, coordinator, secret;
};

// Each child writes its TROUPE_* variables to env.<rank>.
const char* kEnvScript =
    R"(echo "$TROUPE_RANK $TROUPE_WORLD_SIZE $TROUPE_LOCAL_RANK $TROUPE_COORDINATOR $TROUPE_JOB_SECRET" > "$1/env.$TROUPE_RANK")";

std::vector<ChildEnv> read_envs(const Scratch& s, int n) {
  std::vector<ChildEnv> v;
  for (int r = 0; r < n; ++r) {
    std::istringstream in(slurp(s.path("env." + std::to_string(r))));
    ChildEnv e;
    in >> e.rank >> e.world >> e.local >> e.coordinator >> e.secret;
    v.push_back(e);
  }
  return v;
}

// The start of a child script: it appends one line about this start to starts.<rank>, and
// defines `wait_for FILE` (waits up to about 8 s for FILE to exist, else exits 9).
const char* kRecordStart =
    R"(echo "pid=$$ restart=$TROUPE_RESTART_COUNT failure=$TROUPE_FAILURE_TIME respawn=$TROUPE_RESPAWN )"
    R"(coord=$TROUPE_COORDINATOR secret=$TROUPE_JOB_SECRET launch=$TROUPE_LAUNCH_ID" >> "$1/starts.$TROUPE_RANK"; )"
    R"(wait_for() { i=0; while [ ! -e "$1" ]; do i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.02; done; }; )";

// The starts of `rank` as recorded by kRecordStart, oldest first: NAME -> value per start.
std::vector<std::map<std::string, std::string>> read_starts(const Scratch& s, int rank) {
  std::vector<std::map<std::string, std::string>> starts;
  std::istringstream lines(slurp(s.path("starts." + std::to_string(rank))));
  for (std::string line; std::getline(lines, line);) {
    std::map<std::string, std::string> kv;
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      const auto eq = w.find('=');
      if (eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
    }
    starts.push_back(kv);
  }
  return starts;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("launch: every child gets its rank, the world size, the coordinator and one job secret", "[launch]") {
  Scratch s("env");
  // TROUPE_RANK in the launcher's environment must not leak through.
  Result r = launch({"--nprocs", "3", "--", "/bin/sh", "-c", kEnvScript, "sh", s.dir.string()}, s, {"TROUPE_RANK=7"});
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  // "launch: 3 processes, coordinator 127.0.0.1:PORT", the only line
  const std::string head = "launch: 3 processes, coordinator 127.0.0.1:";
  REQUIRE(r.err.rfind(head, 0) == 0);
  REQUIRE(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  const int port = std::atoi(r.err.c_str() + head.size());
  CHECK(port > 0);
  CHECK(port < 65536);
  // picked outside the kernel's ephemeral range, where the job's own data-plane listeners
  // and connections take their ports (a collision made process 0 unable to listen)
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  INFO("ephemeral range " << lo << "-" << hi << ", port " << port);
  if (lo > 20000 || hi < 65535) CHECK((port < lo || port > hi));
  auto envs = read_envs(s, 3);
  for (int k = 0; k < 3; ++k) {
    INFO("rank " << k);
    CHECK(envs[k].rank == std::to_string(k));
    CHECK(envs[k].world == "3");
    CHECK(envs[k].local == std::to_string(k));
    CHECK(envs[k].coordinator == "127.0.0.1:" + std::to_string(port));
    CHECK(is_hex64(envs[k].secret));
    CHECK(envs[k].secret == envs[0].secret);
  }

  // A second job gets another secret (random, not a constant).
  Scratch s2("env2");
  Result r2 = launch({"--nprocs", "1", "--", "/bin/sh", "-c", kEnvScript, "sh", s2.dir.string()}, s2);
  REQUIRE(r2.rc == 0);
  auto envs2 = read_envs(s2, 1);
  CHECK(is_hex64(envs2[0].secret));
  CHECK(envs2[0].secret != envs[0].secret);
}

TEST_CASE("launch: a preset TROUPE_JOB_SECRET and --coordinator are passed through", "[launch]") {
  Scratch s("preset");
  const std::string secret = "my-own-secret-from-openssl-rand";
  Result r = launch({"--coordinator", "127.0.0.7:29511", "--nprocs=2", "--", "/bin/sh", "-c", kEnvScript, "sh",
                     s.dir.string()},
                    s, {"TROUPE_JOB_SECRET=" + secret});
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("launch: 2 processes, coordinator 127.0.0.7:29511\n") == 0);
  for (auto& e : read_envs(s, 2)) {
    CHECK(e.coordinator == "127.0.0.7:29511");
    CHECK(e.secret == secret);
    CHECK(e.world == "2");
  }
}

TEST_CASE("launch: the launcher exits with the status of the first child that failed", "[launch]") {
  Scratch s("status");
  SECTION("an exit code") {
    Result r = launch({"--nprocs", "3", "--", "/bin/sh", "-c", R"(if [ "$TROUPE_RANK" = 1 ]; then exit 3; fi; exit 0)"},
                      s);
    INFO("stderr: " << r.err);
    CHECK(r.rc == 3);
    CHECK(r.err.find("launch: process 1 (pid ") != std::string::npos);
    CHECK(r.err.find(") exited with status 3\n") != std::string::npos);
    CHECK(r.err.find("launch: process 0") == std::string::npos);  // exits 0 are not reported
  }
  SECTION("the first failure wins over a later one") {
    Result r = launch({"--nprocs", "2", "--grace", "5", "--", "/bin/sh", "-c",
                       R"(if [ "$TROUPE_RANK" = 0 ]; then exit 5; fi; sleep 0.3; exit 4)"},
                      s);
    INFO("stderr: " << r.err);
    CHECK(r.rc == 5);
    CHECK(r.err.find("exited with status 5") != std::string::npos);
    CHECK(r.err.find("exited with status 4") != std::string::npos);  // rank 1 left within the grace period
    CHECK(r.err.find("after the grace period") == std::string::npos);
  }
  SECTION("a signal: 128 + its number") {
    // --respawn job: a signal is a failure (--respawn process would start the process again)
    Result r = launch({"--nprocs", "2", "--respawn", "job", "--", "/bin/sh", "-c", R"(if [ "$TROUPE_RANK" = 1 ]; then kill -KILL $$; fi; exit 0)"},
                      s);
    INFO("stderr: " << r.err);
    CHECK(r.rc == 137);
    CHECK(r.err.find("launch: process 1 (pid ") != std::string::npos);
    CHECK(r.err.find(") killed by signal SIGKILL\n") != std::string::npos);
  }
  SECTION("a command that does not exist: refused before anything starts (exit 2)") {
    Result r = launch({"--nprocs", "2", "--", "/nonexistent/troupe-launch-test", "x"}, s);
    INFO("stderr: " << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.rfind("error: cannot run '/nonexistent/troupe-launch-test': no such file; pass", 0) == 0);
    CHECK(r.err.find("launch: 2 processes") == std::string::npos);
  }
  SECTION("an executable file that exec still cannot run (a missing interpreter): 127") {
    const std::string script = (s.dir / "bad-interp.sh").string();
    std::ofstream(script) << "#!/nonexistent/troupe-interp\n";
    fs::permissions(script, fs::perms::owner_all);
    Result r = launch({"--nprocs", "2", "--", script}, s);
    INFO("stderr: " << r.err);
    CHECK(r.rc == 127);
    CHECK(r.err.find("launch: cannot run " + script + ": No such file or directory\n") != std::string::npos);
  }
}

TEST_CASE("launch: stragglers are SIGKILLed after the grace period", "[launch]") {
  Scratch s("grace");
  Launcher l({"--nprocs", "3", "--grace", "1", "--", "/bin/sh", "-c",
              R"(if [ "$TROUPE_RANK" = 0 ]; then exit 1; fi; echo $$ > "$1/pid.$TROUPE_RANK"; exec sleep 100)", "sh",
              s.dir.string()},
             s);
  KillOnExit guard;
  const bool started = wait_files({s.path("pid.1"), s.path("pid.2")}, 5);
  if (started) guard.pids = read_pids(s, 1, 3);
  const int rc = l.wait(6);
  const double took = l.elapsed();
  const std::string err = l.err();
  INFO("stderr: " << err << "took " << took << " s");
  REQUIRE(started);
  CHECK(rc == 1);
  CHECK(took >= 0.9);        // the grace period was given
  CHECK(took < 1.0 + 2.0);   // and not much more
  for (int k = 1; k <= 2; ++k) {
    const std::string line = "launch: killed process " + std::to_string(k) + " (pid " +
                             std::to_string(guard.pids[k - 1]) + ") after the grace period\n";
    CHECK(err.find(line) != std::string::npos);
  }
  CHECK(err.find("killed by signal") == std::string::npos);  // said once, as "after the grace period"
  CHECK(all_gone(guard.pids, 0));  // reaped by the launcher before it returned
}

TEST_CASE("launch: the grace period's SIGKILL reaches what a straggler started too", "[launch]") {
  Scratch s("gracetree");
  // rank 1 is a shell that started a background job of its own and waits: killing the shell
  // alone would leave the job running, reparented
  Launcher l({"--nprocs", "2", "--grace", "1", "--", "/bin/sh", "-c",
              R"(if [ "$TROUPE_RANK" = 0 ]; then exit 1; fi; sleep 100 & echo $! > "$1/pid.bg"; echo $$ > "$1/pid.1"; wait)",
              "sh", s.dir.string()},
             s);
  KillOnExit guard;
  const bool started = wait_files({s.path("pid.1"), s.path("pid.bg")}, 5);
  if (started) guard.pids = {read_pids(s, 1, 2)[0], (pid_t)std::atoi(slurp(s.path("pid.bg")).c_str())};
  const int rc = l.wait(6);
  INFO("stderr: " << l.err());
  REQUIRE(started);
  CHECK(rc == 1);
  CHECK(l.err().find("launch: killed process 1") != std::string::npos);
  CHECK(all_gone(guard.pids, 2));  // the shell and its background sleep
}

TEST_CASE("launch: SIGTERM, SIGINT and SIGUSR1 to the launcher reach every child", "[launch]") {
  for (const char* name : {"TERM", "INT", "USR1"}) {
    const int sig = std::string(name) == "TERM" ? SIGTERM : std::string(name) == "INT" ? SIGINT : SIGUSR1;
    Scratch s(std::string("sig") + name);
    // Each child notes the signal and exits 0; without it, it exits 9 after about 10 s.
    const std::string script = std::string("trap 'echo got > \"$1/got.$TROUPE_RANK\"; exit 0' ") + name +
                               R"(; echo ready > "$1/ready.$TROUPE_RANK"; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; exit 9)";
    Launcher l({"--nprocs", "2", "--", "/bin/sh", "-c", script, "sh", s.dir.string()}, s);
    REQUIRE(wait_files({s.path("ready.0"), s.path("ready.1")}, 5));
    REQUIRE(::kill(l.pid, sig) == 0);
    const int rc = l.wait(5);
    INFO("signal " << name << ", stderr: " << l.err());
    CHECK(rc == 0);
    CHECK(fs::exists(s.path("got.0")));
    CHECK(fs::exists(s.path("got.1")));
  }
}

TEST_CASE("launch: the children die with a SIGKILLed launcher (no orphans)", "[launch]") {
  Scratch s("orphans");
  Launcher l({"--nprocs", "3", "--", "/bin/sh", "-c", R"(echo $$ > "$1/pid.$TROUPE_RANK"; exec sleep 100)", "sh",
              s.dir.string()},
             s);
  KillOnExit guard;
  REQUIRE(wait_files({s.path("pid.0"), s.path("pid.1"), s.path("pid.2")}, 5));
  guard.pids = read_pids(s, 0, 3);
  for (pid_t p : guard.pids) REQUIRE(!gone(p));
  REQUIRE(::kill(l.pid, SIGKILL) == 0);
  CHECK(l.wait(5) == 137);
  CHECK(all_gone(guard.pids, 3));
}

TEST_CASE("launch: bad input gets one error line naming the fix, exit 2, and starts nothing", "[launch]") {
  Scratch s("bad");
  struct Case {
    std::vector<std::string> args;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {{}, "missing --nprocs"},
      {{"--", "true"}, "missing --nprocs"},
      {{"--nprocs"}, "--nprocs needs a value"},
      {{"--nprocs", "0", "--", "true"}, "--nprocs '0'"},
      {{"--nprocs", "-2", "--", "true"}, "--nprocs '-2'"},
      {{"--nprocs", "two", "--", "true"}, "--nprocs 'two'"},
      {{"--nprocs", "1025", "--", "true"}, "from 1 to 1024"},
      {{"--nprocs", "2", "true"}, "missing '--' before the command 'true'"},
      {{"--nprocs", "2"}, "missing '--'"},
      {{"--nprocs", "2", "--"}, "no command after '--'"},
      {{"--nprocs", "2", "--coordinator", "localhost", "--", "true"}, "HOST:PORT"},
      {{"--nprocs", "2", "--coordinator", ":29500", "--", "true"}, "HOST:PORT"},
      {{"--nprocs", "2", "--coordinator", "h:70000", "--", "true"}, "HOST:PORT"},
      {{"--nprocs", "2", "--coordinator", "h:port", "--", "true"}, "HOST:PORT"},
      {{"--nprocs", "2", "--bogus", "--", "true"}, "unknown option '--bogus'"},
      {{"--nprocs", "2", "--grace", "soon", "--", "true"}, "--grace 'soon'"},
      {{"--nprocs", "2", "--grace", "-1", "--", "true"}, "--grace '-1'"},
      {{"--nprocs", "2", "--respawn", "restart", "--", "true"}, "--respawn 'restart'"},
      {{"--nprocs", "2", "--respawn=", "--", "true"}, "--respawn ''"},
      {{"--nprocs", "2", "--respawn"}, "--respawn needs a value"},
  };
  for (const Case& c : cases) {
    std::string joined;
    for (auto& a : c.args) joined += " " + a;
    Result r = launch(c.args, s);
    INFO("troupe launch" << joined << "\nstderr: " << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(c.needle) != std::string::npos);
  }
}

TEST_CASE("launch: --respawn process starts only the killed process again, the others keep running", "[launch]") {
  Scratch s("respawn-kill");
  // Rank 1 is SIGKILLed on its first start; ranks 0 and 2 exit only once rank 1's second start
  // is recorded (again.1), so they are running when it dies and while it starts again. An
  // inherited TROUPE_RESPAWN must not leak through.
  const std::string script = std::string(kRecordStart) +
                             R"(if [ "$TROUPE_RANK" = 1 ]; then
                                  if [ "$TROUPE_RESTART_COUNT" = 0 ]; then kill -9 $$; fi
                                  echo again > "$1/again.1"; exit 0
                                fi
                                wait_for "$1/again.1"; exit 0)";
  const double t_before = (double)::time(nullptr);
  Result r = launch({"--nprocs", "3", "--", "/bin/sh", "-c", script, "sh", s.dir.string()}, s, {"TROUPE_RESPAWN=job"},
                    15);
  const double t_after = (double)::time(nullptr);
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  const auto s0 = read_starts(s, 0), s1 = read_starts(s, 1), s2 = read_starts(s, 2);
  REQUIRE(s0.size() == 1);
  REQUIRE(s1.size() == 2);
  REQUIRE(s2.size() == 1);
  for (const auto* starts : {&s0, &s1, &s2})
    for (auto& st : *starts) {
      CHECK(st.at("respawn") == "process");
      CHECK(st.at("coord") == s0[0].at("coord"));  // the same coordinator: no new port
      CHECK(st.at("secret") == s0[0].at("secret"));
      CHECK(st.at("launch") == s0[0].at("launch"));
    }
  CHECK(s0[0].at("restart") == "0");
  CHECK(s2[0].at("restart") == "0");
  CHECK(s0[0].at("failure").empty());
  CHECK(s1[0].at("restart") == "0");
  CHECK(s1[0].at("failure").empty());
  CHECK(s1[1].at("restart") == "1");
  const double failure = std::atof(s1[1].at("failure").c_str());
  CHECK(failure > 0);
  CHECK(failure >= t_before - 1);  // unix seconds of the death
  CHECK(failure <= t_after + 1);
  CHECK(s1[1].at("pid") != s1[0].at("pid"));
  // "launch: 3 processes, ..." and the respawn, nothing else
  CHECK(r.err.find("launch: process 1 (pid " + s1[0].at("pid") +
                   ") killed by signal SIGKILL; starting it again (respawn 1)\n") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 2);
}

TEST_CASE("launch: --respawn process starts a process that exits 75 again, counting respawns over all ranks",
          "[launch]") {
  Scratch s("respawn-75");
  // Rank 0 exits 75 at once; then rank 2 exits 75 (after rank 0's second start); rank 1 keeps
  // running until rank 2's second start.
  const std::string script = std::string(kRecordStart) +
                             R"(if [ "$TROUPE_RESTART_COUNT" != 0 ]; then echo again > "$1/again.$TROUPE_RANK"; exit 0; fi
                                case "$TROUPE_RANK" in
                                  0) exit 75 ;;
                                  2) wait_for "$1/again.0"; exit 75 ;;
                                  *) wait_for "$1/again.2"; exit 0 ;;
                                esac)";
  Result r = launch({"--nprocs", "3", "--", "/bin/sh", "-c", script, "sh", s.dir.string()}, s, {}, 15);
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  const auto s0 = read_starts(s, 0), s1 = read_starts(s, 1), s2 = read_starts(s, 2);
  REQUIRE(s0.size() == 2);
  REQUIRE(s1.size() == 1);
  REQUIRE(s2.size() == 2);
  CHECK(s0[1].at("restart") == "1");
  CHECK(s2[1].at("restart") == "2");
  CHECK(std::atof(s0[1].at("failure").c_str()) > 0);
  CHECK(std::atof(s2[1].at("failure").c_str()) >= std::atof(s0[1].at("failure").c_str()));
  CHECK(s1[0].at("restart") == "0");
  CHECK(r.err.find("launch: process 0 (pid " + s0[0].at("pid") +
                   ") exited with status 75; starting it again (respawn 1)\n") != std::string::npos);
  CHECK(r.err.find("launch: process 2 (pid " + s2[0].at("pid") +
                   ") exited with status 75; starting it again (respawn 2)\n") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 3);
}

TEST_CASE("launch: --respawn job starts every process again when one exits 75", "[launch]") {
  Scratch s("respawn-job");
  const std::string script =
      std::string(kRecordStart) + R"(if [ "$TROUPE_RANK" = 1 ] && [ "$TROUPE_RESTART_COUNT" = 0 ]; then exit 75; fi; exit 0)";
  Result r = launch({"--nprocs", "2", "--respawn", "job", "--grace", "5", "--", "/bin/sh", "-c", script, "sh",
                     s.dir.string()},
                    s, {}, 15);
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  for (int k = 0; k < 2; ++k) {
    INFO("rank " << k);
    const auto st = read_starts(s, k);
    REQUIRE(st.size() == 2);
    CHECK(st[0].at("restart") == "0");
    CHECK(st[1].at("restart") == "1");
    CHECK(std::atof(st[1].at("failure").c_str()) > 0);
    CHECK(st[0].at("respawn") == "job");
    CHECK(st[1].at("respawn") == "job");
    CHECK(st[1].at("launch") == st[0].at("launch"));
    CHECK(st[1].at("secret") == st[0].at("secret"));
  }
  CHECK(r.err.find("launch: process 1 (pid ") != std::string::npos);
  CHECK(r.err.find(") exited with status 75\n") != std::string::npos);
  CHECK(r.err.find("starting all processes again (restart 1)") != std::string::npos);
  CHECK(r.err.find("(restart 1)\n") != std::string::npos);  // "launch: 2 processes, coordinator ... (restart 1)"
  CHECK(r.err.find("respawn") == std::string::npos);
}

TEST_CASE("launch: --respawn process does not start again a failed process, a stopped job, or past 100 respawns",
          "[launch]") {
  Scratch s("respawn-fail");
  SECTION("exit 1 is a failure") {
    const std::string script = std::string(kRecordStart) + R"(if [ "$TROUPE_RANK" = 1 ]; then exit 1; fi; exit 0)";
    Result r = launch({"--nprocs", "3", "--grace", "5", "--", "/bin/sh", "-c", script, "sh", s.dir.string()}, s);
    INFO("stderr: " << r.err);
    CHECK(r.rc == 1);
    CHECK(read_starts(s, 1).size() == 1);
    CHECK(r.err.find(") exited with status 1\n") != std::string::npos);
    CHECK(r.err.find("again") == std::string::npos);
  }
  SECTION("a process killed by the SIGTERM the launcher forwarded") {
    // no trap: sleep dies of the forwarded SIGTERM
    const std::string script = std::string(kRecordStart) + R"(echo ready > "$1/ready.$TROUPE_RANK"; exec sleep 100)";
    Launcher l({"--nprocs", "2", "--grace", "5", "--", "/bin/sh", "-c", script, "sh", s.dir.string()}, s);
    REQUIRE(wait_files({s.path("ready.0"), s.path("ready.1")}, 5));
    REQUIRE(::kill(l.pid, SIGTERM) == 0);
    const int rc = l.wait(5);
    INFO("stderr: " << l.err());
    CHECK(rc == 128 + SIGTERM);
    CHECK(read_starts(s, 0).size() == 1);
    CHECK(read_starts(s, 1).size() == 1);
    CHECK(l.err().find("again") == std::string::npos);
  }
  SECTION("a loss after 100 respawns") {  // (no back-off: the 100 starts in a second)
    const std::string script = std::string(kRecordStart) + R"(kill -9 $$)";
    Result r = launch({"--nprocs", "1", "--respawn-backoff", "0", "--", "/bin/sh", "-c", script, "sh", s.dir.string()},
                      s, {}, 20);
    INFO("stderr: " << r.err.substr(r.err.size() > 2000 ? r.err.size() - 2000 : 0));
    CHECK(r.rc == 137);
    const auto st = read_starts(s, 0);
    REQUIRE(st.size() == 101);
    for (int k = 0; k <= 100; ++k) CHECK(st[k].at("restart") == std::to_string(k));
    CHECK(count_of(r.err, "; starting it again (respawn ") == 100);
    CHECK(r.err.find("(respawn 100)\n") != std::string::npos);
    // one line says the launcher gives up, with the last exit status
    CHECK(r.err.find("error: troupe launch gives up: process 0 (pid " + st[100].at("pid") +
                     ") was lost again (killed by signal SIGKILL, exit status 137) after 100 respawns, its limit") !=
          std::string::npos);
    CHECK(count_of(r.err, "error: ") == 1);
  }
}
