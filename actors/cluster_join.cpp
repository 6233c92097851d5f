// The join of a multi-process job (Cluster::join, actors/cluster.h): process 0 (the hub)
// listens, waits for every process and sends the process table; every other process reaches
// the hub under a watchdog, registers and gets the table. Then the data plane connects.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <caf/io/all.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "actors/cluster_impl.h"
#include "actors/coordinator_probe.h"
#include "actors/messages.h"
#include "actors/wire_types.h"
#include "checkpoint/snapshot.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/job_error.h"

namespace troupe {

using namespace cluster_detail;

namespace {

// What a stop signal `sig` during the join leaves, for its error line: nothing trained (a
// fresh start), the snapshot this start resumed from, or, when the processes join again to
// recover from a lost one (steps were trained), the newest snapshot on disk to continue from.
std::string stopped_while_joining(const Cluster::Impl& im, int sig) {
  const std::string head = fmt::format("stopped by signal {} ({})", sig, signal_name(sig));
  if (im.o.recovering) {
    const std::string during = fmt::format(
        "{} while the processes joined again to recover from a lost process (restart {} of at most {}): the job "
        "stopped during the recovery",
        head, im.o.generation, im.o.cfg.fault.max_restarts);
    // the newest snapshot now, not at this start: the writer of the steps before the loss may
    // have been finishing one; it is waited for (at most kWriterWaitS) before the disk is read
    int64_t step = im.o.disk_step;
    std::string dir = step > 0 ? im.o.checkpoint_dir + "/" + snapshot_name(step) : std::string();
    bool still_writing = false;
    if (!im.o.checkpoint_dir.empty()) {
      constexpr double kWriterWaitS = 10;
      const auto until = Clock::now() + secs(kWriterWaitS);
      while ((still_writing = partial_dirs_noted()) && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (const auto snaps = list_snapshots(im.o.checkpoint_dir); !snaps.empty() && snaps.back().first >= step)
        step = snaps.back().first, dir = snaps.back().second;
    }
    const std::string writing = still_writing ? " (a newer one was still being written; it may be incomplete)" : "";
    if (step > 0)
      return fmt::format("{}; the newest snapshot on disk is {} (step {}){}: continue with --resume latest", during,
                         dir, step, writing);
    if (!im.o.checkpoint_dir.empty())
      return fmt::format("{}; {} holds no snapshot, so the steps trained so far are lost (checkpoint.interval saves "
                         "them)",
                         during, im.o.checkpoint_dir);
    return during + "; continue from the newest snapshot process 0 wrote with --resume latest";
  }
  const std::string where = im.hub() ? std::string("while waiting for the other processes to join")
                                     : fmt::format("while joining the job at {}:{}", im.o.env.host, im.o.env.port);
  if (!im.o.resume.empty())
    return fmt::format("{} {}: this start trained nothing, and the snapshot it resumed from, {}, is unchanged: "
                       "continue with --resume latest",
                       head, where, im.o.resume);
  return head + " " + where + (im.hub() ? ": nothing was trained or saved" : ": nothing was trained");
}

// A process other than 0 stopped while joining, or past the join's deadline: its own error
// line now (once per job under troupe launch, core/job_error.h), exit 2. Nothing of a
// joining process needs cleaning up (process 0 owns the run's folders), and process 0,
// which sees the connection close, must not say it first in other words.
[[noreturn]] void end_joining(const Cluster::Impl& im, const std::string& sentence, int sig) {
  const std::string line =
      "error: " + (im.o.env.world > 1 ? fmt::format("[process {}] ", im.o.env.rank) : "") + sentence + "\n";
  if (sig != 0) note_stop_signal(sig);
  write_error_line(line);
  ::_exit(2);
}

// Past the join's deadline with nothing listening at TROUPE_COORDINATOR (`p`: the probe).
std::string nothing_answered(const Cluster::Impl& im, const Probe& p) {
  std::string why = p.detail;
  if (!why.empty()) why[0] = (char)std::tolower((unsigned char)why[0]);
  return fmt::format("nothing answered at {}:{} within fault.join_timeout_s = {} s ({}): start process 0 (troupe "
                     "launch does) or check TROUPE_COORDINATOR",
                     im.o.env.host, im.o.env.port, im.o.cfg.fault.join_timeout_s, why);
}

// The join's deadline (fault.join_timeout_s) and its stop signal, over every wait of it.
struct JoinWait {
  Cluster::Impl& im;
  Clock::time_point deadline;

  // A signal ends the wait for the others at once: process 0 throws UserError (its run's
  // folders are removed when nothing was trained), another process ends with its line.
  void check_stop() const {
    const int sig = im.o.stop_signal ? im.o.stop_signal->load() : 0;
    if (sig == 0) return;
    if (!im.hub()) end_joining(im, stopped_while_joining(im, sig), sig);
    throw UserError(stopped_while_joining(im, sig));
  }

  // Waits until pred() holds (under im.mu), a join is refused or the job fails; past the
  // deadline it throws Error naming what() did not happen.
  void until(const std::function<bool()>& pred, const std::function<std::string()>& what) const {
    std::unique_lock<std::mutex> lk(im.mu);
    auto done = [&] { return pred() || !im.refused.empty() || !im.failure.empty(); };
    bool ok = false;
    while (!(ok = im.cv.wait_until(lk, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)), done)) &&
           Clock::now() < deadline) {
      lk.unlock();
      check_stop();
      lk.lock();
    }
    if (!ok) {
      lk.unlock();
      const int bad = im.unauthenticated;
      throw Error(what() + " within fault.join_timeout_s = " + fmt::format("{}", im.o.cfg.fault.join_timeout_s) + " s" +
                  (bad ? fmt::format("; {} control message(s) failed authentication meanwhile: a process with another "
                                     "TROUPE_JOB_SECRET? Give every process the same secret",
                                     bad)
                       : std::string("; start every process (troupe launch does), check TROUPE_COORDINATOR, the "
                                     "network and that every process has the same TROUPE_JOB_SECRET")));
    }
    if (!im.refused.empty()) throw UserError(im.refused);
    if (!im.failure.empty()) throw Error(im.failure);
  }
};

// "1, 3": the processes whose flag in v is false.
std::string missing(const std::vector<bool>& v) {
  std::string s;
  for (int p = 0; p < (int)v.size(); ++p)
    if (!v[p]) s += (s.empty() ? "" : ", ") + std::to_string(p);
  return s;
}

bool all_set(const std::vector<bool>& v) {
  return std::all_of(v.begin(), v.end(), [](bool b) { return b; });
}

// Process 0: listens, waits for every process to join, sends each the process table (and,
// in an in-place recovery, the plan of where the state comes from), then connects the data
// plane and waits for every process to connect theirs.
void join_as_hub(Cluster::Impl& im, const JoinWait& w) {
  const int n = im.o.env.world;
  auto port = im.sys->middleman().publish(caf::actor_cast<caf::actor>(im.agent),  // untyped: joiners connect untyped
                                          (uint16_t)im.o.env.port, im.o.env.host.c_str(), true);
  TROUPE_USER_CHECK(port) << "cannot listen on " << im.o.env.host << ":" << im.o.env.port << " ("
                          << im.sys->render(port.error())
                          << "); choose a free port and a local address in TROUPE_COORDINATOR";
  w.until([&] { return all_set(im.joined); }, [&] { return "process(es) " + missing(im.joined) + " did not join"; });
  int bad = 0;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    bad = im.unauthenticated;
  }
  if (bad > 0)
    spdlog::warn("control plane: {} message(s) from processes without this job's secret were refused while the job "
                 "assembled",
                 bad);
  std::vector<std::vector<char>> table;
  std::vector<std::string> hosts;
  std::vector<int32_t> pids;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    table = im.addresses;
    hosts = im.hosts;
    pids = im.pids;
    if (im.o.recovering) im.plan = make_recovery_plan(im.offers, im.o.disk_step, im.process_of_rank);
  }
  for (int p = 1; p < n; ++p)
    caf::anon_send(im.agent, none_atom::value, (int32_t)p,
                   caf::make_message(table_atom::value, table, im.plan.source, im.plan.step, im.plan.provider, hosts,
                                     pids));
  std::vector<std::vector<uint8_t>> addrs;
  for (auto& a : table) addrs.emplace_back(a.begin(), a.end());
  im.transport->connect(addrs);
  w.until([&] { return all_set(im.ready); },
          [&] { return "process(es) " + missing(im.ready) + " did not connect their data plane"; });
}

// The sentence for a server at TROUPE_COORDINATOR that accepts but is no troupe coordinator.
std::string not_a_coordinator(const Cluster::Impl& im, const Probe& p) {
  return fmt::format("the server at TROUPE_COORDINATOR={}:{} is not a troupe coordinator ({}); "
                     "point TROUPE_COORDINATOR at process 0's address (troupe launch sets it)",
                     im.o.env.host, im.o.env.port, p.detail);
}

// "it sent this process's connection 21 byte(s) ... a second connection got no bytes": a
// server that greeted CAF's connection with fewer bytes than a BASP header (`own`: those
// bytes, counted by the kernel; CAF keeps them, waiting for the rest) and `p`: the probe.
// `still_s`: seconds since the last byte came; `over_s`: since the first. A trickle (bytes
// still coming) is said as such, not as silence.
std::string short_greeting(long long own, const Probe& p, double still_s, double over_s) {
  const std::string how = still_s >= 2.0 ? fmt::format("and then nothing for {:.0f} s", still_s)
                                         : fmt::format("over {:.0f} s, a few at a time", over_s);
  return fmt::format("it sent this process's connection {} byte(s) {}: fewer than a troupe greeting, which is at "
                     "least {} bytes sent at once; {}",
                     own, how, kBaspHeaderBytes,
                     p.result == ProbeResult::kForeign ? "a second connection was " + p.detail.substr(3)
                     : p.result == ProbeResult::kNoListener ? "a second connection was refused (" + p.detail + ")"
                                                            : std::string("a second connection got no bytes"));
}

// What CAF's own connection to the coordinator has received, watched while remote_actor()
// waits: a few bytes that stay fewer than a BASP header for kStillS are a foreign greeting
// (a coordinator's arrives whole, in one write).
struct GreetingWatch {
  static constexpr double kStillS = 3.0;
  long long bytes = -1;
  Clock::time_point since = Clock::now(), next_look = Clock::now();
  Clock::time_point first_byte{};  // when this connection's first bytes were seen
  // an earlier connection of this join was closed by the server before a whole greeting
  // (CAF: disconnect_during_handshake): a coordinator that was stopping, or another server
  bool closed_in_greeting = false;

  // What the probe `p` found, with what this join saw before when that says more.
  void add_history(Probe& p) const {
    if (!closed_in_greeting) return;
    if (p.result == ProbeResult::kSilent)
      p.detail = "it closed this process's first connection before a whole troupe greeting had arrived (CAF: "
                 "disconnect during handshake), and a later connection got no bytes";
    else if (p.result == ProbeResult::kNoListener)
      p.detail += "; earlier, a server there had closed this process's connection before a whole troupe greeting "
                  "arrived (a coordinator that was stopping, or a server of another kind)";
  }

  // True once the connection has held 1 .. header-1 bytes, unchanged, for kStillS.
  bool stuck_short(const Cluster::Impl& im) {
    const auto now = Clock::now();
    if (now < next_look) return false;
    next_look = now + std::chrono::milliseconds(250);
    const long long b = own_connection_bytes(im.o.env.host, (uint16_t)im.o.env.port);
    if (b != bytes) {
      if (b > 0 && bytes <= 0) first_byte = now;
      bytes = b;
      since = now;
    }
    return bytes > 0 && bytes < kBaspHeaderBytes && now - since >= std::chrono::duration<double>(kStillS);
  }
};

// How long a probe past the join's deadline waits for a connection and then for a greeting,
// seconds: a coordinator greets within milliseconds; the probe only words the error, so it
// adds little to fault.join_timeout_s (2 s made a 1 s deadline end after 3 s).
constexpr double kProbeWaitS = 1.0;

// The watchdog's sentence once the stop signal came, the deadline passed or the connection
// got a short foreign greeting ("" before).
std::string watchdog_sentence(Cluster::Impl& im, Clock::time_point deadline, int sig, GreetingWatch& g) {
  if (sig != 0) return stopped_while_joining(im, sig);
  const bool short_greeting_seen = g.stuck_short(im);
  if (!short_greeting_seen && Clock::now() <= deadline) return std::string();
  const auto seen = Clock::now();  // (before the probe's second)
  Probe p = probe_coordinator(im.o.env.host, (uint16_t)im.o.env.port, kProbeWaitS);
  if (g.bytes > 0 && g.bytes < kBaspHeaderBytes && p.result != ProbeResult::kCaf) {
    p.detail = short_greeting(g.bytes, p, std::chrono::duration<double>(seen - g.since).count(),
                              std::chrono::duration<double>(seen - g.first_byte).count());
    return not_a_coordinator(im, p);
  }
  if (Clock::now() <= deadline) return std::string();
  g.add_history(p);
  if (p.result == ProbeResult::kCaf)
    return fmt::format("the coordinator at {}:{} did not answer this process's connection within "
                       "fault.join_timeout_s = {} s; check that process 0 is running and not stopped",
                       im.o.env.host, im.o.env.port, im.o.cfg.fault.join_timeout_s);
  return p.result == ProbeResult::kNoListener ? nothing_answered(im, p) : not_a_coordinator(im, p);
}

// One remote_actor() to the hub. It has no handshake deadline (CAF 0.17,
// actor-framework#504): pointed at a server of another kind it never returns. A watchdog
// holds the join's deadline and the stop signal over it; past either, or once the
// connection holds a short foreign greeting (GreetingWatch), it says what answers there (a
// probe, made only then: probing a live coordinator's port disturbed CAF's broker) and
// ends the process with exit 2 (nothing of a joining process needs cleaning up; the
// blocked call cannot be cancelled, so the process cannot shut down normally).
caf::expected<caf::actor> connect_watched(Cluster::Impl& im, Clock::time_point deadline, GreetingWatch& greeting) {
  std::atomic<bool> returned{false};
  greeting.bytes = -1;
  std::thread watchdog([&] {
    while (!returned.load()) {
      const int sig = im.o.stop_signal ? im.o.stop_signal->load() : 0;
      const std::string sentence = watchdog_sentence(im, deadline, sig, greeting);
      if (!sentence.empty()) end_joining(im, sentence, sig);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto h = im.sys->middleman().remote_actor(im.o.env.host, (uint16_t)im.o.env.port);
  returned = true;
  watchdog.join();
  return h;
}

// A process other than 0: reaches the hub (it may not listen yet), trying again every
// 0.2 s until the deadline.
caf::actor reach_hub(Cluster::Impl& im, const JoinWait& w) {
  GreetingWatch greeting;  // over every attempt of this join
  for (;;) {
    auto h = connect_watched(im, w.deadline, greeting);
    if (h) return *h;
    const std::string last_error = im.sys->render(h.error());
    if (last_error.find("disconnect_during_handshake") != std::string::npos) greeting.closed_in_greeting = true;
    if (last_error.find("malformed_basp_message") != std::string::npos || Clock::now() > w.deadline) {
      // something answered with other bytes, or nothing answered in time: say what is there
      Probe p = probe_coordinator(im.o.env.host, (uint16_t)im.o.env.port, kProbeWaitS);
      // a server that greets each connection once (a one-shot listener) is silent to the probe
      // after CAF's own connection got its bytes: say what CAF saw
      if (p.result == ProbeResult::kSilent && last_error.find("malformed_basp_message") != std::string::npos)
        p.detail = "it answered this process's connection with bytes that are not a troupe greeting (CAF: malformed "
                   "BASP message), and a second connection got nothing";
      else
        greeting.add_history(p);
      if (p.result == ProbeResult::kForeign || p.result == ProbeResult::kSilent)
        throw UserError(not_a_coordinator(im, p));
      if (p.result == ProbeResult::kNoListener && Clock::now() > w.deadline) throw UserError(nothing_answered(im, p));
    }
    w.check_stop();
    if (Clock::now() > w.deadline)
      throw Error(fmt::format("cannot reach the coordinator at {}:{} within fault.join_timeout_s = {} s ({}); is "
                              "process 0 running, and is TROUPE_COORDINATOR right?",
                              im.o.env.host, im.o.env.port, im.o.cfg.fault.join_timeout_s, last_error));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// A process other than 0: reach the hub, register, get the table. A recovering process may
// first reach the coordinator of the failed start, still shutting down: it is told so (or
// its connection closes) and tries again. Then it connects its data plane and says so.
void join_as_member(Cluster::Impl& im, const JoinWait& w) {
  const int n = im.o.env.world;
  const int me = im.o.env.rank;
  for (;;) {
    const caf::actor hub = reach_hub(im, w);
    {
      std::lock_guard<std::mutex> lk(im.mu);
      im.busy = false;
      im.hub_gone = false;
    }
    caf::anon_send(im.agent, hub_atom::value, hub,
                   caf::make_message(join_atom::value, (int32_t)me, (int32_t)n, executable_hash(), im.o.cfg.to_toml(),
                                     im.addresses[me], hostname(), (int32_t)getpid(), im.o.resume, im.o.offer,
                                     im.o.tokenizer_hash, im.o.data_key));
    w.until([&] { return im.have_table || im.busy || im.hub_gone; },
            [&] { return std::string("the coordinator did not send the process table"); });
    if (im.have_table) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<std::vector<uint8_t>> addrs;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    for (auto& a : im.addresses) addrs.emplace_back(a.begin(), a.end());
  }
  im.transport->connect(addrs);
  caf::anon_send(im.agent, none_atom::value, (int32_t)0, caf::make_message(ready_atom::value));
}

}  // namespace

void Cluster::join() {
  auto& im = *impl_;
  const JoinWait w{im, Clock::now() + secs(im.o.cfg.fault.join_timeout_s)};
  spdlog::info("joining the job: {} processes, coordinator {}:{} (waiting up to fault.join_timeout_s = {} s)",
               im.o.env.world, im.o.env.host, im.o.env.port, im.o.cfg.fault.join_timeout_s);
  if (im.hub())
    join_as_hub(im, w);
  else
    join_as_member(im, w);
}

}  // namespace troupe
