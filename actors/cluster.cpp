// The control plane of a multi-process job (actors/cluster.h): the Cluster's own calls —
// start, the end of a job, aborts. The join (actors/cluster_join.cpp), the node agent
// (actors/node_agent.cpp), the join decisions (actors/join_check.cpp), the tensor proxy
// (actors/tensor_proxy.cpp) and the snapshot transfer (actors/snapshot_transfer.cpp) live
// beside it.
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
#include <mutex>
#include <thread>

#include "actors/cluster_impl.h"
#include "actors/messages.h"
#include "actors/wire_types.h"
#include "collectives/netif.h"
#include "collectives/wire.h"
#include "core/error.h"
#include "core/events.h"

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
std::mutex g_failure_logged_mu;
std::string g_failure_logged;
}  // namespace
double failure_noticed_at() { return g_failure_noticed.load(); }
std::string failure_logged() {
  std::lock_guard<std::mutex> lk(g_failure_logged_mu);
  return g_failure_logged;
}

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
  if (!quiet) {
    spdlog::error("{}", reason);
    std::lock_guard<std::mutex> lk(g_failure_logged_mu);
    g_failure_logged = reason;
  }
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
  // a peer's data unreachable while its control-plane connection stays open (UCX lost its
  // endpoint, the process lives): the job fails now and recovers, instead of a pipeline
  // step waiting for train.timeout_s
  to.on_peer_lost = [w = std::weak_ptr<Impl>(impl_)](int p, const std::string& why) {
    if (auto im = w.lock())
      im->fail(fmt::format("the data plane of process {} lost its connection to {} ({}) while their control-plane "
                           "connection stays open: that process may live, but no tensor reaches it",
                           im->o.env.rank, im->name_of(p), why));
  };
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
