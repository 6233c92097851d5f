// The node agent (protocol: actors/node_agent.h): envelopes out and in, the hub's join
// handling, heartbeats, lost peers.
#include "actors/node_agent.h"

#include "core/interrupt.h"

#include <openssl/crypto.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <caf/io/all.hpp>
#include <algorithm>
#include <set>

#include "actors/cluster_impl.h"
#include "actors/intruders.h"
#include "actors/join_check.h"
#include "actors/messages.h"
#include "actors/wire_types.h"
#include "core/error.h"

namespace troupe {

using namespace cluster_detail;

namespace {

// The node agent's state: the network side of Cluster::Impl.
struct AgentState {
  std::shared_ptr<Cluster::Impl> impl;
  std::vector<NodeAgentActor> peers;        // hub: agents by process; agent: [0] = hub
  std::vector<uint64_t> seq_out, seq_in;    // per process
  std::vector<Clock::time_point> last_seen; // per process
  std::vector<bool> live;
  RateLimitedLog dropped;                   // dropped control messages: logged at a bounded rate
  RateLimitedLog closed;                    // connections of non-members closed
  std::set<caf::actor_addr> told;           // hub: senders told that their secret is wrong
  std::vector<char> join_mac;               // the tag of this process's join (a refusal quotes it)
};
using Agent = NodeAgentActor::stateful_base<AgentState>;

// The join message's layout (actors/node_agent.h).
using JoinMsg = caf::detail::type_list<join_atom, int32_t, int32_t, std::string, std::string, std::vector<char>,
                                       std::string, int32_t, std::string, std::vector<int64_t>, std::string,
                                       std::string>;

// Serializes (kind, index, inner) and sends it, authenticated, to process p's agent;
// returns the envelope's tag (empty when p has no agent handle or serializing failed).
std::vector<char> post(Agent* self, int p, int32_t kind, int32_t index, caf::message inner) {
  auto& s = self->state;
  const int me = s.impl->o.env.rank;
  const NodeAgentActor dst = s.peers[p];
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
  auto mac = envelope_mac(s.impl->o.secret, me, p, seq, body);
  self->send(dst, ctl_atom::value, (int32_t)me, (int32_t)p, seq, std::move(body), mac);
  return mac;
}

// Process p is gone (`why`): the Cluster fails; the hub tells every other live agent.
void lost(Agent* self, int p, const std::string& why) {
  auto& s = self->state;
  if (!s.live[p]) return;
  s.live[p] = false;
  const char* respawn = std::getenv("TROUPE_RESPAWN");
  const auto& fault = s.impl->o.cfg.fault;
  const int failures = s.impl->o.generation + 1;  // this one included
  std::string reason = "lost " + s.impl->name_of(p) + ": " + why +
                       (fault.policy != "restart" ? " (fault.policy = abort: the job stops)"
                        : failures > fault.max_restarts
                            ? fmt::format(" (fault.policy = restart, but the job has failed {} time(s), more than "
                                          "fault.max_restarts = {}: it stops)",
                                          failures, fault.max_restarts)
                        : respawn && std::string(respawn) == "process"
                            ? " (fault.policy = restart: troupe launch starts that process again and the job "
                              "continues from the newest complete snapshot, in memory or on disk)"
                            : " (fault.policy = restart: every process stops, and the launcher starts the job again "
                              "from the newest complete snapshot)");
  if (s.impl->hub()) {
    for (int q = 1; q < (int)s.peers.size(); ++q)
      if (q != p && s.live[q]) post(self, q, kAgentKind, 0, caf::make_message(abort_atom::value, reason));
  }
  s.impl->fail(reason);
}

void reject(Agent* self, int32_t from, const std::string& why) {
  self->state.dropped.warn(fmt::format("dropped a message claiming to come from process {}: {}", from, why));
}

// A peer's connection closed.
void on_down(Agent* self, caf::down_msg& dm) {
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
        lost(self, s.impl->hub() ? p : 0, "its connection closed (the process exited or was killed)");
      }
      s.peers[p] = nullptr;
      if (!s.impl->hub()) {
        std::lock_guard<std::mutex> lk(s.impl->mu);
        s.impl->hub_gone = true;
        s.impl->cv.notify_all();
      }
    }
}

// Whether an envelope's tag is right; a wrong one is counted, and the hub tells a stranger
// (once) that its secret is wrong and closes its connection 2 s later.
bool authentic(Agent* self, int32_t from, int32_t to, uint64_t seq, const std::vector<char>& body,
               const std::vector<char>& mac) {
  auto& s = self->state;
  const auto want = envelope_mac(s.impl->o.secret, from, to, seq, body);
  if (mac.size() == want.size() && CRYPTO_memcmp(mac.data(), want.data(), want.size()) == 0) return true;
  {
    std::lock_guard<std::mutex> lk(s.impl->mu);
    ++s.impl->unauthenticated;
  }
  const auto sender = caf::actor_cast<NodeAgentActor>(self->current_sender());
  const bool member = std::find(s.peers.begin(), s.peers.end(), sender) != s.peers.end();
  if (s.impl->hub() && sender && !member && s.told.insert(sender.address()).second) {
    // a process without the secret: it is told at once (quoting the tag of its message, so
    // that it knows the answer is about its join) and its connection closes after a grace
    // period (a troupe process exits on the notice; one that does not listen is cut off)
    self->send(sender, badsecret_atom::value, mac);
    self->delayed_send(self, std::chrono::seconds(2), drop_atom::value, sender.node());
    reject(self, from,
           "its authentication tag is wrong (a process without this job's TROUPE_JOB_SECRET); told it "
           "so, and its connection closes in 2 s");
    return false;
  }
  reject(self, from, "its authentication tag is wrong (not a member of this job: TROUPE_JOB_SECRET differs)");
  return false;
}

// Hub: a join that must be answered outside the sequence — a recovering process that met
// the failed start's coordinator (busy), or a second claimant of a rank (refused). True
// when it was answered so.
bool answer_out_of_band(Agent* self, int32_t from, const caf::message& inner) {
  auto& s = self->state;
  const int me = s.impl->o.env.rank;
  const auto sender = caf::actor_cast<NodeAgentActor>(self->current_sender());
  auto reply_direct = [&](caf::message m) {  // to a process that is not (yet) a peer
    std::vector<char> rb;
    caf::binary_serializer rs(self->system(), rb);
    auto rm = caf::make_message((int32_t)kAgentKind, (int32_t)0, std::move(m));
    if (!rs(rm)) {
      auto rmac = envelope_mac(s.impl->o.secret, me, from, 1, rb);
      self->send(sender, ctl_atom::value, (int32_t)me, (int32_t)from, (uint64_t)1, std::move(rb), std::move(rmac));
    }
  };
  bool failing;
  {
    std::lock_guard<std::mutex> lk(s.impl->mu);
    failing = !s.impl->failure.empty();
  }
  if (inner.get_as<std::string>(8) == kRecoveryResume && (failing || (s.peers[from] && s.peers[from] != sender))) {
    // a recovering process reached this coordinator before it shut down: it tries again
    reply_direct(caf::make_message(busy_atom::value));
    return true;
  }
  if (s.peers[from] && s.peers[from] != sender) {
    // a second process claims a rank that is taken: refuse it, straight to its sender
    const std::string why = fmt::format("rank {} is already held by {}; give every process its own TROUPE_RANK", from,
                                        s.impl->name_of(from));
    spdlog::warn("control plane: refused a second process claiming rank {} (host {}, pid {})", from,
                 inner.get_as<std::string>(6), inner.get_as<int32_t>(7));
    reply_direct(caf::make_message(refuse_atom::value, why));
    return true;
  }
  return false;
}

// Hub: the first message of process `from`, its join (checked by check_join).
void on_join(Agent* self, int32_t from, const caf::message& inner) {
  auto& s = self->state;
  const std::string who =
      fmt::format("process {} (host {}, pid {})", from, inner.get_as<std::string>(6), inner.get_as<int32_t>(7));
  s.peers[from] = caf::actor_cast<NodeAgentActor>(self->current_sender());
  self->monitor(s.peers[from]);
  s.live[from] = true;
  JoinRequest theirs{from, inner.get_as<int32_t>(2), inner.get_as<std::string>(3), inner.get_as<std::string>(4),
                     inner.get_as<std::string>(8), inner.get_as<std::string>(10), inner.get_as<std::string>(11)};
  JoinRequest ours{0, s.impl->nprocs(), executable_hash(), "", s.impl->o.resume, s.impl->o.tokenizer_hash,
                   s.impl->o.data_key};
  const std::string why = check_join(theirs, ours, s.impl->o.cfg);
  if (!why.empty()) {
    post(self, from, kAgentKind, 0, caf::make_message(refuse_atom::value, why));
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
}

// The agents' own protocol (kind -1), after the join.
void on_agent_message(Agent* self, int32_t from, caf::message& inner) {
  auto& s = self->state;
  const int n = s.impl->nprocs(), me = s.impl->o.env.rank;
  auto raise = [&](auto set) {  // a join/end flag under the lock, and every waiter woken
    std::lock_guard<std::mutex> lk(s.impl->mu);
    set();
    s.impl->cv.notify_all();
  };
  inner.apply({
      [&](refuse_atom, const std::string& why) {
        raise([&] { s.impl->refused = "refused at join by process 0: " + why; });
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
      [&](stop_atom, int32_t sig) {  // hub: another process received a stop signal
        if (!s.impl->hub() || sig <= 0 || sig >= 65) return;
        int none = 0;
        if (s.impl->forwarded_stop.compare_exchange_strong(none, sig)) {
          s.impl->forwarded_stop_from = from;
          spdlog::info("signal {} ({}) reached {}: the job stops after the current step", sig, signal_name(sig),
                       s.impl->name_of(from));
        }
      },
      [&](end_atom) { raise([&] { s.impl->ended = true; }); },
      [&](bye_atom) { raise([&] { s.impl->bye[from] = true; }); },
      [&](abort_atom, const std::string& why) {
        if (s.impl->hub()) {  // a process's own job failed: everyone stops
          for (int q = 1; q < n; ++q)
            if (q != from && s.live[q]) post(self, q, kAgentKind, 0, caf::make_message(abort_atom::value, why));
          s.impl->fail(why);
        } else {
          s.impl->fail("the job was aborted: " + why);
        }
      },
  });
}

// An envelope from another process: authenticated, ordered, decoded, then delivered to a
// local actor or handled by the agent.
void on_envelope(Agent* self, int32_t from, int32_t to, uint64_t seq, std::vector<char>& body,
                 std::vector<char>& mac) {
  auto& s = self->state;
  const int n = s.impl->nprocs(), me = s.impl->o.env.rank;
  if (from < 0 || from >= n || to != me || from == me) return reject(self, from, "bad process numbers");
  if (!authentic(self, from, to, seq, body, mac)) return;
  if (!s.impl->hub() && caf::actor_cast<NodeAgentActor>(self->current_sender()) != s.peers[0])
    return reject(self, from, "not from the coordinator this process is joined to");
  caf::message msg;
  caf::binary_deserializer src(self->system(), body);
  if (auto err = src(msg)) return reject(self, from, "undecodable body: " + self->system().render(err));
  if (!msg.match_elements<int32_t, int32_t, caf::message>()) return reject(self, from, "unexpected body layout");
  const int32_t kind = msg.get_as<int32_t>(0), index = msg.get_as<int32_t>(1);
  caf::message inner = msg.get_as<caf::message>(2);
  const bool is_join = kind == kAgentKind && inner.match_elements(JoinMsg{});
  if (s.impl->hub() && is_join && answer_out_of_band(self, from, inner)) return;
  // hub: after its join, process p speaks only through the agent that joined as p. A second
  // process holding the job's secret and claiming p (refused above) sent its own abort on
  // the next sequence number, and the job took it for process p's (it ended 75)
  if (s.impl->hub() && !is_join && s.peers[from] && caf::actor_cast<NodeAgentActor>(self->current_sender()) != s.peers[from])
    return reject(self, from, "not from the process that joined as process " + std::to_string(from));
  if (is_join && inner.get_as<int32_t>(1) != from) return reject(self, from, "a join whose rank differs from its envelope's");
  if (seq <= s.seq_in[from]) return reject(self, from, "replayed or reordered (sequence " + std::to_string(seq) + ")");
  s.seq_in[from] = seq;
  s.last_seen[from] = Clock::now();
  if (kind != kAgentKind) {
    caf::actor dst;
    {
      std::lock_guard<std::mutex> lk(s.impl->mu);
      auto it = s.impl->exposed.find({kind, index});
      if (it != s.impl->exposed.end()) dst = it->second;
    }
    if (!dst) return reject(self, from, fmt::format("no local actor ({}, {})", kind, index));
    caf::anon_send(dst, std::move(inner));
    return;
  }
  if (s.impl->hub() && !s.peers[from]) {  // the first message of a process: its join
    if (!is_join) return reject(self, from, "the first message of a process must be its join");
    return on_join(self, from, inner);
  }
  on_agent_message(self, from, inner);
}

// Process 0 could not authenticate this process's join: another job secret.
void on_badsecret(Agent* self, const std::vector<char>& mac) {
  auto& s = self->state;
  if (s.impl->hub() || caf::actor_cast<NodeAgentActor>(self->current_sender()) != s.peers[0] || mac != s.join_mac) return;
  if (s.impl->o.fault_ignore_refusal) return;  // fault switch (tests): a peer that does not listen
  std::lock_guard<std::mutex> lk(s.impl->mu);
  if (s.impl->have_table) return;
  s.impl->refused = fmt::format(
      "wrong job secret: process 0 at {}:{} cannot authenticate this process, so its TROUPE_JOB_SECRET differs "
      "from the job's; start it with the job's secret (troupe launch gives every process the same one)",
      s.impl->o.env.host, s.impl->o.env.port);
  s.impl->cv.notify_all();
}

// Heartbeats out, silence in.
void on_tick(Agent* self) {
  auto& s = self->state;
  const int n = s.impl->nprocs(), me = s.impl->o.env.rank;
  const double timeout = s.impl->o.cfg.fault.timeout_s;
  for (int p = 0; p < n; ++p) {
    if (p == me || !s.live[p]) continue;
    post(self, p, kAgentKind, 0, caf::make_message(hb_atom::value));
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
      lost(self, p, why);
    }
  }
  self->delayed_send(self, secs(s.impl->o.cfg.fault.heartbeat_s), tick_atom::value);
}

NodeAgentActor::behavior_type node_agent(Agent* self, std::shared_ptr<Cluster::Impl> impl) {
  auto& st = self->state;
  st.impl = impl;
  const int n = impl->nprocs();
  st.peers.resize(n);
  st.seq_out.assign(n, 0);
  st.seq_in.assign(n, 0);
  st.last_seen.assign(n, Clock::now());
  st.live.assign(n, false);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  if (impl->o.cfg.fault.heartbeat_s > 0) self->delayed_send(self, secs(impl->o.cfg.fault.heartbeat_s), tick_atom::value);
  if (!impl->hub() && impl->o.stop_signal) self->delayed_send(self, std::chrono::milliseconds(200), sigchk_atom::value);
  return {
      // this process's agent learns the hub's handle (non-hub processes)
      // (and sends it this process's join first: nothing else may precede it)
      [=](hub_atom, caf::actor hub, caf::message& join) {
        auto& s = self->state;
        s.peers[0] = caf::actor_cast<NodeAgentActor>(hub);
        s.seq_in[0] = 0;  // a new coordinator (an in-place recovery may meet the failed start's first) counts anew
        self->monitor(s.peers[0]);
        s.join_mac = post(self, 0, kAgentKind, 0, std::move(join));
        s.live[0] = true;
        s.last_seen[0] = Clock::now();
      },
      // a control message for another process, from a local proxy or the Cluster
      [=](out_atom, int32_t p, int32_t kind, int32_t index, caf::message& inner) {
        post(self, p, kind, index, std::move(inner));
      },
      [=](ctl_atom, int32_t from, int32_t to, uint64_t seq, std::vector<char>& body, std::vector<char>& mac) {
        on_envelope(self, from, to, seq, body, mac);
      },
      [=](badsecret_atom, const std::vector<char>& mac) { on_badsecret(self, mac); },
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
      [=](tick_atom) { on_tick(self); },
      // a process other than 0: a stop signal it received goes to process 0, which stops the
      // whole job after the current step (with a snapshot); the process itself runs on until then
      [=](sigchk_atom) {
        auto& s = self->state;
        const int sig = s.impl->o.stop_signal ? s.impl->o.stop_signal->load() : 0;
        bool joined;
        {
          std::lock_guard<std::mutex> lk(s.impl->mu);
          joined = s.impl->have_table && s.impl->failure.empty() && !s.impl->ended;
        }
        if (sig != 0 && joined && s.live[0]) {
          post(self, 0, kAgentKind, 0, caf::make_message(stop_atom::value, (int32_t)sig));
          spdlog::info("signal {} ({}): asked process 0 to stop the job after the current step", sig, signal_name(sig));
          return;  // once
        }
        self->delayed_send(self, std::chrono::milliseconds(200), sigchk_atom::value);
      },
      // to every peer (hub: all agents) from the Cluster's own calls
      [=](abort_atom, const std::string& why) {
        auto& s = self->state;
        const int me = s.impl->o.env.rank;
        for (int p = 0; p < n; ++p)
          if (p != me && s.live[p]) post(self, p, kAgentKind, 0, caf::make_message(abort_atom::value, why));
      },
      [=](none_atom, int32_t p, caf::message& m) { post(self, p, kAgentKind, 0, std::move(m)); },
  };
}

}  // namespace

NodeAgentActor spawn_node_agent(const std::shared_ptr<Cluster::Impl>& impl) { return impl->sys->spawn(node_agent, impl); }

}  // namespace troupe
