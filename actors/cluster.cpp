// The control plane of a multi-process job (actors/cluster.h): node agents over CAF's
// middleman, an HMAC envelope around every control message, join checks, heartbeats.
#include "actors/cluster.h"
#include "collectives/netif.h"

#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>
#include <signal.h>
#include <unistd.h>

#include <caf/io/all.hpp>
#include <algorithm>
#include <cstring>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "actors/intruders.h"
#include "actors/messages.h"
#include "actors/wire_types.h"
#include "checkpoint/memory_store.h"
#include "collectives/wire.h"
#include "core/error.h"
#include "core/events.h"

namespace troupe {

using ctl_atom = caf::atom_constant<caf::atom("ctl")>;
using out_atom = caf::atom_constant<caf::atom("out")>;
using hub_atom = caf::atom_constant<caf::atom("hub")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using refuse_atom = caf::atom_constant<caf::atom("refuse")>;
using table_atom = caf::atom_constant<caf::atom("table")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using hb_atom = caf::atom_constant<caf::atom("hb")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using end_atom = caf::atom_constant<caf::atom("end")>;
using bye_atom = caf::atom_constant<caf::atom("bye")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using none_atom = caf::atom_constant<caf::atom("none")>;
using restored_atom = caf::atom_constant<caf::atom("restored")>;
using busy_atom = caf::atom_constant<caf::atom("busy")>;
using badsecret_atom = caf::atom_constant<caf::atom("badsecret")>;
using drop_atom = caf::atom_constant<caf::atom("drop")>;

namespace {
using Clock = std::chrono::steady_clock;
constexpr int32_t kAgentKind = -1;  // envelope target: the receiving agent itself
// The `resume` of every process in an in-place recovery: the state is agreed at join.
const char* const kRecoveryResume = "the state agreed in an in-place recovery";

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

Clock::duration secs(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

// The MAC of one envelope: HMAC-SHA256 over (from, to, seq, body) under the job secret.
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
}  // namespace

namespace {
std::atomic<double> g_failure_noticed{0};
}
double failure_noticed_at() { return g_failure_noticed.load(); }

// Process 0's choice of the state an in-place recovery continues from: the newest memory
// snapshot whose shards the processes hold between them for every rank (each rank from its
// own process when it holds it, else from the lowest process holding a copy), unless the
// disk holds a newer one; then the disk's newest; else a fresh start.
RecoveryPlan make_recovery_plan(const std::vector<std::vector<int64_t>>& offers, int64_t disk_step,
                                const std::vector<int>& process_of_rank) {
  std::map<int64_t, std::map<int, std::vector<int>>> have;  // step -> rank -> holders (ascending)
  for (int p = 0; p < (int)offers.size(); ++p) {
    const auto& o = offers[p];
    for (size_t i = 0; i + 1 < o.size();) {
      const int64_t step = o[i], cnt = o[i + 1];
      i += 2;
      for (int64_t j = 0; j < cnt && i < o.size(); ++j, ++i) have[step][(int)o[i]].push_back(p);
    }
  }
  RecoveryPlan plan;
  const int ranks = (int)process_of_rank.size();
  for (auto it = have.rbegin(); it != have.rend(); ++it) {
    if (it->first < disk_step) break;
    if ((int)it->second.size() < ranks) continue;
    std::vector<int32_t> provider(ranks, -1);
    for (auto& [r, holders] : it->second) {
      if (r < 0 || r >= ranks) continue;
      const int own = process_of_rank[r];
      provider[r] = std::find(holders.begin(), holders.end(), own) != holders.end() ? own : holders.front();
    }
    if (std::find(provider.begin(), provider.end(), -1) != provider.end()) continue;
    plan.source = RecoveryPlan::memory;
    plan.step = it->first;
    plan.provider = std::move(provider);
    return plan;
  }
  if (disk_step > 0) plan.source = RecoveryPlan::disk, plan.step = disk_step;
  return plan;
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

struct Cluster::Impl {
  caf::actor_system* sys = nullptr;
  ClusterOptions o;
  std::shared_ptr<UcxTransport> transport;
  std::vector<int> process_of_rank;
  caf::actor agent;
  std::vector<caf::actor> proxies;

  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int32_t, int32_t>, caf::actor> exposed;  // (kind, index) -> local actor
  std::map<int, caf::actor> tensor_dst;                       // global rank -> local worker
  caf::actor coordinator;
  // join state
  std::vector<bool> joined, ready, bye;
  std::vector<std::vector<char>> addresses;
  std::vector<std::string> who;  // "process r (host H, pid P)"
  std::vector<std::string> hosts;  // by process (from the joins; the table tells the others)
  std::vector<int32_t> pids;
  bool have_table = false;
  std::string refused;   // a refused join (this process, or any process at the hub)
  std::string failure;   // a lost peer or an abort
  bool ended = false;    // the hub said the job ended normally
  bool hub_gone = false;  // a process other than 0: the connection to the hub closed
  int unauthenticated = 0;  // control messages dropped for a wrong tag
  // in-place recovery
  std::vector<std::vector<int64_t>> offers;  // hub: each process's memory holdings
  RecoveryPlan plan;
  bool busy = false;  // a recovering joiner: the coordinator is still shutting down; try again
  std::map<int64_t, std::map<int, std::shared_ptr<const ShardData>>> incoming;  // state shards by step, rank
  std::map<int64_t, MemoryInfo> incoming_info;
  std::vector<bool> restored;
  caf::actor keeper;  // gets the peers' memory-snapshot copies (deliver_snapshots_to)

  bool hub() const { return o.env.rank == 0; }
  int nprocs() const { return o.env.world; }
  std::string name_of(int p) {
    std::lock_guard<std::mutex> lk(mu);
    return p < (int)who.size() && !who[p].empty() ? who[p] : "process " + std::to_string(p);
  }

  // A peer is gone: every wait of this process ends with `reason`, logged unless `quiet`
  // (this process's own abort: its caller reports the reason).
  void fail(const std::string& reason, bool quiet = false) {
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
};

namespace {

// The node agent: the network side of Cluster::Impl.
struct AgentState {
  std::shared_ptr<Cluster::Impl> impl;
  std::vector<caf::actor> peers;            // hub: agents by process; agent: [0] = hub
  std::vector<uint64_t> seq_out, seq_in;    // per process
  std::vector<Clock::time_point> last_seen; // per process
  std::vector<bool> live;
  RateLimitedLog dropped;                   // dropped control messages: logged at a bounded rate
  RateLimitedLog closed;                    // connections of non-members closed
  std::set<caf::actor_addr> told;           // hub: senders told that their secret is wrong
  std::vector<char> join_mac;               // the tag of this process's join (a refusal quotes it)
};

caf::behavior node_agent(caf::stateful_actor<AgentState>* self, std::shared_ptr<Cluster::Impl> impl) {
  auto& st = self->state;
  st.impl = impl;
  const int n = impl->nprocs();
  st.peers.resize(n);
  st.seq_out.assign(n, 0);
  st.seq_in.assign(n, 0);
  st.last_seen.assign(n, Clock::now());
  st.live.assign(n, false);
  const int me = impl->o.env.rank;
  const std::string& secret = impl->o.secret;

  // Serializes (kind, index, inner) and sends it, authenticated, to process p's agent.
  auto post = [=](int p, int32_t kind, int32_t index, caf::message inner) -> std::vector<char> {
    auto& s = self->state;
    const caf::actor dst = s.peers[p];
    if (!dst) return {};
    std::vector<char> body;
    caf::binary_serializer sink(self->system(), body);
    auto msg = caf::make_message(kind, index, std::move(inner));
    if (auto err = sink(msg)) {
      s.impl->fail("control plane: cannot serialize a message for " + s.impl->name_of(p) + ": " +
                   self->system().render(err));
      return {};
    }
    const uint64_t seq = ++s.seq_out[p];
    auto mac = envelope_mac(secret, me, p, seq, body);
    self->send(dst, ctl_atom::value, (int32_t)me, (int32_t)p, seq, std::move(body), mac);
    return mac;
  };
  auto lost = [=](int p, const std::string& why) {
    auto& s = self->state;
    if (!s.live[p]) return;
    s.live[p] = false;
    const char* respawn = std::getenv("TROUPE_RESPAWN");
    std::string reason = "lost " + s.impl->name_of(p) + ": " + why +
                         (s.impl->o.cfg.fault.policy != "restart" ? " (fault.policy = abort: the job stops)"
                          : respawn && std::string(respawn) == "process"
                              ? " (fault.policy = restart: troupe launch starts that process again and the job "
                                "continues from the newest complete snapshot, in memory or on disk)"
                              : " (fault.policy = restart: every process stops, and the launcher starts the job again "
                                "from the newest complete snapshot)");
    if (s.impl->hub()) {
      for (int q = 1; q < (int)s.peers.size(); ++q)
        if (q != p && s.live[q]) post(q, kAgentKind, 0, caf::make_message(abort_atom::value, reason));
    }
    s.impl->fail(reason);
  };
  // The hub's checks of a joining process.
  auto check_join = [=](int32_t p, int32_t world, const std::string& bin, const std::string& toml,
                        const std::string& resume, const std::string& tokenizer) -> std::string {
    auto& s = self->state;
    if (tokenizer != s.impl->o.tokenizer_hash)
      return fmt::format("process {} prepared its data with tokenizer {} but process 0 with {}: the nodes disagree on "
                         "token ids; give every process the same sources and data.tokenizer (or the same data.cache_dir)",
                         p, tokenizer, s.impl->o.tokenizer_hash);
    if (resume != s.impl->o.resume)
      return fmt::format("process {} continues from {} but process 0 from {}; give every process the same --resume", p,
                         resume.empty() ? std::string("no snapshot (a fresh start)") : resume,
                         s.impl->o.resume.empty() ? std::string("no snapshot (a fresh start)") : s.impl->o.resume);
    if (world != n)
      return fmt::format("process {} was started for {} processes but the job has {}; start every process with the same "
                         "world size",
                         p, world, n);
    if (bin != executable_hash())
      return fmt::format("process {} runs a different troupe binary (sha256 {} vs {}); run the same build everywhere", p,
                         bin.substr(0, 16), executable_hash().substr(0, 16));
    Config theirs;
    try {
      theirs = Config::parse(toml, "the config of process " + std::to_string(p));
    } catch (const std::exception& e) {
      return fmt::format("process {} sent a config that does not parse: {}", p, e.what());
    }
    auto a = s.impl->o.cfg.key_values(), b = theirs.key_values();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (a[i].first == "train.threads" || a[i].first == "data.cache_dir" || a[i].first == "data.threads") continue;  // may differ per host
      if (a[i].second != b[i].second)
        return fmt::format("process {} has {} = {} but process 0 has {}; start every process with the same config", p,
                           a[i].first, b[i].second, a[i].second);
    }
    return "";
  };

  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    for (int p = 0; p < (int)s.peers.size(); ++p)
      if (s.peers[p] && s.peers[p].address() == dm.source) {
        bool ended, retry;
        {
          std::lock_guard<std::mutex> lk(s.impl->mu);
          ended = s.impl->ended || (s.impl->hub() && s.impl->bye[p]);
          // a recovering process that reached the coordinator of the failed start: join again
          retry = !s.impl->hub() && s.impl->o.recovering && !s.impl->have_table;
        }
        bool joined;
        {
          std::lock_guard<std::mutex> lk(s.impl->mu);
          joined = s.impl->have_table;
        }
        if (retry) {
          s.live[0] = false;
        } else if (!s.impl->hub() && !joined && !ended) {  // never part of the job: nothing to restart
          s.live[0] = false;
          s.impl->fail(fmt::format(
              "process 0 at {}:{} closed the connection before this process joined the job (the job ended, or "
              "refused this process: check TROUPE_COORDINATOR and that TROUPE_JOB_SECRET is the job's)",
              s.impl->o.env.host, s.impl->o.env.port));
        } else if (!ended) {
          lost(s.impl->hub() ? p : 0, "its connection closed (the process exited or was killed)");
        }
        s.peers[p] = nullptr;
        if (!s.impl->hub()) {
          std::lock_guard<std::mutex> lk(s.impl->mu);
          s.impl->hub_gone = true;
          s.impl->cv.notify_all();
        }
      }
  });
  if (impl->o.cfg.fault.heartbeat_s > 0) self->delayed_send(self, secs(impl->o.cfg.fault.heartbeat_s), tick_atom::value);

  return {
      // this process's agent learns the hub's handle (non-hub processes)
      // (and sends it this process's join first: nothing else may precede it)
      [=](hub_atom, caf::actor hub, caf::message& join) {
        auto& s = self->state;
        s.peers[0] = hub;
        s.seq_in[0] = 0;  // a new coordinator (an in-place recovery may meet the failed start's first) counts anew
        self->monitor(hub);
        s.join_mac = post(0, kAgentKind, 0, std::move(join));
        s.live[0] = true;
        s.last_seen[0] = Clock::now();
      },
      // a control message for another process, from a local proxy or the Cluster
      [=](out_atom, int32_t p, int32_t kind, int32_t index, caf::message& inner) { post(p, kind, index, std::move(inner)); },
      [=](ctl_atom, int32_t from, int32_t to, uint64_t seq, std::vector<char>& body, std::vector<char>& mac) {
        auto& s = self->state;
        auto reject = [&](const std::string& why) {
          s.dropped.warn(fmt::format("dropped a message claiming to come from process {}: {}", from, why));
        };
        if (from < 0 || from >= n || to != me || from == me) return reject("bad process numbers");
        const auto want = envelope_mac(secret, from, to, seq, body);
        if (mac.size() != want.size() || CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
          {
            std::lock_guard<std::mutex> lk(s.impl->mu);
            ++s.impl->unauthenticated;
          }
          const auto sender = caf::actor_cast<caf::actor>(self->current_sender());
          const bool member = std::find(s.peers.begin(), s.peers.end(), sender) != s.peers.end();
          if (s.impl->hub() && sender && !member && s.told.insert(sender.address()).second) {
            // a process without the secret: it is told at once (quoting the tag of its message, so
            // that it knows the answer is about its join) and its connection closes after a grace
            // period (a troupe process exits on the notice; one that does not listen is cut off)
            self->send(sender, badsecret_atom::value, mac);
            self->delayed_send(self, std::chrono::seconds(2), drop_atom::value, sender.node());
            return reject("its authentication tag is wrong (a process without this job's TROUPE_JOB_SECRET); told it "
                          "so, and its connection closes in 2 s");
          }
          return reject("its authentication tag is wrong (not a member of this job: TROUPE_JOB_SECRET differs)");
        }
        if (!s.impl->hub() && caf::actor_cast<caf::actor>(self->current_sender()) != s.peers[0])
          return reject("not from the coordinator this process is joined to");

        caf::message msg;
        caf::binary_deserializer src(self->system(), body);
        if (auto err = src(msg)) return reject("undecodable body: " + self->system().render(err));
        int32_t kind = 0, index = 0;
        caf::message inner;
        if (!msg.match_elements<int32_t, int32_t, caf::message>()) return reject("unexpected body layout");
        kind = msg.get_as<int32_t>(0);
        index = msg.get_as<int32_t>(1);
        inner = msg.get_as<caf::message>(2);
        using JoinMsg = caf::detail::type_list<join_atom, int32_t, int32_t, std::string, std::string, std::vector<char>,
                                               std::string, int32_t, std::string, std::vector<int64_t>, std::string>;
        const bool is_join = kind == kAgentKind && inner.match_elements(JoinMsg{});
        const auto sender = caf::actor_cast<caf::actor>(self->current_sender());
        auto reply_direct = [&](caf::message m) {  // to a process that is not (yet) a peer
          std::vector<char> rb;
          caf::binary_serializer rs(self->system(), rb);
          auto rm = caf::make_message((int32_t)kAgentKind, (int32_t)0, std::move(m));
          if (!rs(rm)) {
            auto rmac = envelope_mac(secret, me, from, 1, rb);
            self->send(sender, ctl_atom::value, (int32_t)me, (int32_t)from, (uint64_t)1, std::move(rb), std::move(rmac));
          }
        };
        bool failing;
        {
          std::lock_guard<std::mutex> lk(s.impl->mu);
          failing = !s.impl->failure.empty();
        }
        if (s.impl->hub() && is_join && inner.get_as<std::string>(8) == kRecoveryResume &&
            (failing || (s.peers[from] && s.peers[from] != sender))) {
          // a recovering process reached this coordinator before it shut down: it tries again
          reply_direct(caf::make_message(busy_atom::value));
          return;
        }
        if (s.impl->hub() && is_join && s.peers[from] && s.peers[from] != sender) {
          // a second process claims a rank that is taken: refuse it, straight to its sender
          const std::string why = fmt::format("rank {} is already held by {}; give every process its own TROUPE_RANK",
                                              from, s.impl->name_of(from));
          spdlog::warn("control plane: refused a second process claiming rank {} (host {}, pid {})", from,
                       inner.get_as<std::string>(6), inner.get_as<int32_t>(7));
          reply_direct(caf::make_message(refuse_atom::value, why));
          return;
        }
        if (is_join && inner.get_as<int32_t>(1) != from) return reject("a join whose rank differs from its envelope's");
        if (seq <= s.seq_in[from]) return reject("replayed or reordered (sequence " + std::to_string(seq) + ")");
        s.seq_in[from] = seq;
        s.last_seen[from] = Clock::now();
        if (kind != kAgentKind) {
          caf::actor dst;
          {
            std::lock_guard<std::mutex> lk(s.impl->mu);
            auto it = s.impl->exposed.find({kind, index});
            if (it != s.impl->exposed.end()) dst = it->second;
          }
          if (!dst) return reject(fmt::format("no local actor ({}, {})", kind, index));
          caf::anon_send(dst, std::move(inner));
          return;
        }
        // the agents' own protocol
        if (s.impl->hub() && !s.peers[from]) {  // the first message of a process: its join
          if (!is_join) return reject("the first message of a process must be its join");
          const int32_t world = inner.get_as<int32_t>(2);
          const std::string& bin = inner.get_as<std::string>(3);
          const std::string& toml = inner.get_as<std::string>(4);
          const std::string who = fmt::format("process {} (host {}, pid {})", from, inner.get_as<std::string>(6),
                                              inner.get_as<int32_t>(7));
          s.peers[from] = caf::actor_cast<caf::actor>(self->current_sender());
          self->monitor(s.peers[from]);
          s.live[from] = true;
          const std::string why = check_join(from, world, bin, toml, inner.get_as<std::string>(8),
                                             inner.get_as<std::string>(10));
          if (!why.empty()) {
            post(from, kAgentKind, 0, caf::make_message(refuse_atom::value, why));
            std::lock_guard<std::mutex> lk(s.impl->mu);
            s.impl->refused = "refused at join: " + why;
            s.impl->cv.notify_all();
            return;
          }
          std::lock_guard<std::mutex> lk(s.impl->mu);
          s.impl->who[from] = who;
          s.impl->hosts[from] = inner.get_as<std::string>(6);
          s.impl->pids[from] = inner.get_as<int32_t>(7);
          s.impl->addresses[from] = inner.get_as<std::vector<char>>(5);
          s.impl->offers[from] = inner.get_as<std::vector<int64_t>>(9);
          s.impl->joined[from] = true;
          s.impl->cv.notify_all();
          return;
        }
        auto raise = [&](auto set) {  // a join/end flag under the lock, and every waiter woken
          std::lock_guard<std::mutex> lk(s.impl->mu);
          set();
          s.impl->cv.notify_all();
        };
        inner.apply({
            [&](refuse_atom, const std::string& why) {
              std::lock_guard<std::mutex> lk(s.impl->mu);
              s.impl->refused = "refused at join by process 0: " + why;
              s.impl->cv.notify_all();
            },
            [&](table_atom, std::vector<std::vector<char>>& addrs, int32_t source, int64_t step,
                std::vector<int32_t>& provider, std::vector<std::string>& hosts, std::vector<int32_t>& pids) {
              std::lock_guard<std::mutex> lk(s.impl->mu);
              s.impl->addresses = std::move(addrs);
              if ((int)hosts.size() == n && (int)pids.size() == n) {
                for (int q = 0; q < n; ++q)
                  if (q != me) {
                    s.impl->hosts[q] = hosts[q];
                    s.impl->pids[q] = pids[q];
                    s.impl->who[q] = fmt::format("process {} (host {}, pid {})", q, hosts[q], pids[q]);
                  }
              }
              s.impl->plan.source = source;
              s.impl->plan.step = step;
              s.impl->plan.provider = std::move(provider);
              s.impl->have_table = true;
              s.impl->cv.notify_all();
            },
            [&](busy_atom) { raise([&] { s.impl->busy = true; }); },
            [&](restored_atom) { raise([&] { s.impl->restored[from] = true; }); },
            [&](ready_atom) { raise([&] { s.impl->ready[from] = true; }); },
            [&](hb_atom) {},
            [&](end_atom) { raise([&] { s.impl->ended = true; }); },
            [&](bye_atom) { raise([&] { s.impl->bye[from] = true; }); },
            [&](abort_atom, const std::string& why) {
              if (s.impl->hub()) {  // a process's own job failed: everyone stops
                for (int q = 1; q < n; ++q)
                  if (q != from && s.live[q]) post(q, kAgentKind, 0, caf::make_message(abort_atom::value, why));
                s.impl->fail(why);
              } else {
                s.impl->fail("the job was aborted: " + why);
              }
            },
        });
      },
      // process 0 could not authenticate this process's join: another job secret
      [=](badsecret_atom, const std::vector<char>& mac) {
        auto& s = self->state;
        if (s.impl->hub() || caf::actor_cast<caf::actor>(self->current_sender()) != s.peers[0] || mac != s.join_mac)
          return;
        if (std::getenv("TROUPE_FAULT_IGNORE_REFUSAL")) return;  // fault switch (tests): a peer that does not listen
        std::lock_guard<std::mutex> lk(s.impl->mu);
        if (s.impl->have_table) return;
        s.impl->refused = fmt::format(
            "wrong job secret: process 0 at {}:{} cannot authenticate this process, so its TROUPE_JOB_SECRET differs "
            "from the job's; start it with the job's secret (troupe launch gives every process the same one)",
            s.impl->o.env.host, s.impl->o.env.port);
        s.impl->cv.notify_all();
      },
      // hub: close the connection of a process that was told its secret is wrong
      [=](drop_atom, const caf::node_id& node) {
        self->request(self->system().middleman().actor_handle(), std::chrono::seconds(5), caf::get_atom::value, node)
            .then(
                [=](const caf::node_id&, const std::string& host, uint16_t port) {
                  if (host.empty()) return;  // it has gone already
                  if (shutdown_connections_to(host, port) > 0)
                    self->state.closed.warn(fmt::format(
                        "closed the connection from {}:{} (a process without this job's secret)", host, port));
                },
                [](const caf::error&) {});
      },
      // heartbeats out, silence in
      [=](tick_atom) {
        auto& s = self->state;
        const double timeout = s.impl->o.cfg.fault.timeout_s;
        for (int p = 0; p < n; ++p) {
          if (p == me || !s.live[p]) continue;
          post(p, kAgentKind, 0, caf::make_message(hb_atom::value));
          const double silent = std::chrono::duration<double>(Clock::now() - s.last_seen[p]).count();
          if (silent > timeout) {
            std::string why =
                fmt::format("no heartbeat for {:.1f} s (hung, stopped or unreachable; fault.timeout_s = {})", silent, timeout);
            // a hung process never exits by itself: on this host, end it so that troupe launch
            // starts it again (an in-place recovery waits for it)
            const char* respawn = std::getenv("TROUPE_RESPAWN");
            std::string host;
            int32_t pid = 0;
            {
              std::lock_guard<std::mutex> lk(s.impl->mu);
              host = s.impl->hosts[p];
              pid = s.impl->pids[p];
            }
            if (s.impl->o.cfg.fault.policy == "restart" && respawn && pid > 0 && host == hostname() &&
                ::kill(pid, SIGKILL) == 0)
              why += "; killed it (SIGKILL) so that troupe launch starts it again";
            lost(p, why);
          }
        }
        self->delayed_send(self, secs(s.impl->o.cfg.fault.heartbeat_s), tick_atom::value);
      },
      // to every peer (hub: all agents) from the Cluster's own calls
      [=](abort_atom, const std::string& why) {
        auto& s = self->state;
        for (int p = 0; p < n; ++p)
          if (p != me && s.live[p]) post(p, kAgentKind, 0, caf::make_message(abort_atom::value, why));
      },
      [=](none_atom, int32_t p, caf::message& m) { post(p, kAgentKind, 0, std::move(m)); },
  };
}

}  // namespace

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
  im.agent = sys.spawn(node_agent, impl_);
  // pipeline tensors that arrive over UCX go to the local worker they are for
  std::weak_ptr<Impl> weak = impl_;
  auto deliver = [weak](const WireHeader& h, Tensor t) {
    auto im = weak.lock();
    if (!im) return;
    caf::actor dst;
    {
      std::lock_guard<std::mutex> lk(im->mu);
      auto it = im->tensor_dst.find(h.destination);
      if (it != im->tensor_dst.end()) dst = it->second;
    }
    if (!dst) {
      spdlog::warn("data plane: a tensor for rank {}, which is not in this process, was dropped", h.destination);
      return;
    }
    const int64_t k = h.step;
    const int mb = h.microbatch, c = h.chunk;
    switch (h.kind) {
      case kWireActivation: caf::anon_send(dst, act_atom::value, k, mb, c, std::move(t)); break;
      case kWireGradient: caf::anon_send(dst, grad_atom::value, k, mb, c, std::move(t)); break;
      case kWireTied: caf::anon_send(dst, tied_atom::value, k, std::move(t)); break;
      case kWireInference: caf::anon_send(dst, infer_atom::value, k, c, std::move(t)); break;
      default: break;
    }
  };
  for (uint8_t kind : {kWireActivation, kWireGradient, kWireTied, kWireInference}) im.transport->on_arrival(kind, deliver);
  // memory-snapshot shards: a peer's copy goes to the keeper (it decodes there, off the
  // progress thread); a recovery's state is decoded into `incoming`
  im.transport->on_arrival(kWireSnapshot, [weak](const WireHeader& h, Tensor t) {
    auto im = weak.lock();
    if (!im) return;
    if (h.chunk == 0) {
      caf::actor keeper;
      {
        std::lock_guard<std::mutex> lk(im->mu);
        keeper = im->keeper;
      }
      if (keeper) caf::anon_send(keeper, peershard_atom::value, h.step, (int32_t)h.microbatch, std::move(t));
      return;
    }
    try {
      MemoryInfo info;
      auto sd = std::make_shared<const ShardData>(decode_shard(t.data(), (size_t)t.numel(), &info));
      std::lock_guard<std::mutex> lk(im->mu);
      im->incoming[h.step][h.microbatch] = std::move(sd);
      im->incoming_info[h.step] = info;
      im->cv.notify_all();
    } catch (const std::exception& e) {
      spdlog::warn("data plane: dropped a recovery shard of rank {}: {}", h.microbatch, e.what());
    }
  });
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
  auto wait = [&](auto pred, const std::function<std::string()>& what) {
    std::unique_lock<std::mutex> lk(im.mu);
    if (!im.cv.wait_until(lk, deadline, [&] { return pred() || !im.refused.empty() || !im.failure.empty(); })) {
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
    auto port = im.sys->middleman().publish(im.agent, (uint16_t)im.o.env.port, im.o.env.host.c_str(), true);
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
      auto h = im.sys->middleman().remote_actor(im.o.env.host, (uint16_t)im.o.env.port);
      if (h) {
        hub = *h;
        break;
      }
      last_error = im.sys->render(h.error());
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

void Cluster::deliver_snapshots_to(caf::actor keeper) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->keeper = std::move(keeper);
}

void send_snapshot(Cluster::Impl& im, int proc, int64_t k, int rank, int purpose, const std::vector<float>& words,
                   double timeout_s);

void Cluster::send_snapshot_shard(int proc, int64_t k, int rank, int purpose, const std::vector<float>& words,
                                  double timeout_s) {
  snapshot_sender(proc, purpose, timeout_s)(k, rank, words);
}

std::function<void(int64_t, int, const std::vector<float>&)> Cluster::snapshot_sender(int proc, int purpose,
                                                                                       double timeout_s) {
  std::weak_ptr<Impl> weak = impl_;
  return [weak, proc, purpose, timeout_s](int64_t k, int rank, const std::vector<float>& words) {
    auto im = weak.lock();
    if (!im) throw Error("the job has ended");
    send_snapshot(*im, proc, k, rank, purpose, words, timeout_s);
  };
}

void send_snapshot(Cluster::Impl& im, int proc, int64_t k, int rank, int purpose, const std::vector<float>& words,
                   double timeout_s) {
  WireHeader h;
  h.kind = kWireSnapshot;
  h.step = k;
  h.microbatch = rank;
  h.chunk = purpose;
  h.source = im.o.placement.at(im.o.env.rank).at(0);
  h.destination = im.o.placement.at(proc).at(0);
  h.dtype = DType::f32;
  h.shape = {(int64_t)words.size()};
  h.bytes = words.size() * sizeof(float);
  auto transport = im.transport;
  transport->send(h, words.data(), timeout_s);
}


std::vector<std::shared_ptr<const ShardData>> Cluster::receive_state_shards(int64_t k, const std::vector<int>& ranks,
                                                                            MemoryInfo* info) {
  auto& im = *impl_;
  const auto deadline = Clock::now() + secs(im.o.cfg.fault.join_timeout_s);
  std::unique_lock<std::mutex> lk(im.mu);
  auto have_all = [&] {
    for (int r : ranks)
      if (!im.incoming[k].count(r)) return false;
    return true;
  };
  if (!im.cv.wait_until(lk, deadline, [&] { return have_all() || !im.failure.empty(); })) {
    std::string missing;
    for (int r : ranks)
      if (!im.incoming[k].count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw Error(fmt::format("the memory snapshot of step {} did not arrive within fault.join_timeout_s = {} s (ranks {} "
                            "missing)",
                            k, im.o.cfg.fault.join_timeout_s, missing));
  }
  if (!im.failure.empty()) throw Error(im.failure);
  std::vector<std::shared_ptr<const ShardData>> out;
  for (int r : ranks) out.push_back(im.incoming[k][r]);
  if (info && im.incoming_info.count(k)) *info = im.incoming_info[k];
  im.incoming.clear();  // the state is handed over: free the copies here
  return out;
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

caf::actor Cluster::tensor_proxy(int src, int dst, int src_stage, double timeout_s, caf::actor coordinator) {
  auto transport = impl_->transport;
  // fault injection (tests): TROUPE_FAULT_DELAY_RANK=r TROUPE_FAULT_DELAY_STEP=k
  // TROUPE_FAULT_DELAY_S=x holds rank r's pipeline messages of step k back x seconds (first
  // start only)
  double delay_s = 0;
  int64_t delay_step = -1;
  {
    const char* r = std::getenv("TROUPE_FAULT_DELAY_RANK");
    const char* k = std::getenv("TROUPE_FAULT_DELAY_STEP");
    const char* x = std::getenv("TROUPE_FAULT_DELAY_S");
    const char* rc = std::getenv("TROUPE_RESTART_COUNT");
    if (r && k && x && std::atoi(r) == src && !(rc && std::atoi(rc) > 0) && impl_->o.generation == 0) delay_step = std::atoll(k), delay_s = std::atof(x);
  }
  auto p = impl_->sys->spawn<caf::detached>([=](caf::event_based_actor* self) -> caf::behavior {
    auto ship = [=](uint8_t kind, int64_t k, int mb, int c, const Tensor& t) {
      WireHeader h;
      h.step = k;
      h.microbatch = mb;
      h.chunk = c;
      h.kind = kind;
      h.source = src;
      h.destination = dst;
      h.dtype = DType::f32;
      h.shape = t.shape();
      h.bytes = t.nbytes();
      if (k == delay_step && delay_s > 0) {
        log_event("injected_delay", {{"rank", src}, {"step", k}, {"seconds", delay_s}});
        std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      }
      try {
        transport->send(h, t.data(), timeout_s);
      } catch (const std::exception& e) {
        self->send(coordinator, fail_atom::value, src_stage,
                   fmt::format("sending to rank {} failed: {}", dst, e.what()));
      }
    };
    return {
        [=](act_atom, int64_t k, int mb, int c, const Tensor& t) { ship(kWireActivation, k, mb, c, t); },
        [=](grad_atom, int64_t k, int mb, int c, const Tensor& t) { ship(kWireGradient, k, mb, c, t); },
        [=](tied_atom, int64_t k, const Tensor& t) { ship(kWireTied, k, 0, 0, t); },
        [=](infer_atom, int64_t id, int c, const Tensor& t) { ship(kWireInference, id, 0, c, t); },
        [=](stop_atom) {},
    };
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
