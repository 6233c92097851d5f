// The UCX engine of collectives/ucx_engine.h, part 1: set-up, the progress thread and what
// it does (UCX callbacks, header probes, payload receives), connect. Failed endpoints,
// closing and shutdown are in ucx_endpoints.cpp.
// The operations callers post and wait for are in ucx_ops.cpp.
#include <atomic>
#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "collectives/ucx_engine.h"

namespace troupe::ucx {

Clock::time_point deadline_in(double seconds) {
  seconds = std::clamp(seconds, 0.0, 1e7);  // "forever" must not overflow the clock
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string secs(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

namespace {
// Data-plane engines this process has started to make (the first one meets UCX fresh).
std::atomic<int> g_engines_made{0};

// ucp_init or ucp_worker_create failed (status st) creating `what`: after a failed accept()
// UCX leaves a stale entry in its process-wide async handler table, and every later context
// or worker of this process fails ("Element already exists"), so the cure is a new process.
// The first engine of a process meets no such state: its failure is the machine's or the
// settings' (a port in use, no usable device, the open-files limit), and a new process would
// fail the same way: UserError, exit 2.
[[noreturn]] void throw_start_failure(ucs_status_t st, const std::string& what, int process, bool first) {
  if (first)
    throw UserError("the data plane (UCX) cannot create " + what + " of process " + std::to_string(process) +
                    " (UCX status " + ucs_status_string(st) + "), in a process where UCX had not run before, so "
                    "starting it again would fail the same way; UCX's own lines above name the cause (an address in "
                    "use, no usable network device, the open-files limit): fix it (UCX_TLS, UCX_NET_DEVICES, ulimit "
                    "-n, or free the address) and start the job again");
  throw FreshProcessError("the data plane (UCX) cannot create " + what + " of process " + std::to_string(process) +
                          " (UCX status " + ucs_status_string(st) +
                          "): UCX's state in this process can be damaged by an earlier failure (UCX's own lines "
                          "above name it), so this process needs to be started afresh; if this is its first start, "
                          "check the UCX_* variables and the open-files limit (ulimit -n)");
}
}  // namespace

Engine::Engine(TransportOptions o) : o_(std::move(o)) {
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
  lost_since_.assign(o_.nprocs, Clock::time_point{});
  lost_told_.assign(o_.nprocs, 0);

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
  const bool first = g_engines_made.fetch_add(1) == 0;
  const ucs_status_t st = ucp_init(&pp, cfg, &ctx_);
  ucp_config_release(cfg);
  if (st != UCS_OK) throw_start_failure(st, "its context", o_.process, first);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // the progress thread, or a waiting caller, holding token_
  if (const ucs_status_t ws = ucp_worker_create(ctx_, &wp, &worker_); ws != UCS_OK) {
    ucp_cleanup(ctx_);
    throw_start_failure(ws, "its worker", o_.process, first);
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

Engine::~Engine() {
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

void Engine::connect(const std::vector<std::vector<uint8_t>>& addresses) {
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
      if (const ucs_status_t st = ucp_ep_create(worker_, &ep, &eps_[p]); st != UCS_OK)
        throw Error("process " + std::to_string(o_.process) + " cannot create its data-plane endpoint to process " +
                    std::to_string(p) + " (UCX status " + ucs_status_string(st) +
                    "): that process may have ended, or its address is not reachable from here");
    }
  }, 30.0, "connect");
}

// One round of the data plane: queued commands, (with run_calls) arrival handlers, then
// UCX progress, header probes and failed endpoints. The caller holds token_. Returns
// whether anything happened. A waiting caller runs it with run_calls = false (handlers
// stay on the progress thread, which is woken for them).
bool Engine::step(bool run_calls, bool* stop_out) {
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
      spdlog::error("data plane: the arrival handler of {} from rank {} threw: {}", wire_ident(c.h), c.h.source,
                    e.what());
    }
  }
  if (stop_out) *stop_out = stop;
  if (stop) return true;
  bool busy = !cmds.empty() || !calls.empty();
  while (ucp_worker_progress(worker_) != 0) {  // a waiting caller probes after each call, not
    busy = true;                               // after an empty poll of the sockets
    if (!run_calls) break;
  }
  busy = probe() || busy;
  busy = close_failed() || busy;
  return busy;
}

void Engine::loop() {
  unsigned sleep_us = 50;
  auto last_busy = Clock::now();
  for (;;) {
    tell_lost_peers();
    {  // callers progress the worker (or did a moment ago): stay out of their way (kParkS)
      std::unique_lock<std::mutex> lk(mu_);
      auto work = [&] { return !cmds_.empty() || !calls_.empty() || stop_ || take_over_; };
      if (!work() && (spinners_ > 0 || Clock::now() - last_spin_ < std::chrono::duration<double>(kParkS))) {
        park_cv_.wait_for(lk, std::chrono::duration<double>(kParkS), work);
        continue;
      }
      take_over_ = false;
    }
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

void Engine::on_send(void* req, ucs_status_t st, void* ud) {
  auto* tx = (Tx*)ud;
  tx->e->send_done(tx, req, st);
}

void Engine::on_recv(void* req, ucs_status_t st, const ucp_tag_recv_info_t* info, void* ud) {
  auto* rx = (Rx*)ud;
  rx->e->recv_done(rx, req, st, info ? info->length : 0);
}

void Engine::on_ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* a = (EpArg*)arg;
  a->e->peer_failed(a->proc, std::string("UCX reports ") + ucs_status_string(st));
}

void Engine::issue_send(const std::shared_ptr<Op>& op) {
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
    op->pending = op->h.bytes > kInlineBytes ? 2 : 1;
  }
  const uint64_t tag = ((uint64_t)o_.process << kProcShift) | (next_seq_++ & kSeqMask);
  post_tag_send(op, op->frame.data(), op->frame.size(), tag);
  if (op->h.bytes > kInlineBytes) post_tag_send(op, op->buf, op->h.bytes, tag | kDataBit);
}

void Engine::post_tag_send(const std::shared_ptr<Op>& op, const void* data, size_t n, uint64_t tag) {
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

void Engine::send_done(Tx* tx, void* req, ucs_status_t st) {
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
void Engine::post_tag_recv(Rx* rx, void* buf, size_t n, uint64_t tag) {
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

void Engine::set_req(Rx* rx, void* r) {
  rx->req = r;
  if (rx->op && rx->what == Rx::kPayload) rx->op->req = r;
}

void Engine::recv_done(Rx* rx, void* req, ucs_status_t st, size_t length) {
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
        op.error = "payload of " + wire_ident(op.h) + " from rank " + std::to_string(op.h.source) + ": " +
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
        spdlog::warn("data plane: payload of {} from rank {} lost: {}", wire_ident(rx->h), rx->h.source,
                     st == UCS_OK ? "wrong length" : ucs_status_string(st));
      }
      break;
    case Rx::kDiscard:
      break;
  }
  delete rx;
}

// Receives every header frame UCX holds, then handles the completed ones in order.
bool Engine::probe() {
  bool any = false;
  for (;;) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h m = ucp_tag_probe_nb(worker_, 0, kDataBit, 1, &info);
    if (!m) break;
    any = true;
    auto* rx = new Rx(Rx::kHeader, this);
    rx->stag = info.sender_tag;
    rx->probed = info.length;
    rx->bytes.resize(std::clamp<size_t>(info.length, 1, kMaxFrame + kInlineBytes));  // longer: truncated, dropped
    hdr_q_.push_back(rx);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
    p.cb.recv = &Engine::on_recv;
    p.user_data = rx;
    p.recv_info.tag_info = &rx->info;
    rx_live_.insert(rx);
    void* r = ucp_tag_msg_recv_nbx(worker_, rx->bytes.data(), rx->bytes.size(), m, &p);
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
    if (rx->probed > kMaxFrame + kInlineBytes || rx->status != UCS_OK) {
      ++rejected_;
      spdlog::warn("data plane: dropped a header frame of {} bytes claiming process {}: {}", rx->probed, proc,
                   rx->probed > kMaxFrame + kInlineBytes
                       ? "longer than " + std::to_string(kMaxFrame + kInlineBytes) + " bytes"
                                          : std::string(ucs_status_string(rx->status)));
      continue;
    }
    // the probe announced the length (ucp_tag_msg_recv_nbx reports none when it completes at once)
    on_header(rx->stag, rx->bytes.data(), rx->probed);
  }
  return any;
}

void Engine::on_header(uint64_t stag, const uint8_t* frame, size_t n) {
  const int proc = (int)((stag >> kProcShift) & kProcMask);
  // the header frame is u32 length L + L bytes + 32-byte HMAC (collectives/wire.h); what
  // follows is a small payload sent inline (exactly h.bytes when 0 < h.bytes <= kInlineBytes)
  size_t hn = n;
  if (n >= 4) {
    const uint64_t len = (uint64_t)frame[0] | (uint64_t)frame[1] << 8 | (uint64_t)frame[2] << 16 | (uint64_t)frame[3] << 24;
    if (4 + len + 32 <= n) hn = (size_t)(4 + len + 32);
  }
  WireHeader h;
  try {
    h = decode_header(frame, hn, o_.secret, o_.limits);
    const bool inlined = h.bytes > 0 && h.bytes <= kInlineBytes;
    if (n - hn != (inlined ? h.bytes : 0))
      throw ProtocolError(std::to_string(n - hn) + " bytes follow the header of " + std::to_string(h.bytes) +
                          " bytes" + (inlined ? "" : " (sent apart)"));
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
                 o_.process, wire_ident(h), h.source, proc_of(h.source), h.destination, proc_of(h.destination), proc);
    return;
  }
  const uint64_t dtag = stag | kDataBit;
  std::unique_lock<std::mutex> lk(mu_);
  auto hit = handlers_.find(h.kind);
  if (n > hn) {  // the payload came inline
    lk.unlock();
    deliver_copy(h, frame + hn, proc);
    return;
  }
  if (hit != handlers_.end()) {
    Handler fn = hit->second;
    lk.unlock();
    auto* rx = new Rx(Rx::kHandler, this);
    rx->proc = proc;
    rx->h = h;
    rx->t = Tensor(h.shape, h.dtype);
    rx->fn = std::move(fn);
    if (h.bytes == 0) {
      recv_done(rx, nullptr, UCS_OK, 0);
      return;
    }
    post_tag_recv(rx, rx->t.raw(), h.bytes, dtag);
    return;
  }
  std::shared_ptr<Op> target;
  void* into = nullptr;
  if (std::shared_ptr<Op> r = match_.arrive(h)) {
    if (same_layout(r->h, h)) {
      target = r;  // zero-copy into the waiting recv's buffer
      into = r->buf;
      r->state = Op::kActive;
    } else {
      r->state = Op::kFailed;
      r->error = layout_mismatch(h, r->h);
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
    match_.hold(u);
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
void Engine::discard(uint64_t dtag, uint64_t bytes, int proc) {
  if (!bytes) return;
  auto* rx = new Rx(Rx::kDiscard, this);
  rx->proc = proc;
  rx->bytes.resize(bytes);
  post_tag_recv(rx, rx->bytes.data(), bytes, dtag);
}

// A recv or send whose waiter gives up while its buffer is lent to UCX.
void Engine::cancel(const std::shared_ptr<Op>& op) {
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

}  // namespace troupe::ucx
