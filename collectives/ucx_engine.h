// collectives/ucx_engine.h — the UCX engine under collectives/ucx.h (internal to
// collectives/): one ucp context + worker per process, its endpoints, the progress thread
// and the operations callers post and wait for. Tag matching is collectives/matching.h's;
// the collective algorithms are collectives/group.h's. Defined in ucx_engine.cpp (set-up,
// progress thread, UCX callbacks) and ucx_ops.cpp (what callers do: post, wait, release).
//
// UCX tags (64 bits) — every message is a header frame, its payload inline after the frame
// when 0 < bytes <= kInlineBytes (one UCX message), else (bytes > 0) a separate payload:
//   bit 63        0 = header frame, 1 = payload
//   bits 40..62   the sending process (< 2^23)
//   bits 0..39    the sender's message sequence number (per sending process, wraps at 2^40)
// The header goes out with tag (process << 40 | seq), a separate payload with the same tag plus
// bit 63, so a receiver derives the payload's tag from the probed header's sender tag and
// posts an exact-match receive for it; payload tags never collide within a job.
//
// Receiving (progress thread): ucp_tag_probe_nb(header space, remove) -> the frame length
// is checked (at most kMaxFrame + kInlineBytes bytes; a longer one is received truncated
// into the fixed buffer and dropped) -> ucp_tag_msg_recv_nbx -> decode_header (HMAC,
// ranges, bytes = shape x dtype, an inline payload of exactly `bytes`; a failure is logged,
// counted in rejected() and dropped) -> the header's source must be a rank of the process
// in the tag and its destination a rank of this process -> an inline payload is copied
// like a message between ranks of this process (deliver_copy); a separate one is
// received, in this order of preference:
//   1. into a handler's new Tensor when its kind has an on_arrival handler;
//   2. straight into the buffer of a recv() already waiting for that header (zero-copy;
//      UCX switches to rendezvous above its thresholds);
//   3. into a staging buffer of header.bytes bytes, copied out when recv() asks.
// Headers are handled in arrival order, so messages with the same identity (kind, source,
// destination, step, microbatch, chunk) are matched first-in first-out.
//
// Threads: one thread at a time calls UCX (worker in serialized mode, token_): the
// progress thread, or a caller that waits for its messages and progresses the worker
// itself for up to kWaitSpinS, probing for headers after every ucp_worker_progress call
// (handlers still run on the progress thread). While callers do
// that, and for kParkS after the last of them got its messages, the progress thread parks
// on park_cv_ instead of waking for every event (a caller that gives up spinning, queued
// commands and arrival handlers wake it at once). Callers queue commands (a std::function
// run on the progress thread) under mu_ and wake it with ucp_worker_signal; they wait on
// cv_ with their deadline. Otherwise the progress thread sleeps in poll() on the worker's
// event fd after ucp_worker_arm (kPollMs at most, so a stop is
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
#pragma once
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "collectives/matching.h"
#include "collectives/ucx.h"
#include "core/awake_clock.h"
#include "core/error.h"

// UCS_CHECK(expr) << "context": throws troupe::Error naming the expression, the UCX status
// and the context when expr (a ucs_status_t) is not UCS_OK.
#define UCS_CHECK(expr)                                                                             \
  if (const ucs_status_t ucs_check_status_ = (expr); ucs_check_status_ == UCS_OK) {                 \
  } else                                                                                            \
    ::troupe::detail::CheckFailure<::troupe::Error>(#expr, __func__, __FILE__, __LINE__, false)     \
        << "UCX status " << ucs_status_string(ucs_check_status_) << ": "

namespace troupe::ucx {

using Clock = AwakeClock;  // deadlines: the time this process was stopped (Ctrl-Z) does not count

constexpr uint64_t kDataBit = 1ull << 63;
constexpr int kProcShift = 40;
constexpr uint64_t kSeqMask = (1ull << kProcShift) - 1;
constexpr uint64_t kProcMask = (1ull << 23) - 1;
// Largest header frame decode_header accepts: u32 length + at most 4096 bytes of Cap'n
// Proto + 32-byte HMAC (collectives/wire.h). Checked before the frame is received.
constexpr size_t kMaxFrame = 4 + 4096 + 32;
// A payload of at most kInlineBytes travels in its header's UCX message, after the frame:
// one message instead of two (half the work per small message: bench/ucx_bench --latency).
constexpr uint64_t kInlineBytes = 1024;
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
// The progress thread parks while callers progress the worker themselves and for kParkS
// after the last of them got its messages (bounded: it re-checks every kParkS), so a
// message answered at once costs no wakeup of it either: with it waking for every event,
// two threads per process took turns on UCX and the 8-byte round trip was ~5x longer.
// A caller that gives up spinning, a queued command and an arrival handler wake it at once.
constexpr double kParkS = 1e-3;
constexpr double kGraceS = 2.0;      // wait for UCX to release a buffer after a cancel
constexpr double kCloseS = 2.0;      // wait for endpoints to close at shutdown

// now + seconds, clamped so that "forever" does not overflow the clock.
Clock::time_point deadline_in(double seconds);
// A number of seconds as text ("0.5").
std::string secs(double s);

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

inline bool finished(const Op& o) {
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
  // Checks the options, creates the ucp context (tag + wakeup features) and the worker,
  // starts the progress thread. Throws Error naming the UCX status when UCX cannot start.
  explicit Engine(TransportOptions o);
  // Stops the progress thread (closing the endpoints, at most kCloseS) and frees UCX.
  ~Engine();

  const std::vector<uint8_t>& address() const { return address_; }
  const TransportOptions& options() const { return o_; }
  uint64_t rejected() const { return rejected_.load(); }
  int proc_of(int rank) const { return o_.process_of_rank.at(rank); }

  // Creates an endpoint to every other process (addresses[p]: process p's address()).
  void connect(const std::vector<std::vector<uint8_t>>& addresses);
  // Register before peers may send messages of `kind`: one that arrived earlier stays
  // queued for recv(). An empty fn removes the handler.
  void on_arrival(uint8_t kind, Handler fn);
  // Fails every wait and later call with Error(reason); closes the endpoints. Idempotent.
  void abort(const std::string& reason);

  // ---- operations (any thread) ----

  // Starts sending h + payload (h.bytes bytes; h.source a rank of this process). A
  // destination in this process is delivered (copied) at once. Throws Error after abort().
  std::shared_ptr<Op> post_send(const WireHeader& h, const void* payload);
  // Starts receiving the message with want's identity into buf (want.bytes bytes; want.
  // destination a rank of this process). Throws Error after abort().
  std::shared_ptr<Op> post_recv(const WireHeader& want, void* buf);
  // Waits for every op until the deadline. On success copies unexpected payloads into their
  // recv buffers. Otherwise releases every op (no buffer stays lent to UCX, see the file
  // comment) and throws Error("<what()>: <reason>"), or Error(reason) after abort().
  // rank_name(r) names global rank r in messages; timeout_s is quoted in them.
  void wait(const std::vector<std::shared_ptr<Op>>& ops, Clock::time_point deadline, double timeout_s,
            const std::function<std::string()>& what, const std::function<std::string(int)>& rank_name);

 private:
  // ---- helpers for callers (ucx_ops.cpp) ----
  std::string hint(const std::vector<std::shared_ptr<Op>>& ops) const;
  bool lost(const Op& op) const;
  void release(const std::shared_ptr<Op>& op, std::unique_lock<std::mutex>& lk);
  void run_on_progress(std::function<void()> fn, double timeout_s, const std::string& what);
  void wake();
  void deliver_local(const WireHeader& h, const void* payload);
  void deliver_copy(const WireHeader& h, const void* payload, int proc);
  template <class Done>
  void progress_while_waiting(std::unique_lock<std::mutex>& lk, Clock::time_point deadline, Done&& done);

  // ---- progress thread (ucx_engine.cpp) ----
  bool step(bool run_calls, bool* stop_out);
  void loop();
  static void on_send(void* req, ucs_status_t st, void* ud);
  static void on_recv(void* req, ucs_status_t st, const ucp_tag_recv_info_t* info, void* ud);
  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t st);
  void issue_send(const std::shared_ptr<Op>& op);
  void post_tag_send(const std::shared_ptr<Op>& op, const void* data, size_t n, uint64_t tag);
  void send_done(Tx* tx, void* req, ucs_status_t st);
  void post_tag_recv(Rx* rx, void* buf, size_t n, uint64_t tag);
  void set_req(Rx* rx, void* r);
  void recv_done(Rx* rx, void* req, ucs_status_t st, size_t length);
  bool probe();
  void on_header(uint64_t stag, const uint8_t* frame, size_t n);
  void discard(uint64_t dtag, uint64_t bytes, int proc);
  void cancel(const std::shared_ptr<Op>& op);
  // From UCX's endpoint error callback: handled in close_failed(), after probe() has taken
  // the headers that arrived before the failure (a peer that sent its last messages and
  // exited must not fail the receives of those messages).
  void peer_failed(int proc, const std::string& why) { to_close_.push_back({proc, why}); }
  bool close_failed();
  void close_ep(int p, bool force);
  void close_all(bool force);
  void shutdown();

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
  std::condition_variable park_cv_;  // the progress thread parks on it while callers spin
  int spinners_ = 0;                 // callers in progress_while_waiting
  Clock::time_point last_spin_{};    // when the last of them left it
  bool take_over_ = false;           // one left without its messages: the progress thread must poll
  std::deque<std::function<void()>> cmds_;
  std::vector<HandlerCall> calls_;
  bool stop_ = false, aborted_ = false;
  std::string abort_reason_;
  std::vector<std::string> failed_;  // per process: why it failed ("" = fine)
  // per process: when its endpoint failed (while the data plane was not aborted), and
  // whether o_.on_peer_lost was called for it (mu_)
  std::vector<Clock::time_point> lost_since_;
  std::vector<char> lost_told_;
  void tell_lost_peers();  // calls o_.on_peer_lost for each loss past its grace (progress thread)
  Matcher<Op> match_;  // recvs waiting for their header; messages waiting for their recv
  std::map<uint8_t, Handler> handlers_;

  std::atomic<uint64_t> rejected_{0};
};

}  // namespace troupe::ucx
