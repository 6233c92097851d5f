// The UCX data plane of collectives/ucx.h: one ucp context + worker per process, driven
// by one progress thread, and the Communicator collectives over it.
//
// UCX tags (64 bits) — every message is a header frame and (when bytes > 0) a payload:
//   bit 63        0 = header frame, 1 = payload
//   bits 40..62   the sending process (< 2^23)
//   bits 0..39    the sender's message sequence number (per sending process, wraps at 2^40)
// The header goes out with tag (process << 40 | seq), its payload with the same tag plus
// bit 63, so a receiver derives the payload's tag from the probed header's sender tag and
// posts an exact-match receive for it; payload tags never collide within a job.
//
// Receiving (progress thread): ucp_tag_probe_nb(header space, remove) -> the frame length
// is checked (at most kMaxFrame bytes; a longer one is received truncated into the fixed
// buffer and dropped) -> ucp_tag_msg_recv_nbx -> decode_header (HMAC, ranges, bytes =
// shape x dtype; a failure is logged, counted in rejected() and dropped) -> the header's
// source must be a rank of the process in the tag and its destination a rank of this
// process -> the payload is received, in this order of preference:
//   1. into a handler's new Tensor when its kind has an on_arrival handler;
//   2. straight into the buffer of a recv() already waiting for that header (zero-copy;
//      UCX switches to rendezvous above its thresholds);
//   3. into a staging buffer of header.bytes bytes, copied out when recv() asks.
// Headers are handled in arrival order, so messages with the same identity (kind, source,
// destination, step, microbatch, chunk) are matched first-in first-out.
//
// Threads: one thread at a time calls UCX (worker in serialized mode, token_): the
// progress thread, or a caller that waits for its messages and progresses the worker
// itself for up to kWaitSpinS (handlers still run on the progress thread). Callers queue commands
// (a std::function run on the progress thread) under mu_ and wake it with
// ucp_worker_signal; they wait on cv_ with their deadline. The progress thread sleeps in
// poll() on the worker's event fd after ucp_worker_arm (kPollMs at most, so a stop is
// noticed even if a wakeup is lost); without an event fd it sleeps 50 us .. 1 ms. While
// a transfer is in flight it keeps progressing up to kSpinS (50 us) after the last event
// before it sleeps.
// UCX callbacks run inside ucp_worker_progress / ucp_request_cancel / ucp_ep_close_nbx on
// the progress thread and take mu_ themselves, so the progress thread never holds mu_
// while calling UCX.
//
// Buffers lent to UCX: a send's payload and a zero-copy recv's buffer belong to UCX from
// the moment the request is posted until its completion callback. A wait that gives up
// (deadline, abort, failed peer) therefore first has the progress thread cancel the
// request (a recv: ucp_request_cancel; a send: the endpoint is force-closed, which fails
// its requests) and waits up to kGraceS for the callback before it throws.
//
// Units: sizes in bytes unless named `count` (fp32 elements); times in seconds (double)
// at the interface, steady_clock time points inside.
#include "collectives/ucx.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

// UCS_CHECK(expr) << "context": throws troupe::Error naming the expression, the UCX status
// and the context when expr (a ucs_status_t) is not UCS_OK.
#define UCS_CHECK(expr)                                                                             \
  if (const ucs_status_t ucs_check_status_ = (expr); ucs_check_status_ == UCS_OK) {                 \
  } else                                                                                            \
    ::troupe::detail::CheckFailure<::troupe::Error>(#expr, __func__, __FILE__, __LINE__, false)     \
        << "UCX status " << ucs_status_string(ucs_check_status_) << ": "

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kDataBit = 1ull << 63;
constexpr int kProcShift = 40;
constexpr uint64_t kSeqMask = (1ull << kProcShift) - 1;
constexpr uint64_t kProcMask = (1ull << 23) - 1;
// Largest header frame decode_header accepts: u32 length + at most 4096 bytes of Cap'n
// Proto + 32-byte HMAC (collectives/wire.h). Checked before the frame is received.
constexpr size_t kMaxFrame = 4 + 4096 + 32;
constexpr int kPollMs = 100;         // longest sleep of the progress thread in wakeup mode
// While a send or a payload receive is in flight, the progress thread keeps calling
// ucp_worker_progress for up to kSpinS seconds after the last event before it arms the
// worker and sleeps: a large transfer over TCP makes many small steps, and sleeping
// between them (arm + poll + wakeup per step) cost ~25% of the bandwidth at 64 MiB
// (bench/ucx_bench). Bounded, and never while idle: a worker with nothing in flight sleeps.
constexpr double kSpinS = 50e-6;
// A caller that waits for its messages progresses the worker itself for up to kWaitSpinS
// (when the progress thread is not progressing it) before it sleeps on the condition
// variable: a small message's answer then costs no thread wakeup (bench/ucx_bench's
// 8-byte round trip, docs/multiprocess.md). Bounded, so a long wait (a pipeline bubble)
// sleeps and leaves the core to computation.
constexpr double kWaitSpinS = 200e-6;
constexpr double kGraceS = 2.0;      // wait for UCX to release a buffer after a cancel
constexpr double kCloseS = 2.0;      // wait for endpoints to close at shutdown

Clock::time_point deadline_in(double seconds) {
  seconds = std::clamp(seconds, 0.0, 1e7);  // "forever" must not overflow the clock
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string secs(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

const char* kind_name(uint8_t k) {
  switch (k) {
    case kWireActivation: return "activation";
    case kWireGradient: return "gradient";
    case kWireTied: return "tied-embedding gradient";
    case kWireCollective: return "collective";
    case kWireInference: return "inference";
    case kWireSnapshot: return "memory-snapshot shard";
    default: return "unknown kind";
  }
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// "activation (step 3, microbatch 1, chunk 0)"
std::string ident(const WireHeader& h) {
  return std::string(kind_name(h.kind)) + " (step " + std::to_string(h.step) + ", microbatch " +
         std::to_string(h.microbatch) + ", chunk " + std::to_string(h.chunk) + ")";
}

std::string layout(const WireHeader& h) {
  return std::string(dtype_name(h.dtype)) + " " + shape_str(h.shape) + " (" + std::to_string(h.bytes) + " bytes)";
}

bool same_layout(const WireHeader& a, const WireHeader& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.bytes == b.bytes;
}

using Key = std::tuple<uint8_t, int32_t, int32_t, int64_t, int32_t, int32_t>;

// Removes and returns the oldest entry queued under k (nullptr when there is none).
template <class T>
std::shared_ptr<T> take_first(std::map<Key, std::deque<std::shared_ptr<T>>>& m, const Key& k) {
  auto it = m.find(k);
  if (it == m.end()) return nullptr;
  std::shared_ptr<T> x = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) m.erase(it);
  return x;
}
Key key_of(const WireHeader& h) { return {h.kind, h.source, h.destination, h.step, h.microbatch, h.chunk}; }

using Handler = std::function<void(const WireHeader&, Tensor)>;

// One send, one recv, or one unexpected message (arrived before a recv asked for it).
// Fields are guarded by Engine::mu_ except `req`, which only the progress thread touches.
struct Op {
  enum State { kQueued, kActive, kDone, kFailed };
  bool is_send = false;
  State state = kQueued;  // send: queued for / lent to UCX; recv: waiting for its header / payload arriving
  std::string error;      // why it failed
  WireHeader h;           // send: the header; recv: the one wanted; unexpected: the one that arrived
  int peer = -1;          // the other process
  void* buf = nullptr;    // recv: destination of h.bytes bytes; send: the payload
  std::vector<uint8_t> frame;                // send: the encoded header
  std::unique_ptr<uint8_t[]> staging;        // unexpected message: its payload
  std::shared_ptr<Op> unexpected;            // recv served by an unexpected message
  int pending = 0;                           // send: UCX requests not completed yet
  void* req = nullptr;                       // recv into buf: the UCX request (progress thread)
};

bool finished(const Op& o) {
  const Op& s = o.unexpected ? *o.unexpected : o;
  return s.state == Op::kDone || s.state == Op::kFailed;
}

class Engine;

// user_data of a UCX receive (progress thread only).
struct Rx {
  enum What { kHeader, kPayload, kHandler, kDiscard };
  Rx(What w, Engine* eng) : what(w), e(eng) {}
  const What what;
  Engine* const e;
  void* req = nullptr;
  int proc = -1;                   // sending process (from the tag)
  uint64_t stag = 0;               // header: sender tag
  size_t probed = 0;               // header: length announced by the probe
  ucp_tag_recv_info_t info{};      // recv_info.tag_info of the request (see post_tag_recv)
  bool complete = false;           // header: received (handled in order by probe())
  ucs_status_t status = UCS_OK;    // header: how its receive ended
  std::vector<uint8_t> bytes;      // header frame / discarded payload
  std::shared_ptr<Op> op;          // payload: the recv or unexpected message it fills
  WireHeader h;                    // handler: the header
  Tensor t;                        // handler: the payload
  Handler fn;
};

// user_data of a UCX send.
struct Tx {
  Engine* e = nullptr;
  std::shared_ptr<Op> op;
};

struct EpArg {
  Engine* e = nullptr;
  int proc = -1;
};

struct HandlerCall {
  Handler fn;
  WireHeader h;
  Tensor t;
};

class Engine {
 public:
  explicit Engine(TransportOptions o) : o_(std::move(o)) {
    TROUPE_CHECK(o_.nprocs >= 1 && (uint64_t)o_.nprocs <= kProcMask + 1)
        << "transport for " << o_.nprocs << " processes";
    TROUPE_CHECK(o_.process >= 0 && o_.process < o_.nprocs) << "process " << o_.process << " of " << o_.nprocs;
    TROUPE_CHECK(!o_.secret.empty()) << "the data plane needs the job secret";
    TROUPE_CHECK((int)o_.process_of_rank.size() == o_.limits.world)
        << "process_of_rank has " << o_.process_of_rank.size() << " entries for a world of " << o_.limits.world;
    for (size_t r = 0; r < o_.process_of_rank.size(); ++r)
      TROUPE_CHECK(o_.process_of_rank[r] >= 0 && o_.process_of_rank[r] < o_.nprocs)
          << "rank " << r << " placed on process " << o_.process_of_rank[r] << " of " << o_.nprocs;
    failed_.assign(o_.nprocs, "");

    ucp_config_t* cfg = nullptr;
    UCS_CHECK(ucp_config_read(nullptr, nullptr, &cfg)) << "reading the UCX configuration (UCX_* variables)";
    if (const char* env = std::getenv("UCX_NET_DEVICES"); !o_.net_devices.empty() && !(env && *env)) {
      if (const ucs_status_t ms = ucp_config_modify(cfg, "NET_DEVICES", o_.net_devices.c_str()); ms != UCS_OK) {
        ucp_config_release(cfg);
        UCS_CHECK(ms) << "restricting the data plane to network device(s) " << o_.net_devices;
      }
    }
    ucp_params_t pp{};
    pp.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    pp.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    pp.estimated_num_eps = (size_t)o_.nprocs;
    pp.mt_workers_shared = 0;
    const ucs_status_t st = ucp_init(&pp, cfg, &ctx_);
    ucp_config_release(cfg);
    UCS_CHECK(st) << "creating the ucp context of process " << o_.process;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // the progress thread, or a waiting caller, holding token_
    if (const ucs_status_t ws = ucp_worker_create(ctx_, &wp, &worker_); ws != UCS_OK) {
      ucp_cleanup(ctx_);
      UCS_CHECK(ws) << "creating the ucp worker of process " << o_.process;
    }
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    if (const ucs_status_t as = ucp_worker_get_address(worker_, &addr, &len); as != UCS_OK) {
      ucp_worker_destroy(worker_);
      ucp_cleanup(ctx_);
      UCS_CHECK(as) << "reading the worker address of process " << o_.process;
    }
    address_.assign((const uint8_t*)addr, (const uint8_t*)addr + len);
    ucp_worker_release_address(worker_, addr);
    if (int fd = -1; ucp_worker_get_efd(worker_, &fd) == UCS_OK) {
      efd_ = fd;
    } else {
      spdlog::warn("data plane: the UCX worker has no event fd; the progress thread polls with short sleeps");
    }
    eps_.assign(o_.nprocs, nullptr);
    for (int p = 0; p < o_.nprocs; ++p) ep_args_.push_back(std::make_unique<EpArg>(EpArg{this, p}));
    thread_ = std::thread([this] { loop(); });
  }

  ~Engine() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake();
    thread_.join();
    ucp_worker_destroy(worker_);
    ucp_cleanup(ctx_);
    // contexts of requests UCX never completed (header receives live in hdr_q_ until handled)
    for (Rx* rx : rx_live_)
      if (rx->what != Rx::kHeader) delete rx;
    for (Rx* rx : hdr_q_) delete rx;
    for (Tx* tx : tx_live_) delete tx;
  }

  const std::vector<uint8_t>& address() const { return address_; }
  const TransportOptions& options() const { return o_; }
  uint64_t rejected() const { return rejected_.load(); }
  int proc_of(int rank) const { return o_.process_of_rank.at(rank); }

  void connect(const std::vector<std::vector<uint8_t>>& addresses) {
    TROUPE_CHECK((int)addresses.size() == o_.nprocs)
        << "connect: " << addresses.size() << " addresses for " << o_.nprocs << " processes";
    for (int p = 0; p < o_.nprocs; ++p)
      TROUPE_CHECK(p == o_.process || !addresses[p].empty()) << "connect: empty address for process " << p;
    run_on_progress([this, addresses] {
      for (int p = 0; p < o_.nprocs; ++p) {
        if (p == o_.process) continue;
        TROUPE_CHECK(eps_[p] == nullptr) << "connect called twice (process " << p << " already connected)";
        ucp_ep_params_t ep{};
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = (const ucp_address_t*)addresses[p].data();
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = &Engine::on_ep_error;
        ep.err_handler.arg = ep_args_[p].get();
        UCS_CHECK(ucp_ep_create(worker_, &ep, &eps_[p]))
            << "process " << o_.process << " creating its endpoint to process " << p;
      }
    }, 30.0, "connect");
  }

  // Register before peers may send messages of `kind`: one that arrived earlier stays
  // queued for recv().
  void on_arrival(uint8_t kind, Handler fn) {
    std::lock_guard<std::mutex> lk(mu_);
    if (fn)
      handlers_[kind] = std::move(fn);
    else
      handlers_.erase(kind);
  }

  void abort(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_) return;
      aborted_ = true;
      abort_reason_ = reason;
      cmds_.push_back([this] { close_all(/*force=*/true); });
    }
    cv_.notify_all();
    wake();
  }

  // ---- operations (any thread) ----

  // Starts sending h + payload. A destination in this process is delivered (copied) at once.
  std::shared_ptr<Op> post_send(const WireHeader& h, const void* payload) {
    TROUPE_CHECK(h.source >= 0 && h.source < o_.limits.world && h.destination >= 0 && h.destination < o_.limits.world)
        << "send of " << ident(h) << ": rank " << h.source << " -> " << h.destination << " outside a world of "
        << o_.limits.world;
    TROUPE_CHECK(proc_of(h.source) == o_.process)
        << "send of " << ident(h) << ": source rank " << h.source << " lives in process " << proc_of(h.source)
        << ", not in this process " << o_.process;
    TROUPE_CHECK(h.bytes == 0 || payload != nullptr) << "send of " << ident(h) << ": no payload";
    auto op = std::make_shared<Op>();
    op->is_send = true;
    op->h = h;
    op->peer = proc_of(h.destination);
    op->buf = const_cast<void*>(payload);
    if (op->peer == o_.process) {
      deliver_local(h, payload);
      op->state = Op::kDone;
      return op;
    }
    op->frame = encode_header(h, o_.secret);  // HMAC on the caller's thread, not the progress thread
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_) throw Error(abort_reason_);
    }
    // Nobody is calling UCX and no command waits (sends stay in program order): post it
    // from this thread, without waking the progress thread.
    bool direct = false;
    if (token_.try_lock()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        direct = cmds_.empty();
      }
      if (!direct) token_.unlock();
    }
    if (direct) {
      try {
        issue_send(op);
      } catch (...) {
        token_.unlock();
        throw;
      }
      token_.unlock();
      bool pending;
      {
        std::lock_guard<std::mutex> lk(mu_);
        pending = !finished(*op);
      }
      if (pending) wake();  // UCX needs progress to finish it: the progress thread takes over
      return op;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      cmds_.push_back([this, op] { issue_send(op); });
    }
    wake();
    return op;
  }

  // Starts receiving the message with want's identity into buf (want.bytes bytes).
  std::shared_ptr<Op> post_recv(const WireHeader& want, void* buf) {
    TROUPE_CHECK(want.source >= 0 && want.source < o_.limits.world && want.destination >= 0 &&
                 want.destination < o_.limits.world)
        << "recv of " << ident(want) << ": rank " << want.source << " -> " << want.destination
        << " outside a world of " << o_.limits.world;
    TROUPE_CHECK(proc_of(want.destination) == o_.process)
        << "recv of " << ident(want) << ": destination rank " << want.destination << " lives in process "
        << proc_of(want.destination) << ", not in this process " << o_.process;
    TROUPE_CHECK(want.bytes == 0 || buf != nullptr) << "recv of " << ident(want) << ": no buffer";
    auto op = std::make_shared<Op>();
    op->h = want;
    op->peer = proc_of(want.source);
    op->buf = buf;
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) throw Error(abort_reason_);
    const Key k = key_of(want);
    if (std::shared_ptr<Op> u = take_first(arrived_, k)) {
      if (!same_layout(u->h, want)) {
        op->state = Op::kFailed;
        op->error = mismatch(u->h, want);
      } else {
        op->unexpected = std::move(u);
      }
      return op;
    }
    posted_[k].push_back(op);
    return op;
  }

  // Waits for every op until the deadline. On success copies unexpected payloads into their
  // recv buffers. Otherwise releases every op (no buffer stays lent to UCX, see the file
  // comment) and throws Error("<what>: <reason>"), or Error(reason) after abort().
  // rank_name(r) names global rank r in messages.
  void wait(const std::vector<std::shared_ptr<Op>>& ops, Clock::time_point deadline, double timeout_s,
            const std::string& what, const std::function<std::string(int)>& rank_name) {
    std::unique_lock<std::mutex> lk(mu_);
    std::string err;
    bool timed_out = false;
    progress_while_waiting(lk, deadline, [&] {
      if (aborted_) return true;
      for (const auto& op : ops)
        if (!finished(*op) && !lost(*op)) return false;
      return true;
    });
    for (const auto& op : ops) {
      cv_.wait_until(lk, deadline, [&] { return finished(*op) || aborted_ || lost(*op); });
      if (finished(*op)) {
        const Op& s = op->unexpected ? *op->unexpected : *op;
        if (s.state == Op::kFailed) {
          err = op->error.empty() ? s.error : op->error;
          if (err.empty()) err = "failed";
          break;
        }
        continue;
      }
      if (aborted_) {
        err = abort_reason_;
      } else if (lost(*op)) {
        err = "process " + std::to_string(op->peer) + " (" + rank_name(op->is_send ? op->h.destination : op->h.source) +
              ") failed: " + failed_[op->peer];
      } else {
        timed_out = true;
      }
      break;
    }
    if (err.empty() && !timed_out) {
      for (const auto& op : ops) {
        if (!op->unexpected) continue;
        if (op->h.bytes) std::memcpy(op->buf, op->unexpected->staging.get(), op->h.bytes);
        op->unexpected.reset();
        op->state = Op::kDone;
      }
      return;
    }
    if (timed_out) {
      // name every peer still missing, not only the first
      std::vector<std::string> from, to;
      for (const auto& op : ops) {
        if (finished(*op)) continue;
        const std::string n = rank_name(op->is_send ? op->h.destination : op->h.source);
        auto& v = op->is_send ? to : from;
        if (std::find(v.begin(), v.end(), n) == v.end()) v.push_back(n);
      }
      auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
        return s;
      };
      if (!from.empty()) err = "nothing from " + join(from) + " within " + secs(timeout_s) + " s";
      if (!to.empty())
        err += (err.empty() ? "" : "; ") + std::string("send to ") + join(to) + " not completed within " +
               secs(timeout_s) + " s (the receiving process is not progressing)";
      err += hint(ops);
    }
    const bool aborted = aborted_;
    const std::string reason = abort_reason_;
    for (const auto& op : ops) release(op, lk);
    if (aborted) throw Error(reason);
    throw Error(what + ": " + err);
  }

 private:
  // ---- helpers for callers ----

  std::string mismatch(const WireHeader& got, const WireHeader& want) const {
    return "rank " + std::to_string(got.source) + " sent " + layout(got) + " but rank " +
           std::to_string(want.destination) + " expects " + layout(want);
  }

  // After a timeout: messages that did arrive from the missing peers for the same call but
  // under another chunk (another collective, another phase) — usually a rank that called a
  // different operation.
  std::string hint(const std::vector<std::shared_ptr<Op>>& ops) const {
    std::string s;
    for (const auto& op : ops) {
      if (op->is_send || finished(*op)) continue;
      for (const auto& [k, q] : arrived_) {
        const WireHeader& h = q.front()->h;
        if (h.kind == op->h.kind && h.source == op->h.source && h.destination == op->h.destination &&
            h.step == op->h.step && h.microbatch == op->h.microbatch && h.chunk != op->h.chunk) {
          s += "; rank " + std::to_string(h.source) + " sent chunk " + std::to_string(h.chunk) + " " + layout(h) +
               " instead of chunk " + std::to_string(op->h.chunk);
          break;
        }
      }
    }
    return s;
  }

  // The op's peer process failed and the op cannot complete any more: a send, or a recv
  // whose header has not arrived (a payload already arriving completes or fails by itself).
  bool lost(const Op& op) const {
    return !failed_[op.peer].empty() && !op.unexpected && (op.is_send || op.state == Op::kQueued);
  }

  // Makes sure no buffer of `op` is lent to UCX any more, then marks it failed (mu_ held).
  void release(const std::shared_ptr<Op>& op, std::unique_lock<std::mutex>& lk) {
    if (op->unexpected) {  // the payload lands in the unexpected message's own buffer
      op->unexpected.reset();
      op->state = Op::kFailed;
      return;
    }
    if (op->state == Op::kQueued) {
      if (!op->is_send) {
        auto it = posted_.find(key_of(op->h));
        if (it != posted_.end()) {
          auto& q = it->second;
          q.erase(std::remove(q.begin(), q.end(), op), q.end());
          if (q.empty()) posted_.erase(it);
        }
      }
      op->state = Op::kFailed;  // a queued send is skipped by issue_send
      return;
    }
    if (op->state != Op::kActive) return;
    cmds_.push_back([this, op] { cancel(op); });
    wake();
    if (!cv_.wait_for(lk, std::chrono::duration<double>(kGraceS), [&] { return finished(*op); }))
      spdlog::error("data plane: UCX did not release the buffer of a cancelled {} of {} within {} s",
                    op->is_send ? "send" : "recv", ident(op->h), kGraceS);
  }

  // Runs fn on the progress thread and waits for it (errors are rethrown here).
  void run_on_progress(std::function<void()> fn, double timeout_s, const std::string& what) {
    struct State {
      bool done = false;
      std::string error;
    };
    auto s = std::make_shared<State>();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_) throw Error(abort_reason_);
      cmds_.push_back([this, s, fn = std::move(fn)] {
        std::string err;
        try {
          fn();
        } catch (const std::exception& e) {
          err = e.what();
        }
        std::lock_guard<std::mutex> lk(mu_);
        s->done = true;
        s->error = err;
        cv_.notify_all();
      });
    }
    wake();
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_until(lk, deadline_in(timeout_s), [&] { return s->done; }))
      throw Error(what + ": the progress thread did not respond within " + secs(timeout_s) + " s");
    if (!s->error.empty()) throw Error(s->error);
  }

  void wake() {
    // thread-safe in any thread mode (ucp.h); a no-op without wakeup support
    if (efd_ >= 0) ucp_worker_signal(worker_);
    cv_.notify_all();
  }

  // A message to a rank of this process: same matching as a remote one, by copy.
  void deliver_local(const WireHeader& h, const void* payload) {
    std::unique_lock<std::mutex> lk(mu_);
    if (aborted_) throw Error(abort_reason_);
    auto hit = handlers_.find(h.kind);
    if (hit != handlers_.end()) {
      TROUPE_CHECK(h.dtype == DType::f32) << "send of " << ident(h) << ": arrival handlers take f32 tensors, not "
                                          << dtype_name(h.dtype);
      Handler fn = hit->second;
      lk.unlock();
      Tensor t(h.shape);
      TROUPE_CHECK(t.nbytes() == h.bytes) << "send of " << ident(h) << ": " << h.bytes << " bytes for shape "
                                          << shape_str(h.shape);
      if (h.bytes) std::memcpy(t.data(), payload, h.bytes);
      lk.lock();
      calls_.push_back(HandlerCall{std::move(fn), h, std::move(t)});  // called on the progress thread
      lk.unlock();
      wake();
      return;
    }
    const Key k = key_of(h);
    if (std::shared_ptr<Op> r = take_first(posted_, k)) {
      if (same_layout(r->h, h)) {
        if (h.bytes) std::memcpy(r->buf, payload, h.bytes);
        r->state = Op::kDone;
      } else {
        r->state = Op::kFailed;
        r->error = mismatch(h, r->h);
      }
      cv_.notify_all();
      return;
    }
    auto u = std::make_shared<Op>();
    u->h = h;
    u->peer = o_.process;
    if (h.bytes) {
      u->staging.reset(new uint8_t[h.bytes]);
      std::memcpy(u->staging.get(), payload, h.bytes);
    }
    u->state = Op::kDone;
    arrived_[k].push_back(std::move(u));
    cv_.notify_all();
  }

  // ---- progress thread ----

  // One round of the data plane: queued commands, (with run_calls) arrival handlers, then
  // UCX progress, header probes and failed endpoints. The caller holds token_. Returns
  // whether anything happened. A waiting caller runs it with run_calls = false (handlers
  // stay on the progress thread, which is woken for them).
  bool step(bool run_calls, bool* stop_out) {
    std::deque<std::function<void()>> cmds;
    std::vector<HandlerCall> calls;
    bool stop;
    {
      std::lock_guard<std::mutex> lk(mu_);
      cmds.swap(cmds_);
      if (run_calls) calls.swap(calls_);
      stop = stop_;
    }
    for (auto& c : cmds) {
      try {
        c();
      } catch (const std::exception& e) {
        spdlog::error("data plane: {}", e.what());
      }
    }
    for (auto& c : calls) {
      try {
        c.fn(c.h, std::move(c.t));
      } catch (const std::exception& e) {
        spdlog::error("data plane: the arrival handler of {} from rank {} threw: {}", ident(c.h), c.h.source,
                      e.what());
      }
    }
    if (stop_out) *stop_out = stop;
    if (stop) return true;
    bool busy = !cmds.empty() || !calls.empty();
    while (ucp_worker_progress(worker_) != 0) busy = true;
    busy = probe() || busy;
    busy = close_failed() || busy;
    return busy;
  }

  void loop() {
    unsigned sleep_us = 50;
    auto last_busy = Clock::now();
    for (;;) {
      std::unique_lock<std::mutex> tok(token_);
      bool stop = false;
      bool busy = step(true, &stop);
      if (stop) break;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!cmds_.empty() || !calls_.empty() || stop_) continue;
      }
      const auto now = Clock::now();
      if (busy) {
        sleep_us = 50;
        last_busy = now;
        continue;
      }
      // a transfer in flight: keep progressing for up to kSpinS after the last event before
      // sleeping (see kSpinS); an idle worker always sleeps
      if ((!tx_live_.empty() || payloads_live_ > 0) && now - last_busy < std::chrono::duration<double>(kSpinS))
        continue;
      if (efd_ >= 0) {
        const ucs_status_t st = ucp_worker_arm(worker_);
        if (st == UCS_ERR_BUSY) continue;  // events pending: progress again
        if (st == UCS_OK) {
          tok.unlock();  // a waiting caller may progress the worker while this thread sleeps
          pollfd p{efd_.load(), POLLIN, 0};
          ::poll(&p, 1, kPollMs);
          continue;
        }
        spdlog::warn("data plane: ucp_worker_arm failed ({}); polling with short sleeps", ucs_status_string(st));
        efd_ = -1;
      }
      tok.unlock();
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::microseconds(sleep_us), [&] { return !cmds_.empty() || !calls_.empty() || stop_; });
      sleep_us = std::min(sleep_us * 2, 1000u);
    }
    std::lock_guard<std::mutex> tok(token_);
    shutdown();
  }

  // A caller's wait, before it sleeps on cv_: for up to kWaitSpinS it progresses the worker
  // itself whenever the progress thread is not (no thread handoff per message, as
  // ucx_perftest's busy polling), until done() holds. lk (on mu_) is held on entry and exit.
  template <class Done>
  void progress_while_waiting(std::unique_lock<std::mutex>& lk, Clock::time_point deadline, Done&& done) {
    const auto until = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                             std::chrono::duration<double>(kWaitSpinS)));
    while (!done() && Clock::now() < until) {
      lk.unlock();
      bool handlers = false;
      bool busy = false;
      if (token_.try_lock()) {
        busy = step(false, nullptr);
        token_.unlock();
        std::lock_guard<std::mutex> g(mu_);
        handlers = !calls_.empty() || !cmds_.empty();
      }
      if (!busy) std::this_thread::yield();  // let the peer (on a shared core) answer
      if (handlers) wake();  // arrival handlers run on the progress thread
      lk.lock();
    }
  }

  static void on_send(void* req, ucs_status_t st, void* ud) {
    auto* tx = (Tx*)ud;
    tx->e->send_done(tx, req, st);
  }

  static void on_recv(void* req, ucs_status_t st, const ucp_tag_recv_info_t* info, void* ud) {
    auto* rx = (Rx*)ud;
    rx->e->recv_done(rx, req, st, info ? info->length : 0);
  }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* a = (EpArg*)arg;
    a->e->peer_failed(a->proc, std::string("UCX reports ") + ucs_status_string(st));
  }

  void issue_send(const std::shared_ptr<Op>& op) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (op->state != Op::kQueued) return;  // abandoned by its waiter
      std::string why;
      if (aborted_)
        why = abort_reason_;
      else if (!failed_[op->peer].empty())
        why = "process " + std::to_string(op->peer) + " failed: " + failed_[op->peer];
      else if (!eps_[op->peer])
        why = "process " + std::to_string(op->peer) + " is not connected (call connect() first)";
      if (!why.empty()) {
        op->state = Op::kFailed;
        op->error = why;
        cv_.notify_all();
        return;
      }
      op->state = Op::kActive;
      op->pending = op->h.bytes ? 2 : 1;
    }
    const uint64_t tag = ((uint64_t)o_.process << kProcShift) | (next_seq_++ & kSeqMask);
    post_tag_send(op, op->frame.data(), op->frame.size(), tag);
    if (op->h.bytes) post_tag_send(op, op->buf, op->h.bytes, tag | kDataBit);
  }

  void post_tag_send(const std::shared_ptr<Op>& op, const void* data, size_t n, uint64_t tag) {
    auto* tx = new Tx{this, op};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &Engine::on_send;
    p.user_data = tx;
    tx_live_.insert(tx);
    void* r = ucp_tag_send_nbx(eps_[op->peer], data, n, tag, &p);
    if (r == nullptr)
      send_done(tx, nullptr, UCS_OK);
    else if (UCS_PTR_IS_ERR(r))
      send_done(tx, nullptr, UCS_PTR_STATUS(r));
  }

  void send_done(Tx* tx, void* req, ucs_status_t st) {
    if (req) ucp_request_free(req);
    tx_live_.erase(tx);
    std::shared_ptr<Op> op = std::move(tx->op);
    delete tx;
    std::lock_guard<std::mutex> lk(mu_);
    if (st != UCS_OK && op->error.empty())
      op->error = "UCX send to process " + std::to_string(op->peer) + ": " + ucs_status_string(st);
    if (--op->pending == 0) {
      op->state = op->error.empty() ? Op::kDone : Op::kFailed;
      cv_.notify_all();
    }
  }

  // Posts a receive of n bytes with exactly `tag` into buf. Completion always goes through
  // the callback: UCX 1.13 leaves recv_info.tag_info's length at 0 when a receive completes
  // at once, and the callback's info carries the length actually received.
  void post_tag_recv(Rx* rx, void* buf, size_t n, uint64_t tag) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &Engine::on_recv;
    p.user_data = rx;
    p.recv_info.tag_info = &rx->info;
    rx_live_.insert(rx);
    ++payloads_live_;
    void* r = ucp_tag_recv_nbx(worker_, buf, n, tag, ~0ull, &p);
    if (r == nullptr)
      recv_done(rx, nullptr, UCS_OK, rx->info.length);
    else if (UCS_PTR_IS_ERR(r))
      recv_done(rx, nullptr, UCS_PTR_STATUS(r), 0);
    else
      set_req(rx, r);
  }

  void set_req(Rx* rx, void* r) {
    rx->req = r;
    if (rx->op && rx->what == Rx::kPayload) rx->op->req = r;
  }

  void recv_done(Rx* rx, void* req, ucs_status_t st, size_t length) {
    if (req) ucp_request_free(req);
    rx_live_.erase(rx);
    rx->req = nullptr;
    if (rx->what != Rx::kHeader) --payloads_live_;
    switch (rx->what) {
      case Rx::kHeader:  // handled in arrival order by probe(), with the probed length
        rx->complete = true;
        rx->status = st;
        return;
      case Rx::kPayload: {
        std::lock_guard<std::mutex> lk(mu_);
        Op& op = *rx->op;
        op.req = nullptr;
        if (st == UCS_OK && length == op.h.bytes) {
          op.state = Op::kDone;
        } else {
          op.state = Op::kFailed;
          op.error = "payload of " + ident(op.h) + " from rank " + std::to_string(op.h.source) + ": " +
                     (st == UCS_OK ? std::to_string(length) + " bytes instead of " + std::to_string(op.h.bytes)
                                   : std::string(ucs_status_string(st)));
        }
        cv_.notify_all();
        break;
      }
      case Rx::kHandler:
        if (st == UCS_OK && length == rx->h.bytes) {
          std::lock_guard<std::mutex> lk(mu_);
          calls_.push_back(HandlerCall{std::move(rx->fn), rx->h, std::move(rx->t)});
        } else {
          spdlog::warn("data plane: payload of {} from rank {} lost: {}", ident(rx->h), rx->h.source,
                       st == UCS_OK ? "wrong length" : ucs_status_string(st));
        }
        break;
      case Rx::kDiscard:
        break;
    }
    delete rx;
  }

  // Receives every header frame UCX holds, then handles the completed ones in order.
  bool probe() {
    bool any = false;
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h m = ucp_tag_probe_nb(worker_, 0, kDataBit, 1, &info);
      if (!m) break;
      any = true;
      auto* rx = new Rx(Rx::kHeader, this);
      rx->stag = info.sender_tag;
      rx->probed = info.length;
      rx->bytes.resize(kMaxFrame);  // a longer frame completes truncated and is dropped
      hdr_q_.push_back(rx);
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
      p.cb.recv = &Engine::on_recv;
      p.user_data = rx;
      p.recv_info.tag_info = &rx->info;
      rx_live_.insert(rx);
      void* r = ucp_tag_msg_recv_nbx(worker_, rx->bytes.data(), kMaxFrame, m, &p);
      if (r == nullptr)
        recv_done(rx, nullptr, UCS_OK, rx->info.length);
      else if (UCS_PTR_IS_ERR(r))
        recv_done(rx, nullptr, UCS_PTR_STATUS(r), 0);
      else
        rx->req = r;
    }
    while (!hdr_q_.empty() && hdr_q_.front()->complete) {
      std::unique_ptr<Rx> rx(hdr_q_.front());
      hdr_q_.pop_front();
      any = true;
      const int proc = (int)((rx->stag >> kProcShift) & kProcMask);
      if (rx->probed > kMaxFrame || rx->status != UCS_OK) {
        ++rejected_;
        spdlog::warn("data plane: dropped a header frame of {} bytes claiming process {}: {}", rx->probed, proc,
                     rx->probed > kMaxFrame ? "longer than " + std::to_string(kMaxFrame) + " bytes"
                                            : std::string(ucs_status_string(rx->status)));
        continue;
      }
      // the probe announced the length (ucp_tag_msg_recv_nbx reports none when it completes at once)
      on_header(rx->stag, rx->bytes.data(), rx->probed);
    }
    return any;
  }

  void on_header(uint64_t stag, const uint8_t* frame, size_t n) {
    const int proc = (int)((stag >> kProcShift) & kProcMask);
    WireHeader h;
    try {
      h = decode_header(frame, n, o_.secret, o_.limits);
    } catch (const ProtocolError& e) {
      ++rejected_;
      spdlog::warn("data plane: process {} dropped a header claiming process {}: {}", o_.process, proc, e.what());
      return;
    }
    // authentic, but it must also be routed right: from a rank of the process in the tag,
    // to a rank of this one. The payload of a misrouted header is left unclaimed.
    if (proc >= o_.nprocs || proc == o_.process || proc_of(h.source) != proc || proc_of(h.destination) != o_.process) {
      spdlog::warn("data plane: process {} dropped {} from rank {} (process {}) to rank {} (process {}) tagged as from "
                   "process {}",
                   o_.process, ident(h), h.source, proc_of(h.source), h.destination, proc_of(h.destination), proc);
      return;
    }
    const uint64_t dtag = stag | kDataBit;
    std::unique_lock<std::mutex> lk(mu_);
    auto hit = handlers_.find(h.kind);
    if (hit != handlers_.end()) {
      Handler fn = hit->second;
      lk.unlock();
      if (h.dtype != DType::f32) {
        spdlog::warn("data plane: {} from rank {} is {}, its handler takes f32; dropped", ident(h), h.source,
                     dtype_name(h.dtype));
        discard(dtag, h.bytes, proc);
        return;
      }
      auto* rx = new Rx(Rx::kHandler, this);
      rx->proc = proc;
      rx->h = h;
      rx->t = Tensor(h.shape);
      rx->fn = std::move(fn);
      if (h.bytes == 0) {
        recv_done(rx, nullptr, UCS_OK, 0);
        return;
      }
      post_tag_recv(rx, rx->t.data(), h.bytes, dtag);
      return;
    }
    const Key k = key_of(h);
    std::shared_ptr<Op> target;
    void* into = nullptr;
    if (std::shared_ptr<Op> r = take_first(posted_, k)) {
      if (same_layout(r->h, h)) {
        target = r;  // zero-copy into the waiting recv's buffer
        into = r->buf;
        r->state = Op::kActive;
      } else {
        r->state = Op::kFailed;
        r->error = mismatch(h, r->h);
        cv_.notify_all();
        lk.unlock();
        discard(dtag, h.bytes, proc);
        return;
      }
    } else {
      auto u = std::make_shared<Op>();
      u->h = h;
      u->peer = proc;
      u->state = Op::kActive;
      if (h.bytes) u->staging.reset(new uint8_t[h.bytes]);
      into = u->staging.get();
      arrived_[k].push_back(u);
      target = std::move(u);
    }
    if (h.bytes == 0) {
      target->state = Op::kDone;
      cv_.notify_all();
      return;
    }
    lk.unlock();
    auto* rx = new Rx(Rx::kPayload, this);
    rx->proc = proc;
    rx->op = target;
    post_tag_recv(rx, into, h.bytes, dtag);
  }

  // Receives and drops a payload nobody takes (bytes is authenticated and within limits).
  void discard(uint64_t dtag, uint64_t bytes, int proc) {
    if (!bytes) return;
    auto* rx = new Rx(Rx::kDiscard, this);
    rx->proc = proc;
    rx->bytes.resize(bytes);
    post_tag_recv(rx, rx->bytes.data(), bytes, dtag);
  }

  // A recv or send whose waiter gives up while its buffer is lent to UCX.
  void cancel(const std::shared_ptr<Op>& op) {
    if (finished(*op)) return;
    if (!op->is_send) {
      if (op->req) ucp_request_cancel(worker_, op->req);  // completes with UCS_ERR_CANCELED unless already matched
      return;
    }
    // UCX cannot cancel a send: the endpoint is closed, which fails its requests.
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (failed_[op->peer].empty()) failed_[op->peer] = "a send to it was abandoned (timeout or abort)";
    }
    close_ep(op->peer, true);
  }

  // From UCX's endpoint error callback: handled in close_failed(), after probe() has taken
  // the headers that arrived before the failure (a peer that sent its last messages and
  // exited must not fail the receives of those messages).
  void peer_failed(int proc, const std::string& why) { to_close_.push_back({proc, why}); }

  bool close_failed() {
    if (to_close_.empty()) return false;
    std::vector<int> procs;
    for (auto& [p, why] : to_close_) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (failed_[p].empty()) failed_[p] = why;
        cv_.notify_all();
      }
      bool ending;
      {
        std::lock_guard<std::mutex> lk(mu_);
        ending = aborted_;
      }
      // after abort() (the job ended or failed) peers leaving is expected: no warning
      if (!ending) spdlog::warn("data plane: process {} lost process {}: {}", o_.process, p, why);
      procs.push_back(p);
      close_ep(p, true);
    }
    to_close_.clear();
    // receives from a failed process may never complete: cancel those not matched yet
    std::vector<Rx*> doomed;
    for (Rx* rx : rx_live_)
      if (rx->what != Rx::kHeader && rx->req && std::find(procs.begin(), procs.end(), rx->proc) != procs.end())
        doomed.push_back(rx);
    for (Rx* rx : doomed)
      if (rx_live_.count(rx)) ucp_request_cancel(worker_, rx->req);
    return true;
  }

  void close_ep(int p, bool force) {
    ucp_ep_h ep = eps_[p];
    if (!ep) return;
    eps_[p] = nullptr;
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* r = ucp_ep_close_nbx(ep, &cp);
    if (r && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
  }

  void close_all(bool force) {
    for (int p = 0; p < o_.nprocs; ++p) close_ep(p, force);
    std::vector<Rx*> live(rx_live_.begin(), rx_live_.end());
    for (Rx* rx : live)
      if (rx->what != Rx::kHeader && rx_live_.count(rx) && rx->req) ucp_request_cancel(worker_, rx->req);
  }

  void shutdown() {
    bool force;
    {
      std::lock_guard<std::mutex> lk(mu_);
      force = aborted_;
      for (auto& [k, q] : posted_)
        for (auto& op : q) {
          op->state = Op::kFailed;
          op->error = "the transport is shutting down";
        }
      posted_.clear();
      cv_.notify_all();
    }
    close_all(force);
    const auto deadline = deadline_in(kCloseS);
    auto pending = [&] {
      closing_.erase(std::remove_if(closing_.begin(), closing_.end(),
                                    [](void* r) {
                                      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
                                      ucp_request_free(r);
                                      return true;
                                    }),
                     closing_.end());
      return !closing_.empty();
    };
    while (pending() && Clock::now() < deadline)
      if (ucp_worker_progress(worker_) == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    for (void* r : closing_) ucp_request_free(r);  // released by UCX when it completes
    if (!closing_.empty())
      spdlog::warn("data plane: process {}: {} endpoint(s) did not close within {} s", o_.process, closing_.size(),
                   kCloseS);
    closing_.clear();
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }

  const TransportOptions o_;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::atomic<int> efd_{-1};  // the worker's event fd; -1: no wakeup support (short sleeps instead)
  std::vector<uint8_t> address_;
  std::thread thread_;

  // Held by whichever thread calls UCX: the progress thread, or a caller progressing the
  // worker while it waits (progress_while_waiting). The fields below are that thread's.
  std::mutex token_;
  std::vector<ucp_ep_h> eps_;
  std::vector<std::unique_ptr<EpArg>> ep_args_;
  uint64_t next_seq_ = 0;
  std::deque<Rx*> hdr_q_;                // header frames being received, in arrival order
  std::unordered_set<Rx*> rx_live_;      // receives posted to UCX
  std::unordered_set<Tx*> tx_live_;      // sends posted to UCX
  int payloads_live_ = 0;                // payload receives posted to UCX
  std::vector<std::pair<int, std::string>> to_close_;  // processes whose endpoint failed, and why
  std::vector<void*> closing_;           // endpoint close requests

  // guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> cmds_;
  std::vector<HandlerCall> calls_;
  bool stop_ = false, aborted_ = false;
  std::string abort_reason_;
  std::vector<std::string> failed_;  // per process: why it failed ("" = fine)
  std::map<Key, std::deque<std::shared_ptr<Op>>> posted_;   // recvs waiting for their header
  std::map<Key, std::deque<std::shared_ptr<Op>>> arrived_;  // messages waiting for their recv
  std::map<uint8_t, Handler> handlers_;

  std::atomic<uint64_t> rejected_{0};
};

// The communicators reach the engine behind a transport through this table (the transport's
// Impl is private to it).
std::mutex g_engines_mu;
std::unordered_map<const UcxTransport*, std::weak_ptr<Engine>> g_engines;

}  // namespace

struct UcxTransport::Impl {
  std::shared_ptr<Engine> engine;
};

UcxTransport::UcxTransport(TransportOptions o) : impl_(std::make_unique<Impl>()) {
  impl_->engine = std::make_shared<Engine>(std::move(o));
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

void UcxTransport::connect(const std::vector<std::vector<uint8_t>>& addresses) { impl_->engine->connect(addresses); }

void UcxTransport::send(const WireHeader& h, const void* payload, double timeout_s) {
  const auto deadline = deadline_in(timeout_s);
  Engine& e = *impl_->engine;
  auto op = e.post_send(h, payload);
  e.wait({op}, deadline, timeout_s,
         "send of " + ident(h) + " from rank " + std::to_string(h.source) + " to rank " + std::to_string(h.destination),
         [](int r) { return "rank " + std::to_string(r); });
}

void UcxTransport::recv(const WireHeader& want, void* buf, double timeout_s) {
  const auto deadline = deadline_in(timeout_s);
  Engine& e = *impl_->engine;
  auto op = e.post_recv(want, buf);
  e.wait({op}, deadline, timeout_s,
         "recv of " + ident(want) + " from rank " + std::to_string(want.source) + " at rank " +
             std::to_string(want.destination),
         [](int r) { return "rank " + std::to_string(r); });
}

void UcxTransport::on_arrival(uint8_t kind, std::function<void(const WireHeader&, Tensor)> handler) {
  impl_->engine->on_arrival(kind, std::move(handler));
}

void UcxTransport::abort(const std::string& reason) { impl_->engine->abort(reason); }
uint64_t UcxTransport::rejected() const { return impl_->engine->rejected(); }
int UcxTransport::process() const { return impl_->engine->options().process; }
int UcxTransport::nprocs() const { return impl_->engine->options().nprocs; }

// ---------------------------------------------------------------------------------------
// Communicator over the transport.
//
// Every collective call of a group has a sequence number s (the header's step) and the
// group's id (microbatch); chunk = operation << 4 | phase, so the messages of one call never
// match those of another call or of another operation. Payloads are fp32 with shape {n}, so
// ranks that disagree on a size get the transport's mismatch error naming both.
//   all_reduce      phase 0: reduce-scatter (group rank r owns slice r of ceil(count/n)
//                   elements, receives it from every rank and reduces in ascending rank
//                   order, its own input in its place); phase 1: all-gather of the slices.
//   reduce_scatter  one phase: rank r receives in[r*count ...] from every rank and reduces.
//   all_gather      one phase: everyone sends its input to everyone.
//   broadcast       one phase: the root sends to everyone.
//   barrier         one phase: an empty message from every rank to every rank.
// send/recv (point to point) use chunk = 2^30 | tag and step = number of earlier messages
// on (source, destination, tag), so they match in order and never collide with collectives.
// Per call, receives are posted before sends so payloads land in place when the peers are
// not ahead. The element-wise reduction is collectives/local.cpp's, so results are bitwise
// identical to the in-process backend.

namespace {

enum CollOp : int32_t { kAllReduceSum = 1, kAllReduceMax, kReduceScatterSum, kReduceScatterMax, kAllGather, kBroadcast, kBarrier };
constexpr int32_t kP2PChunk = 1 << 30;

class UcxComm : public Communicator {
 public:
  UcxComm(std::shared_ptr<UcxTransport> t, std::shared_ptr<Engine> e, std::vector<int> ranks, int me, int32_t id,
          std::string name)
      : t_(std::move(t)), e_(std::move(e)), ranks_(std::move(ranks)), me_(me), id_(id), name_(std::move(name)) {}

  int rank() const override { return me_; }
  int size() const override { return (int)ranks_.size(); }
  const std::string& name() const override { return name_; }

  void all_reduce(float* buf, size_t count, ReduceOp op, double timeout_s) override {
    Call c = begin("all_reduce", op == ReduceOp::sum ? kAllReduceSum : kAllReduceMax, timeout_s);
    const int n = size();
    if (n == 1) return;
    const size_t per = (count + n - 1) / n;
    auto lo = [&](int r) { return std::min(count, per * r); };
    auto len = [&](int r) { return std::min(count, lo(r) + per) - lo(r); };
    const size_t mine = len(me_);
    scratch_.resize((size_t)n * mine);
    std::vector<const float*> in(n);
    // phase 0: reduce-scatter
    std::vector<std::shared_ptr<Op>> ops;
    for (int r = 0; r < n; ++r) {
      if (r == me_) {
        in[r] = buf + lo(me_);
        continue;
      }
      in[r] = scratch_.data() + (size_t)r * mine;
      ops.push_back(e_->post_recv(header(c, 0, r, me_, mine), scratch_.data() + (size_t)r * mine));
    }
    for (int k = 1; k < n; ++k) {  // start with the next rank so not everyone sends to rank 0 first
      const int r = (me_ + k) % n;
      ops.push_back(e_->post_send(header(c, 0, me_, r, len(r)), buf + lo(r)));
    }
    wait(c, ops);
    // reduce into our own (unused) slot of scratch, then copy back over our input slice
    float* out = scratch_.data() + (size_t)me_ * mine;
    reduce_into(out, in, mine, op);
    if (mine) std::memcpy(buf + lo(me_), out, mine * sizeof(float));
    // phase 1: all-gather of the reduced slices
    ops.clear();
    for (int r = 0; r < n; ++r)
      if (r != me_) ops.push_back(e_->post_recv(header(c, 1, r, me_, len(r)), buf + lo(r)));
    for (int k = 1; k < n; ++k) ops.push_back(e_->post_send(header(c, 1, me_, (me_ + k) % n, mine), buf + lo(me_)));
    wait(c, ops);
  }

  void reduce_scatter(const float* in, float* out, size_t count, ReduceOp op, double timeout_s) override {
    Call c = begin("reduce_scatter", op == ReduceOp::sum ? kReduceScatterSum : kReduceScatterMax, timeout_s);
    const int n = size();
    scratch_.resize((size_t)n * count);
    std::vector<const float*> src(n);
    std::vector<std::shared_ptr<Op>> ops;
    for (int r = 0; r < n; ++r) {
      if (r == me_) {
        src[r] = in + (size_t)me_ * count;
        continue;
      }
      src[r] = scratch_.data() + (size_t)r * count;
      ops.push_back(e_->post_recv(header(c, 0, r, me_, count), scratch_.data() + (size_t)r * count));
    }
    for (int k = 1; k < n; ++k) {
      const int r = (me_ + k) % n;
      ops.push_back(e_->post_send(header(c, 0, me_, r, count), in + (size_t)r * count));
    }
    wait(c, ops);
    reduce_into(out, src, count, op);
  }

  void all_gather(const float* in, float* out, size_t count, double timeout_s) override {
    Call c = begin("all_gather", kAllGather, timeout_s);
    const int n = size();
    std::vector<std::shared_ptr<Op>> ops;
    for (int r = 0; r < n; ++r)
      if (r != me_) ops.push_back(e_->post_recv(header(c, 0, r, me_, count), out + (size_t)r * count));
    for (int k = 1; k < n; ++k) ops.push_back(e_->post_send(header(c, 0, me_, (me_ + k) % n, count), in));
    wait(c, ops);
    if (count && out + (size_t)me_ * count != in) std::memmove(out + (size_t)me_ * count, in, count * sizeof(float));
  }

  void broadcast(float* buf, size_t count, int root, double timeout_s) override {
    TROUPE_CHECK(root >= 0 && root < size()) << "broadcast root " << root << " outside " << name_;
    Call c = begin("broadcast", kBroadcast, timeout_s);
    std::vector<std::shared_ptr<Op>> ops;
    if (me_ == root) {
      for (int k = 1; k < size(); ++k) ops.push_back(e_->post_send(header(c, 0, me_, (me_ + k) % size(), count), buf));
    } else {
      ops.push_back(e_->post_recv(header(c, 0, root, me_, count), buf));
    }
    wait(c, ops);
  }

  void barrier(double timeout_s) override {
    Call c = begin("barrier", kBarrier, timeout_s);
    std::vector<std::shared_ptr<Op>> ops;
    for (int r = 0; r < size(); ++r)
      if (r != me_) ops.push_back(e_->post_recv(header(c, 0, r, me_, 0), nullptr));
    for (int k = 1; k < size(); ++k) ops.push_back(e_->post_send(header(c, 0, me_, (me_ + k) % size(), 0), nullptr));
    wait(c, ops);
  }

  void send(const float* buf, size_t count, int peer, int tag, double timeout_s) override {
    TROUPE_CHECK(peer >= 0 && peer < size() && peer != me_) << "send to rank " << peer << " in " << name_;
    TROUPE_CHECK(tag >= 0 && tag < kP2PChunk) << "send on " << name_ << ": tag " << tag << " outside [0, 2^30)";
    const auto deadline = deadline_in(timeout_s);
    int64_t& seq = sent_[{peer, tag}];
    WireHeader h = p2p_header(me_, peer, tag, seq, count);
    ++seq;
    auto op = e_->post_send(h, buf);
    e_->wait({op}, deadline, timeout_s,
             "send on " + name_ + " (rank " + std::to_string(me_) + " to rank " + std::to_string(peer) + ", tag " +
                 std::to_string(tag) + ")",
             namer());
  }

  void recv(float* buf, size_t count, int peer, int tag, double timeout_s) override {
    TROUPE_CHECK(peer >= 0 && peer < size() && peer != me_) << "recv from rank " << peer << " in " << name_;
    TROUPE_CHECK(tag >= 0 && tag < kP2PChunk) << "recv on " << name_ << ": tag " << tag << " outside [0, 2^30)";
    const auto deadline = deadline_in(timeout_s);
    int64_t& seq = received_[{peer, tag}];
    WireHeader h = p2p_header(peer, me_, tag, seq, count);
    auto op = e_->post_recv(h, buf);
    e_->wait({op}, deadline, timeout_s,
             "recv on " + name_ + " (rank " + std::to_string(me_) + " from rank " + std::to_string(peer) + ", tag " +
                 std::to_string(tag) + ")",
             namer());
    ++seq;  // only a message actually received advances the sequence
  }

 private:
  struct Call {
    const char* op;
    int32_t code;
    int64_t seq;
    double timeout_s;
    Clock::time_point deadline;
  };

  Call begin(const char* op, int32_t code, double timeout_s) {
    if (broken_) throw Error(std::string(op) + " on " + name_ + ": the group is broken by an earlier failure");
    return Call{op, code, seq_++, timeout_s, deadline_in(timeout_s)};
  }

  WireHeader header(const Call& c, int phase, int from, int to, size_t count) const {
    WireHeader h;
    h.kind = kWireCollective;
    h.step = c.seq;
    h.microbatch = id_;
    h.chunk = c.code << 4 | phase;
    h.source = ranks_[from];
    h.destination = ranks_[to];
    h.dtype = DType::f32;
    h.shape = {(int64_t)count};
    h.bytes = count * sizeof(float);
    return h;
  }

  WireHeader p2p_header(int from, int to, int tag, int64_t seq, size_t count) const {
    WireHeader h;
    h.kind = kWireCollective;
    h.step = seq;
    h.microbatch = id_;
    h.chunk = kP2PChunk | tag;
    h.source = ranks_[from];
    h.destination = ranks_[to];
    h.dtype = DType::f32;
    h.shape = {(int64_t)count};
    h.bytes = count * sizeof(float);
    return h;
  }

  // "rank 2 (global rank 5)"
  std::function<std::string(int)> namer() const {
    return [this](int global) {
      auto it = std::find(ranks_.begin(), ranks_.end(), global);
      return "rank " + std::to_string(it - ranks_.begin()) + " (global rank " + std::to_string(global) + ")";
    };
  }

  void wait(const Call& c, const std::vector<std::shared_ptr<Op>>& ops) {
    try {
      e_->wait(ops, c.deadline, c.timeout_s,
               std::string(c.op) + " on " + name_ + " (rank " + std::to_string(me_) + " of " + std::to_string(size()) +
                   ", call " + std::to_string(c.seq) + ")",
               namer());
    } catch (...) {
      broken_ = true;  // the peers' calls are out of step now: later calls fail fast
      throw;
    }
  }

  // out[i] = in[0][i] op in[1][i] op ... (ascending group rank): collectives/local.cpp's loops.
  static void reduce_into(float* out, const std::vector<const float*>& in, size_t count, ReduceOp op) {
    if (!count) return;
    std::memcpy(out, in[0], count * sizeof(float));
    for (size_t r = 1; r < in.size(); ++r) {
      const float* x = in[r];
      if (op == ReduceOp::sum) {
#pragma omp simd
        for (size_t i = 0; i < count; ++i) out[i] += x[i];
      } else {
        for (size_t i = 0; i < count; ++i) out[i] = x[i] > out[i] ? x[i] : out[i];
      }
    }
  }

  std::shared_ptr<UcxTransport> t_;  // keeps the engine's transport alive
  std::shared_ptr<Engine> e_;
  const std::vector<int> ranks_;
  const int me_;
  const int32_t id_;
  const std::string name_;
  int64_t seq_ = 0;
  bool broken_ = false;
  std::map<std::pair<int, int>, int64_t> sent_, received_;  // (peer, tag) -> messages so far
  std::vector<float> scratch_;
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
  std::shared_ptr<Engine> e;
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
  return std::make_shared<UcxComm>(std::move(transport), std::move(e), std::move(ranks), my_index, id,
                                   std::move(name));
}

}  // namespace troupe
