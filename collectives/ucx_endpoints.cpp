// The UCX engine of collectives/ucx_engine.h, part 3: endpoints that failed (a lost peer:
// its receives cancelled, the job told after a grace period), closing them, and the
// shutdown of the worker.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "collectives/ucx_engine.h"

namespace troupe::ucx {

bool Engine::close_failed() {
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
    if (!ending) {
      spdlog::warn("data plane: process {} lost process {}: {}", o_.process, p, why);
      std::lock_guard<std::mutex> lk(mu_);
      if (lost_since_[p] == Clock::time_point{}) lost_since_[p] = Clock::now();
    }
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

void Engine::tell_lost_peers() {
  if (!o_.on_peer_lost) return;
  std::vector<std::pair<int, std::string>> due;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) return;  // the job ended or failed already: its own reason stands
    const auto now = Clock::now();
    for (int p = 0; p < o_.nprocs; ++p)
      if (lost_since_[p] != Clock::time_point{} && !lost_told_[p] &&
          now - lost_since_[p] >= std::chrono::duration<double>(o_.peer_lost_grace_s)) {
        lost_told_[p] = 1;
        due.push_back({p, failed_[p]});
      }
  }
  for (auto& [p, why] : due) {
    try {
      o_.on_peer_lost(p, why);
    } catch (const std::exception& e) {
      spdlog::error("data plane: reporting the loss of process {} failed: {}", p, e.what());
    }
  }
}

void Engine::close_ep(int p, bool force) {
  ucp_ep_h ep = eps_[p];
  if (!ep) return;
  eps_[p] = nullptr;
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* r = ucp_ep_close_nbx(ep, &cp);
  if (r && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
}

void Engine::close_all(bool force) {
  for (int p = 0; p < o_.nprocs; ++p) close_ep(p, force);
  std::vector<Rx*> live(rx_live_.begin(), rx_live_.end());
  for (Rx* rx : live)
    if (rx->what != Rx::kHeader && rx_live_.count(rx) && rx->req) ucp_request_cancel(worker_, rx->req);
}

void Engine::shutdown() {
  bool force;
  {
    std::lock_guard<std::mutex> lk(mu_);
    force = aborted_;
    for (auto& op : match_.take_all_posted()) {
      op->state = Op::kFailed;
      op->error = "the transport is shutting down";
    }
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

}  // namespace troupe::ucx
