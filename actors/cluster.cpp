// The control plane of a multi-process job (actors/cluster.h): the Cluster's own calls —
// start, join, the end of a job, aborts. The node agent (actors/node_agent.cpp), the
// join decisions (actors/join_check.cpp), the tensor proxy (actors/tensor_proxy.cpp) and
// the snapshot transfer (actors/snapshot_transfer.cpp) live beside it.
#include "actors/cluster.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <caf/io/all.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "actors/cluster_impl.h"
#include "actors/coordinator_probe.h"
#include "actors/messages.h"
#include "actors/wire_types.h"
#include "collectives/netif.h"
#include "collectives/wire.h"
#include "core/error.h"
#include "core/events.h"
#include "core/job_error.h"

namespace troupe {


namespace cluster_detail {
const char* const kRecoveryResume = "the state agreed in an in-place recovery";

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

Clock::duration secs(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

std::vector<char> envelope_mac(const std::string& secret, int32_t from, int32_t to, uint64_t seq,
                               const std::vector<char>& body) {
  std::vector<uint8_t> data(16 + body.size());
  std::memcpy(data.data(), &from, 4);
  std::memcpy(data.data() + 4, &to, 4);
  std::memcpy(data.data() + 8, &seq, 8);
  if (!body.empty()) std::memcpy(data.data() + 16, body.data(), body.size());
  auto mac = hmac_sha256(secret, data.data(), data.size());
  return std::vector<char>(mac.begin(), mac.end());
}
}  // namespace cluster_detail

using namespace cluster_detail;

namespace {
std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}
}  // namespace

namespace {
std::atomic<double> g_failure_noticed{0};
}
double failure_noticed_at() { return g_failure_noticed.load(); }

std::string executable_hash() {
  static const std::string hash = [] {
    std::ifstream f("/proc/self/exe", std::ios::binary);
    TROUPE_CHECK(f.good()) << "cannot read /proc/self/exe to hash this executable";
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    std::vector<char> buf(1 << 20);
    while (f) {
      f.read(buf.data(), buf.size());
      if (f.gcount() > 0) EVP_DigestUpdate(ctx, buf.data(), (size_t)f.gcount());
    }
    uint8_t md[32];
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    return hex(md, len);
  }();  // the executable does not change while it runs: hashed once
  return hash;
}

void Cluster::Impl::fail(const std::string& reason, bool quiet) {
  caf::actor coord;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!failure.empty() || ended) return;
    failure = reason;
    coord = coordinator;
    cv.notify_all();
  }
  g_failure_noticed = unix_seconds();
  if (!quiet) spdlog::error("{}", reason);
  log_event("lost", {{"process", o.env.rank}, {"reason", reason}});
  if (transport) transport->abort(reason);
  if (coord) caf::anon_send(coord, fail_atom::value, -2, reason);  // -2: a lost process (no diagnosis)
}

Cluster::Cluster(caf::actor_system& sys, ClusterOptions o) : impl_(std::make_shared<Impl>()) {
  auto& im = *impl_;
  im.sys = &sys;
  im.o = std::move(o);
  const int n = im.o.env.world;
  TROUPE_USER_CHECK((int)im.o.placement.size() == n) << "placement over " << im.o.placement.size()
                                                     << " processes for a job of " << n;
  TROUPE_USER_CHECK(im.o.secret.size() >= 16)
      << "a job of several processes needs a job secret of at least 16 characters in TROUPE_JOB_SECRET (troupe launch "
         "sets one; under Slurm or mpirun: export TROUPE_JOB_SECRET=$(openssl rand -hex 32) on every node)";
  im.process_of_rank.assign(im.o.ranks, -1);
  for (int p = 0; p < n; ++p)
    for (int r : im.o.placement[p]) im.process_of_rank.at(r) = p;
  im.joined.assign(n, false);
  im.ready.assign(n, false);
  im.bye.assign(n, false);
  im.restored.assign(n, false);
  im.restored[im.o.env.rank] = true;
  im.offers.assign(n, {});
  im.offers[im.o.env.rank] = im.o.offer;
  if (im.o.recovering) im.o.resume = kRecoveryResume;
  im.addresses.assign(n, {});
  im.who.assign(n, "");
  im.who[im.o.env.rank] = fmt::format("process {} (host {}, pid {})", im.o.env.rank, hostname(), getpid());
  im.hosts.assign(n, "");
  im.pids.assign(n, 0);
  im.hosts[im.o.env.rank] = hostname();
  im.pids[im.o.env.rank] = (int32_t)getpid();
  TransportOptions to;
  to.process = im.o.env.rank;
  to.nprocs = n;
  to.secret = im.o.secret;
  to.limits.world = im.o.ranks;
  to.process_of_rank = im.process_of_rank;
  // the data plane listens only on the interface that reaches the coordinator (for a job on
  // 127.0.0.1: loopback), not on every interface of the host
  to.net_devices = interface_towards(im.o.env.host);
  im.transport = std::make_shared<UcxTransport>(to);
  auto addr = im.transport->address();
  im.addresses[im.o.env.rank] = std::vector<char>(addr.begin(), addr.end());
  im.joined[im.o.env.rank] = true;
  im.ready[im.o.env.rank] = true;
  im.agent = spawn_node_agent(impl_);
  deliver_arriving_tensors(impl_);
  deliver_arriving_snapshots(impl_);
}

Cluster::~Cluster() {
  auto& im = *impl_;
  for (auto& p : im.proxies) caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  if (im.agent) caf::anon_send_exit(im.agent, caf::exit_reason::user_shutdown);
  if (im.transport) im.transport->abort("the job ended");
}

int Cluster::process() const { return impl_->o.env.rank; }
int Cluster::nprocs() const { return impl_->o.env.world; }
bool Cluster::local(int r) const { return impl_->process_of_rank.at(r) == impl_->o.env.rank; }
int Cluster::process_of(int r) const { return impl_->process_of_rank.at(r); }
const std::shared_ptr<UcxTransport>& Cluster::transport() const { return impl_->transport; }

void Cluster::expose(RemoteRef ref, caf::actor a) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->exposed[{ref.kind, ref.index}] = std::move(a);
}
void Cluster::deliver_tensors_to(int r, caf::actor w) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->tensor_dst[r] = std::move(w);
}
void Cluster::set_coordinator(caf::actor c) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->coordinator = std::move(c);
}

void Cluster::join() {
  auto& im = *impl_;
  const int n = im.o.env.world;
  const auto deadline = Clock::now() + secs(im.o.cfg.fault.join_timeout_s);
  spdlog::info("joining the job: {} processes, coordinator {}:{} (waiting up to fault.join_timeout_s = {} s)", n,
               im.o.env.host, im.o.env.port, im.o.cfg.fault.join_timeout_s);
  // a signal ends the wait for the others at once: nothing has been trained yet
  auto check_stop = [&] {
    const int sig = im.o.stop_signal ? im.o.stop_signal->load() : 0;
    TROUPE_USER_CHECK(sig == 0) << "stopped by signal " << sig << " (" << strsignal(sig)
                                << ") while waiting for the other processes to join: nothing was trained or saved";
  };
  auto wait = [&](auto pred, const std::function<std::string()>& what) {
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
  };
  auto missing = [&](const std::vector<bool>& v) {
    std::string s;
    for (int p = 0; p < n; ++p)
      if (!v[p]) s += (s.empty() ? "" : ", ") + std::to_string(p);
    return s;
  };
  if (im.hub()) {
    auto port = im.sys->middleman().publish(caf::actor_cast<caf::actor>(im.agent),  // untyped: joiners connect untyped
                                            (uint16_t)im.o.env.port, im.o.env.host.c_str(), true);
    TROUPE_USER_CHECK(port) << "cannot listen on " << im.o.env.host << ":" << im.o.env.port << " ("
                            << im.sys->render(port.error())
                            << "); choose a free port and a local address in TROUPE_COORDINATOR";
    wait([&] { return std::all_of(im.joined.begin(), im.joined.end(), [](bool b) { return b; }); },
         [&] { return "process(es) " + missing(im.joined) + " did not join"; });
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
    wait([&] { return std::all_of(im.ready.begin(), im.ready.end(), [](bool b) { return b; }); },
         [&] { return "process(es) " + missing(im.ready) + " did not connect their data plane"; });
    return;
  }
  // a non-hub process: reach the hub (it may not listen yet), register, get the table. A
  // recovering process may first reach the coordinator of the failed start, still shutting
  // down: it is told so (or its connection closes) and tries again.
  const int me = im.o.env.rank;
  for (;;) {
    caf::actor hub;
    std::string last_error;
    while (!hub) {
      // remote_actor() has no handshake deadline (CAF 0.17, actor-framework#504): pointed at
      // a server of another kind it never returns. A watchdog holds the join's deadline and
      // the stop signal over it; past either it says what answers there (a probe, made only
      // then: probing a live coordinator's port disturbed CAF's broker) and ends the process
      // with exit 2 (nothing of a joining process needs cleaning up; the blocked call cannot
      // be cancelled, so the process cannot shut down normally).
      std::atomic<bool> returned{false};
      std::thread watchdog([&] {
        while (!returned.load()) {
          const int sig = im.o.stop_signal ? im.o.stop_signal->load() : 0;
          std::string sentence;
          if (sig != 0) {
            sentence = fmt::format("stopped by signal {} while joining the job at {}:{}; nothing was trained",
                                   sig, im.o.env.host, im.o.env.port);
          } else if (Clock::now() > deadline) {
            const Probe p = probe_coordinator(im.o.env.host, (uint16_t)im.o.env.port, 2.0);
            sentence = p.result == ProbeResult::kCaf
                           ? fmt::format("the coordinator at {}:{} did not answer this process's connection within "
                                         "fault.join_timeout_s = {} s; check that process 0 is running and not stopped",
                                         im.o.env.host, im.o.env.port, im.o.cfg.fault.join_timeout_s)
                           : fmt::format("the server at TROUPE_COORDINATOR={}:{} is not a troupe coordinator ({}); "
                                         "point TROUPE_COORDINATOR at process 0's address (troupe launch sets it)",
                                         im.o.env.host, im.o.env.port, p.detail);
          }
          if (!sentence.empty()) {
            const std::string line = "error: " + (im.o.env.world > 1 ? fmt::format("[process {}] ", im.o.env.rank) : "") +
                                     sentence + "\n";
            if (sig != 0) note_stop_signal(sig);
            write_error_line(line);  // once per job under troupe launch (core/job_error.h)
            ::_exit(2);
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      auto h = im.sys->middleman().remote_actor(im.o.env.host, (uint16_t)im.o.env.port);
      returned = true;
      watchdog.join();
      if (h) {
        hub = *h;
        break;
      }
      last_error = im.sys->render(h.error());
      if (last_error.find("malformed_basp_message") != std::string::npos || Clock::now() > deadline) {
        // something answered with other bytes, or nothing answered in time: say what is there
        const Probe p = probe_coordinator(im.o.env.host, (uint16_t)im.o.env.port, 2.0);
        if (p.result == ProbeResult::kForeign || p.result == ProbeResult::kSilent)
          throw UserError(fmt::format("the server at TROUPE_COORDINATOR={}:{} is not a troupe coordinator ({}); "
                                      "point TROUPE_COORDINATOR at process 0's address (troupe launch sets it)",
                                      im.o.env.host, im.o.env.port, p.detail));
      }
      check_stop();
      if (Clock::now() > deadline)
        throw Error(fmt::format("cannot reach the coordinator at {}:{} within fault.join_timeout_s = {} s ({}); is "
                                "process 0 running, and is TROUPE_COORDINATOR right?",
                                im.o.env.host, im.o.env.port, im.o.cfg.fault.join_timeout_s, last_error));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    {
      std::lock_guard<std::mutex> lk(im.mu);
      im.busy = false;
      im.hub_gone = false;
    }
    caf::anon_send(im.agent, hub_atom::value, hub,
                   caf::make_message(join_atom::value, (int32_t)me, (int32_t)n, executable_hash(), im.o.cfg.to_toml(),
                                     im.addresses[me], hostname(), (int32_t)getpid(), im.o.resume, im.o.offer,
                                     im.o.tokenizer_hash));
    wait([&] { return im.have_table || im.busy || im.hub_gone; },
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

RecoveryPlan Cluster::plan() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->plan;
}

void Cluster::restored() {
  auto& im = *impl_;
  if (!im.hub()) {
    caf::anon_send(im.agent, none_atom::value, (int32_t)0, caf::make_message(restored_atom::value));
    return;
  }
  const auto deadline = Clock::now() + secs(im.o.cfg.fault.join_timeout_s);
  std::unique_lock<std::mutex> lk(im.mu);
  auto all = [&] { return std::all_of(im.restored.begin(), im.restored.end(), [](bool b) { return b; }); };
  if (!im.cv.wait_until(lk, deadline, [&] { return all() || !im.failure.empty(); }))
    throw Error(fmt::format("not every process restored its state within fault.join_timeout_s = {} s",
                            im.o.cfg.fault.join_timeout_s));
  if (!im.failure.empty()) throw Error(im.failure);
}

caf::actor Cluster::control_proxy(int proc, RemoteRef ref) {
  auto agent = impl_->agent;
  auto p = impl_->sys->spawn([agent, proc, ref](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler([agent, proc, ref](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
      caf::anon_send(agent, out_atom::value, (int32_t)proc, ref.kind, ref.index, x.move_content_to_message());
      return caf::message{};
    });
    return {[](tick_atom, tick_atom) {}};  // everything else goes to the default handler
  });
  impl_->proxies.push_back(p);
  return p;
}

void Cluster::finish() {
  auto& im = *impl_;
  if (!im.hub()) return;
  im.transport->abort("the job ended");  // every worker has stopped: the data plane is done
  for (int p = 1; p < im.o.env.world; ++p)
    caf::anon_send(im.agent, none_atom::value, (int32_t)p, caf::make_message(end_atom::value));
  std::unique_lock<std::mutex> lk(im.mu);
  const bool all = im.cv.wait_for(lk, std::chrono::seconds(30), [&] {
    for (int p = 1; p < im.o.env.world; ++p)
      if (!im.bye[p]) return !im.failure.empty();
    return true;
  });
  if (!im.failure.empty()) throw Error(im.failure);
  if (!all) throw Error("not every process confirmed the end of the job within 30 s");
  im.ended = true;
}

void Cluster::wait_for_end() {
  auto& im = *impl_;
  {
    std::unique_lock<std::mutex> lk(im.mu);
    // no deadline of its own: the heartbeats turn a lost or hung peer into a failure
    im.cv.wait(lk, [&] { return im.ended || !im.failure.empty(); });
    if (!im.failure.empty() && !im.ended) throw Error(im.failure);
  }
  im.transport->abort("the job ended");  // process 0 has stopped every worker
}

int Cluster::forwarded_stop(int* from) const {
  if (from) *from = impl_->forwarded_stop_from.load();
  return impl_->forwarded_stop.load();
}

std::string Cluster::failure() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->failure;
}

void Cluster::leave() {
  auto& im = *impl_;
  if (im.hub()) return;
  caf::anon_send(im.agent, none_atom::value, (int32_t)0, caf::make_message(bye_atom::value));
  std::unique_lock<std::mutex> lk(im.mu);
  im.cv.wait_for(lk, std::chrono::seconds(10), [&] { return im.hub_gone; });
}

void Cluster::abort(const std::string& reason) {
  auto& im = *impl_;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    if (im.ended) return;
  }
  caf::anon_send(im.agent, abort_atom::value, reason);
  // give the agent a moment to put the abort on the wire before this process goes on to exit
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  im.fail(reason, /*quiet=*/true);
}

}  // namespace troupe
