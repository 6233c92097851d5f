// collectives/ucx.h: the transport's façade over the UCX engine (collectives/ucx_engine.h),
// and the links that run collectives/group.h's algorithms over it (make_ucx_communicator).
// A group's message travels as a kWireCollective header: step = GroupMsg::seq, microbatch
// = the group's id, chunk = GroupMsg::chunk, source/destination = global ranks, f32 {count}.
#include "collectives/ucx.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "collectives/group.h"
#include "collectives/ucx_engine.h"
#include "core/error.h"

namespace troupe {
namespace {

// The communicators reach the engine behind a transport through this table (the transport's
// Impl is private to it).
std::mutex g_engines_mu;
std::unordered_map<const UcxTransport*, std::weak_ptr<ucx::Engine>> g_engines;

// The UCX_* variables of the environment that can shape the data plane (not UCX's logging,
// debugging or statistics), "NAME=value ..." ("" when none is set).
std::string ucx_settings(std::vector<std::string>* names) {
  std::string out;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "UCX_", 4) != 0) continue;
    bool diagnostic = false;
    for (const char* p : {"UCX_LOG", "UCX_DEBUG", "UCX_HANDLE_ERRORS", "UCX_ERROR_", "UCX_STATS", "UCX_PROFILE",
                          "UCX_MEMTRACK", "UCX_VFS", "UCX_WARN"})
      diagnostic = diagnostic || std::strncmp(*e, p, std::strlen(p)) == 0;
    if (diagnostic) continue;
    const char* eq = std::strchr(*e, '=');
    if (!eq || !eq[1]) continue;
    std::string value(eq + 1);
    if (value.size() > 60) value = value.substr(0, 57) + "...";
    out += (out.empty() ? "" : " ") + std::string(static_cast<const char*>(*e), eq) + "=" + value;
    names->push_back(std::string(static_cast<const char*>(*e), eq));
  }
  return out;
}

// A UCX failure while the data plane is set up (`doing`): with UCX_* variables set it is
// theirs to fix, so the user gets one sentence naming them (UserError: exit 2, no restart,
// the same words on every process); otherwise the failure `e` stands.
[[noreturn]] void throw_setup_failure(const std::exception& e, const std::string& doing) {
  std::vector<std::string> names;
  const std::string set = ucx_settings(&names);
  if (set.empty() || std::strstr(e.what(), "UCX status ") == nullptr) throw;  // not UCX's refusal, or not theirs
  std::string status = e.what();  // UCS_CHECK's text: "... UCX status <status>: <context>"
  if (const size_t at = status.find("UCX status "); at != std::string::npos) {
    status = status.substr(at + 11);
    status = status.substr(0, status.find(':'));
  } else {
    status = status.substr(0, 120);
  }
  std::string unset;
  for (const auto& n : names) unset += (unset.empty() ? "" : " ") + n;
  throw UserError("the UCX data plane cannot " + doing + " with " + set + " set in the environment (UCX: " + status +
                  "); unset " + unset + (names.size() > 1 ? ", or give them values" : ", or give it a value") +
                  " this host supports (`ucx_info -d` lists its transports and devices)");
}

}  // namespace

struct UcxTransport::Impl {
  std::shared_ptr<ucx::Engine> engine;
};

UcxTransport::UcxTransport(TransportOptions o) : impl_(std::make_unique<Impl>()) {
  try {
    impl_->engine = std::make_shared<ucx::Engine>(std::move(o));
  } catch (const std::exception& e) {
    throw_setup_failure(e, "start");
  }
  std::lock_guard<std::mutex> lk(g_engines_mu);
  g_engines[this] = impl_->engine;
}

UcxTransport::~UcxTransport() {
  {
    std::lock_guard<std::mutex> lk(g_engines_mu);
    g_engines.erase(this);
  }
  impl_.reset();
}

std::vector<uint8_t> UcxTransport::address() const { return impl_->engine->address(); }

void UcxTransport::connect(const std::vector<std::vector<uint8_t>>& addresses) {
  try {
    impl_->engine->connect(addresses);
  } catch (const std::exception& e) {
    throw_setup_failure(e, "reach the other processes");
  }
}

void UcxTransport::send(const WireHeader& h, const void* payload, double timeout_s) {
  const auto deadline = ucx::deadline_in(timeout_s);
  ucx::Engine& e = *impl_->engine;
  auto op = e.post_send(h, payload);
  e.wait({op}, deadline, timeout_s, [&] {
    return "send of " + wire_ident(h) + " from rank " + std::to_string(h.source) + " to rank " + std::to_string(h.destination);
  }, [](int r) { return "rank " + std::to_string(r); });
}

void UcxTransport::recv(const WireHeader& want, void* buf, double timeout_s) {
  const auto deadline = ucx::deadline_in(timeout_s);
  ucx::Engine& e = *impl_->engine;
  auto op = e.post_recv(want, buf);
  e.wait({op}, deadline, timeout_s, [&] {
    return "recv of " + wire_ident(want) + " from rank " + std::to_string(want.source) + " at rank " +
           std::to_string(want.destination);
  }, [](int r) { return "rank " + std::to_string(r); });
}

void UcxTransport::on_arrival(uint8_t kind, std::function<void(const WireHeader&, Tensor)> handler) {
  impl_->engine->on_arrival(kind, std::move(handler));
}

void UcxTransport::abort(const std::string& reason) { impl_->engine->abort(reason); }
uint64_t UcxTransport::rejected() const { return impl_->engine->rejected(); }
int UcxTransport::process() const { return impl_->engine->options().process; }
int UcxTransport::nprocs() const { return impl_->engine->options().nprocs; }

namespace {

class UcxLinks : public GroupLinks {
 public:
  UcxLinks(std::shared_ptr<UcxTransport> t, std::shared_ptr<ucx::Engine> e, std::vector<int> ranks, int32_t id)
      : t_(std::move(t)), e_(std::move(e)), ranks_(std::move(ranks)), id_(id) {}

  void post_send(const GroupMsg& m, const float* buf) override { ops_.push_back(e_->post_send(header(m), buf)); }
  void post_recv(const GroupMsg& m, float* buf) override { ops_.push_back(e_->post_recv(header(m), buf)); }

  void wait(double timeout_s, Clock::time_point deadline, const std::function<std::string()>& what,
            bool) override {
    std::vector<std::shared_ptr<ucx::Op>> ops;
    ops.swap(ops_);
    // "rank 2 (global rank 5)"
    e_->wait(ops, deadline, timeout_s, what, [this](int global) {
      auto it = std::find(ranks_.begin(), ranks_.end(), global);
      return "rank " + std::to_string(it - ranks_.begin()) + " (global rank " + std::to_string(global) + ")";
    });
  }

 private:
  WireHeader header(const GroupMsg& m) const { return group_header(m, id_, ranks_[m.from], ranks_[m.to]); }

  std::shared_ptr<UcxTransport> t_;  // keeps the engine's transport alive
  std::shared_ptr<ucx::Engine> e_;
  const std::vector<int> ranks_;
  const int32_t id_;
  std::vector<std::shared_ptr<ucx::Op>> ops_;  // posted since the last wait
};

}  // namespace

std::shared_ptr<Communicator> make_ucx_communicator(std::shared_ptr<UcxTransport> transport, std::vector<int> ranks,
                                                    int my_index, int32_t id, std::string name) {
  TROUPE_CHECK(transport) << "communicator " << name << " without a transport";
  TROUPE_CHECK(!ranks.empty() && my_index >= 0 && my_index < (int)ranks.size())
      << "communicator " << name << ": index " << my_index << " in a group of " << ranks.size();
  TROUPE_CHECK(id >= 0) << "communicator " << name << ": negative id " << id;
  TROUPE_CHECK(std::is_sorted(ranks.begin(), ranks.end()) &&
               std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end())
      << "communicator " << name << ": ranks must be ascending and distinct";
  std::shared_ptr<ucx::Engine> e;
  {
    std::lock_guard<std::mutex> lk(g_engines_mu);
    auto it = g_engines.find(transport.get());
    if (it != g_engines.end()) e = it->second.lock();
  }
  TROUPE_CHECK(e) << "communicator " << name << ": the transport is gone";
  for (int r : ranks)
    TROUPE_CHECK(r >= 0 && r < e->options().limits.world)
        << "communicator " << name << ": rank " << r << " outside a world of " << e->options().limits.world;
  TROUPE_CHECK(e->proc_of(ranks[my_index]) == transport->process())
      << "communicator " << name << ": rank " << ranks[my_index] << " does not live in process " << transport->process();
  const int n = (int)ranks.size();
  return make_group_communicator(std::make_unique<UcxLinks>(std::move(transport), std::move(e), std::move(ranks), id),
                                 my_index, n, std::move(name));
}

}  // namespace troupe
