// The coordinator's waits (actors/coordinator.h): step reports, failures and their
// diagnosis, the shutdown of this process's actors.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "actors/coordinator.h"
#include "checkpoint/disk.h"
#include "checkpoint/snapshot.h"
#include "core/error.h"
#include "core/events.h"
#include "stages/diagnosis.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"

namespace troupe {

// A worker's failure (or a lost process, stage -2) while waiting for `what`: the cause,
// and the wait-for graph where it helps.
void Coordinator::on_fail(int stage, const std::string& msg, const std::string& what) {
  if (stage == -2) throw Error(msg);  // a lost process (actors/cluster.h): the wait-for graph says nothing more
  if (stage == kFailUserInput) {  // the sentence names the input and its fix; then where to continue from
    const auto snaps = ctx_.checkpoint_dir.empty() ? std::vector<std::pair<int64_t, std::string>>()
                                                   : list_snapshots(ctx_.checkpoint_dir);
    throw UserError(msg + (snaps.empty() ? std::string("; no snapshot of this run is on disk, so its steps so far are "
                                                       "lost: start it again once the input is fixed")
                                         : "; then continue from the newest snapshot, " + snaps.back().second +
                                               " (step " + std::to_string(snaps.back().first) +
                                               "), with --resume latest"));
  }
  if (cluster_ && !cluster_->failure().empty())  // a consequence of a lost process: name the cause
    throw Error(cluster_->failure() + " (then: " + msg + ")");
  std::string head = stage >= 0 ? "stage " + std::to_string(stage) + " failed: " + msg : msg;
  // an allocation refused under the user's memory limit: the sentence names the fix; a
  // wait-for graph would only show the consequences (exit 2, see core/error.h)
  if (is_out_of_memory_sentence(msg)) throw UserError(head);
  const std::string graph = diagnose(what);
  if (!lost_.empty()) throw Error(lost_ + " (then: " + head + ")");  // a lost process caused it
  throw Error(head + "\n" + graph);
}

void Coordinator::on_timeout(double limit, const std::string& what) {
  std::ostringstream os;
  os << "the coordinator waited " << limit << " s for " << what
     << " and it did not come; raise train.timeout_s if steps are legitimately this slow\n"
     << diagnose(what);
  throw Error(os.str());
}

StepReport Coordinator::collect_done(int64_t k, const std::string& what, int expected) {
  if (expected < 0) expected = plan_.P * plan_.TP * plan_.DP;
  StepReport total;
  int n = 0;
  act_bytes_.assign(plan_.P, 0);
  reported_.assign(plan_.P, false);
  wait([&] { return n == expected; }, "the end of " + what, [&](StepReport& r) {
    reported_[r.stage] = true;
    if (k > 0)
      for (auto& sp : r.spans) trace_.push_back({r.stage, k, sp});
    // every worker runs the same scaler from the same decisions: their scales must agree
    if (n > 0 && r.loss_scale != total.loss_scale)
      throw Error(fmt::format("stage {} tp {} dp {} used loss scale {} where others used {} in {}", r.stage, r.tp,
                              r.dp, r.loss_scale, total.loss_scale, what));
    total.loss_scale = r.loss_scale;
    total.loss_sum += r.loss_sum;
    total.tokens += r.tokens;
    if (r.tp == 0 && r.dp == 0) act_bytes_[r.stage] = r.activation_bytes;
    ++n;
  });
  return total;
}

// Hang diagnosis: asks every worker what it waits for (2 s deadline); the wait-for graph
// and its verdict (a cycle, a missing sender) come from stages/diagnosis.h.
std::string Coordinator::diagnose(const std::string& coordinator_waits_for) {
  for (int s = 0; s < plan_.P; ++s)  // TP rank 0 of every stage speaks for its stage
    if (!states_.count(s) || !states_[s].timed_out) (*self_)->send(a_.workers[s * plan_.TP], status_atom::value);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  std::set<int> answered;
  for (auto& [s, st] : states_)
    if (st.timed_out) answered.insert(s);
  while ((int)answered.size() < plan_.P) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    bool timed_out = false;
    (*self_)->receive([&](status_atom, WaitState& ws) {
                        if (ws.tp != 0 || ws.dp != 0) return;
                        if (!(states_.count(ws.stage) && states_[ws.stage].timed_out)) states_[ws.stage] = ws;
                        answered.insert(ws.stage);
                      },
                      [&](fail_atom, int stage, std::string& msg) {
                        if (stage == -2) lost_ = msg, timed_out = true;  // a lost process: nobody more will answer
                      },
                      [&](caf::down_msg& dm) { down_.insert(dm.source); },
                      [&](norm_atom, int64_t, NormReport&) {}, [&](done_atom, int64_t, StepReport&) {},
                      caf::after(left) >> [&] { timed_out = true; });
    if (timed_out) break;
  }
  return wait_for_graph(plan_.P, states_, answered, reported_, coordinator_waits_for, plan_.schedule.get());
}

// Stops this process's actors and waits (30 s) for them to end. Process 0 of a
// multi-process job then tells the other processes the job is over (unless it failed).
void Coordinator::shutdown() {
  if (stopped_ || !sys_) return;
  stopped_ = true;
  if (a_.writer) (*self_)->send(a_.writer, stop_atom::value);
  if (a_.keeper) (*self_)->send(a_.keeper, stop_atom::value);
  for (auto& w : a_.workers) (*self_)->send(w, stop_atom::value);
  for (auto& o : a_.optimizers) (*self_)->send(o, stop_atom::value);
  if (a_.data) (*self_)->send(a_.data, stop_atom::value);
  // Workers exit on stop; wait for their down messages (deadline) so none outlives us.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  const size_t actors = a_.local_actors;
  while (down_.size() < actors) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    bool timed_out = false;
    (*self_)->receive([&](caf::down_msg& dm) { down_.insert(dm.source); }, [&](fail_atom, int, std::string&) {},
                      [&](done_atom, int64_t, StepReport&) {}, [&](norm_atom, int64_t, NormReport&) {},
                      [&](logits_atom, int64_t, Tensor&) {}, [&](dump_atom, ParamDump&) {},
                      [&](snapack_atom, int64_t, SnapAck&) {}, [&](snapdone_atom, int64_t, SnapDone&) {},
                      [&](status_atom, WaitState&) {},
                      caf::after(left) >> [&] { timed_out = true; });
    if (timed_out) break;
  }
  if (down_.size() < actors) {
    spdlog::error("{} actor(s) did not stop within 30 s; exiting anyway", actors - down_.size());
    std::fflush(nullptr);
    std::_Exit(1);
  }
  if (cluster_ && ctx_.launch.rank == 0 && !failed_) cluster_->finish();
}

}  // namespace troupe
