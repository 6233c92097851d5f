// tests/cli_helpers.h — what the tests that run the `troupe` binary share: where the binary
// is, reading a file whole, a scratch folder per test, running troupe under a deadline and
// checking its one-line errors.
#pragma once
#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace troupe::test {

// The message of the UserError that f() throws, "" when it throws none (any other exception
// passes through).
template <class F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const troupe::UserError& e) {
    return e.what();
  }
  return "";
}

// The troupe binary: $TROUPE_BIN (ctest sets it), else build/troupe in the source tree.
inline std::string troupe_bin() {
  const char* b = std::getenv("TROUPE_BIN");
  return b ? b : std::string(TROUPE_SOURCE_DIR) + "/build/troupe";
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch folder /tmp/troupe-<group>-<name>-<pid>, removed at the end (kept when
// TROUPE_KEEP_SCRATCH is set, to look at a failure).
struct Scratch {
  std::filesystem::path dir;
  Scratch(const std::string& group, const std::string& name) {
    dir = std::filesystem::temp_directory_path() / ("troupe-" + group + "-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Scratch() {
    if (!std::getenv("TROUPE_KEEP_SCRATCH")) std::filesystem::remove_all(dir);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::string path(const std::string& f) const { return (dir / f).string(); }
  std::string write(const std::string& f, const std::string& text) const {
    std::ofstream(path(f), std::ios::binary) << text;
    return path(f);
  }
};

struct Run {
  int rc;
  std::string err;
};

// Runs troupe `args` from the source dir (so relative paths in configs resolve) under
// `timeout`, after the shell words in `prefix` (e.g. "env X=1"); stdout and stderr go to
// stdout.txt and stderr.txt in the scratch folder.
inline Run run_troupe(const std::string& args, const Scratch& s, int timeout_s = 120, const std::string& prefix = "") {
  std::string err = s.path("stderr.txt");
  std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && " + prefix + " timeout " +
                    std::to_string(timeout_s) + " '" + troupe_bin() + "' " + args + " > '" + s.path("stdout.txt") +
                    "' 2> '" + err + "'";
  int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(err)};
}

// Whether the user nobody can run the troupe binary here (root runs the tests; a binary
// under a folder only root may enter cannot be run by nobody): tests of what another user
// sees skip, saying so, when it cannot.
inline bool nobody_can_run() {
  const std::string probe = "su nobody -s /bin/sh -c 'test -x \"" + troupe_bin() + "\"' > /dev/null 2>&1";
  return std::system(probe.c_str()) == 0;
}

// run_troupe as the user nobody (check nobody_can_run first), after the shell words in
// `prefix` (e.g. "TROUPE_CACHE_DIR=/x").
inline Run run_troupe_as_nobody(const std::string& args, const Scratch& s, int timeout_s = 120,
                                const std::string& prefix = "") {
  const std::string err = s.path("stderr.txt");
  std::filesystem::remove(err);
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && su nobody -s /bin/sh -c '" + prefix +
                          " timeout " + std::to_string(timeout_s) + " \"" + troupe_bin() + "\" " + args +
                          "' > /dev/null 2> '" + err + "'";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(err)};
}

// The arguments of a tiny run (configs/tiny.toml, a snapshot every step, no samples) of
// `steps` steps in run directory s.path(run), its data cache in s.path("cache"); `more`
// appended (" --resume latest").
inline std::string tiny_train(const Scratch& s, const std::string& run, int steps, const std::string& more = "") {
  return "train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=" + std::to_string(steps) +
         " --set checkpoint.interval=1 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path(run) + "'" +
         more;
}

// Exit 2 and exactly one "error:" line, containing every `needle`.
inline void expect_user_error(const Run& r, std::initializer_list<const char*> needles) {
  INFO("stderr: " << r.err);
  CHECK(r.rc == 2);
  size_t n = 0;
  std::string line;
  std::istringstream is(r.err);
  for (std::string l; std::getline(is, l);)
    if (l.rfind("error: ", 0) == 0) ++n, line = l;
  CHECK(n == 1);
  for (auto* needle : needles) CHECK(line.find(needle) != std::string::npos);
}

// The exit status of `command` run by the shell (-1 when it did not exit normally).
inline int shell_status(const std::string& command) {
  const int st = std::system(command.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Whether strace is installed (scripts/setup.sh installs it): the tests that inject failing
// system calls (strace -e inject=) skip, saying why, without it.
inline bool have_strace() { return shell_status("command -v strace > /dev/null 2>&1") == 0; }

// The lines of `err` that start with "error: ".
inline std::vector<std::string> error_lines(const std::string& err) {
  std::vector<std::string> out;
  std::istringstream is(err);
  for (std::string l; std::getline(is, l);)
    if (l.rfind("error: ", 0) == 0) out.push_back(l);
  return out;
}

// Runs troupe `args` (e.g. "launch ...") in the background from the source dir, waits until
// its stderr matches the grep -E pattern `ready`, runs `signal_cmd` ($p: troupe's pid), and
// returns the exit status and stderr (<scratch>/err). A watchdog ends troupe after 150 s.
// (The previous call's stderr goes first: its "ready" line would otherwise be found before
// the redirection empties the file.)
inline Run run_and_signal(const Scratch& s, const std::string& args, const std::string& ready,
                          const std::string& signal_cmd) {
  const std::string err = s.path("err"), rc = s.path("rc");
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && rm -f '" + rc + "' '" + err + "'; '" +
                          troupe_bin() + "' " + args + " 2> '" + err + "' > /dev/null & p=$!; (sleep 150; kill -KILL $p) " +
                          "> /dev/null 2>&1 & w=$!; for i in $(seq 1 1200); do grep -qE '" + ready + "' '" + err +
                          "' 2>/dev/null && break; sleep 0.1; done; " + signal_cmd + "; wait $p; echo $? > '" + rc +
                          "'; kill $w 2>/dev/null";
  shell_status(cmd);
  return {std::atoi(slurp(rc).c_str()), slurp(err)};
}

// A folder that passes for a prepared data cache (datasets/cache_folder.h is_prepared_cache):
// meta.json, tokenizer.model and corpus.train.bin/.idx, each holding "x".
inline void fake_cache(const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const char* f : {"meta.json", "tokenizer.model", "corpus.train.bin", "corpus.train.idx"})
    std::ofstream(dir + "/" + f) << "x";
}

// A shell script run in its own mount namespace over a small tmpfs at `mnt` (root only);
// false when this machine cannot do that (the caller skips, saying so).
inline bool run_on_tmpfs(const Scratch& s, const std::string& mnt, int mib, const std::string& body, std::string* why) {
  std::filesystem::create_directories(mnt);
  const std::string script = s.write("tmpfs.sh", "set -e\nmount -t tmpfs -o size=" + std::to_string(mib) + "m none '" +
                                                     mnt + "'\ncd '" + std::string(TROUPE_SOURCE_DIR) + "'\n" + body + "\n");
  const std::string probe = "unshare -m sh -c 'mount -t tmpfs -o size=1m none \"" + mnt + "\"' > '" +
                            s.path("probe.log") + "' 2>&1";
  if (std::system(probe.c_str()) != 0) {
    *why = slurp(s.path("probe.log"));
    return false;
  }
  std::system(("timeout -k 5 240 unshare -m sh '" + script + "' > '" + s.path("tmpfs.log") + "' 2>&1").c_str());
  return true;
}

// A TCP port of 127.0.0.1 for a hand-started job's TROUPE_COORDINATOR: below the kernel's
// ephemeral range (where the job's own data-plane listeners take their ports, see troupe
// launch) and free now; `salt` spreads tests that run side by side.
inline int quiet_port(int salt) {
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  const int span = lo > 20000 + 1000 ? lo - 20000 : 12000;
  const int first = (int)((::getpid() * 7919L + salt * 104729L) % span);
  for (int k = 0; k < span; ++k) {
    const int port = 20000 + (first + k) % span;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    const bool ok = ::bind(fd, (sockaddr*)&a, sizeof a) == 0;
    ::close(fd);
    if (ok) return port;
  }
  FAIL("no free port from 20000 up");
  return 0;
}

// A one-shot TCP server on 127.0.0.1 (python3, in the background): it accepts one
// connection and runs `after_accept` (python lines; c is the accepted socket, s the
// listener, time is imported). Returns its port ("" when it did not start); its pid is in
// server.pid of the scratch folder (kill_server).
inline std::string one_shot_server(const Scratch& s, const std::string& after_accept) {
  const std::string server = "python3 -c \"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen(8)\n"
                             "open('" + s.path("port") + "','w').write(str(s.getsockname()[1]))\nc,_=s.accept()\n" +
                             after_accept + "\" > /dev/null 2>&1 & echo $! > '" + s.path("server.pid") + "'";
  REQUIRE(std::system(server.c_str()) == 0);
  for (int i = 0; i < 100 && slurp(s.path("port")).empty(); ++i) std::system("sleep 0.1");
  return slurp(s.path("port"));
}
inline void kill_server(const Scratch& s) {
  (void)std::system(("kill $(cat '" + s.path("server.pid") + "') 2> /dev/null").c_str());
}

// Process 1 of a two-process job, started by hand at a server on 127.0.0.1:port (a test's
// one_shot_server), with fault.join_timeout_s = join_timeout_s; the server is killed after.
inline Run join_at(const Scratch& s, const std::string& port, int join_timeout_s, int timeout_s = 60) {
  const Run r = run_troupe("train --config configs/tiny.toml --set fault.join_timeout_s=" + std::to_string(join_timeout_s) +
                               " --run-dir '" + s.path("r") + "'",
                           s, timeout_s,
                           "TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_JOB_SECRET=0123456789abcdef0123 "
                           "TROUPE_COORDINATOR=127.0.0.1:" + port);
  kill_server(s);
  return r;
}

}  // namespace troupe::test
