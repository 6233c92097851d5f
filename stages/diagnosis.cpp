// Hang diagnosis (stages/diagnosis.h).
#include "stages/diagnosis.h"

#include <algorithm>
#include <sstream>

namespace troupe {

namespace {

std::string node_name(int x) {
  return x >= 0 ? "stage " + std::to_string(x) : x == WaitState::kCoordinator ? std::string("coordinator")
                                                                               : std::string("data actor");
}

// The first cycle of the wait-for edges ("" when there is none).
std::string find_cycle(const std::map<int, int>& edge) {
  for (auto& [start, to0] : edge) {
    std::vector<int> path = {start};
    int cur = to0;
    while (edge.count(cur) && std::find(path.begin(), path.end(), cur) == path.end()) {
      path.push_back(cur);
      cur = edge.at(cur);
    }
    if (cur == start) {
      std::string verdict = "cycle: ";
      for (int x : path) verdict += node_name(x) + " -> ";
      return verdict + node_name(start);
    }
  }
  return "";
}

// A missing sender: the stage that should send has already run the producing action
// (`cycle`: the verdict so far, which it explains). "" when there is none.
std::string find_missing_sender(const std::map<int, int>& edge, const std::map<int, WaitState>& states,
                                const Schedule* schedule, const std::string& cycle) {
  for (auto& [s, from] : edge) {
    if (s < 0 || from < 0 || !states.count(s) || !states.count(from)) continue;
    const WaitState& w = states.at(s);
    const WaitState& f = states.at(from);
    if (!w.msg || !schedule) continue;
    const auto& list = schedule->stages[from];
    const Action want{w.msg == 'F' ? Action::F : Action::B, w.mb, w.from_chunk};
    auto it = std::find(list.begin(), list.end(), want);
    if (it == list.end()) continue;
    const int idx = (int)(it - list.begin());
    if (f.pos > idx)
      return "missing sender: stage " + std::to_string(s) + " waits for stage " + std::to_string(from) +
             ", which already ran " + to_string(want) + " (position " + std::to_string(idx) + " of its list) and " +
             (f.waiting ? "now waits for " + f.what : std::string("is not waiting")) +
             ": the message was sent to the wrong place, never sent, or lost" +
             (cycle.empty() ? "" : " (which also explains the " + cycle + ")");
  }
  return "";
}

}  // namespace

std::string wait_for_graph(int P, const std::map<int, WaitState>& states, const std::set<int>& answered,
                           const std::vector<bool>& reported, const std::string& coordinator_waits_for,
                           const Schedule* schedule) {
  std::ostringstream os;
  os << "wait-for graph:\n";
  std::map<int, int> edge;  // node -> node it waits on
  for (int s = 0; s < P; ++s) {
    if (!answered.count(s) || !states.count(s)) {
      os << "  stage " << s << ": no answer within 2 s (busy computing, or gone)\n";
      continue;
    }
    const WaitState& w = states.at(s);
    if (w.waiting) {
      os << "  stage " << s << " waits for " << w.what << (w.timed_out ? " (timed out)" : "") << "\n";
      edge[s] = w.from;
    } else {
      os << "  stage " << s << " is not waiting for a message\n";
    }
  }
  std::string missing;
  for (int s = 0; s < (int)reported.size(); ++s)
    if (!reported[s]) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
  os << "  coordinator waits for " << coordinator_waits_for
     << (missing.empty() ? "" : " (not yet from stage " + missing + ")") << "\n";
  if (!missing.empty()) edge[WaitState::kCoordinator] = std::stoi(missing.substr(0, missing.find(',')));
  // a cycle, or the first wait on a node that is not waiting for it (the missing sender)
  std::string verdict = find_cycle(edge);
  const std::string sender = find_missing_sender(edge, states, schedule, verdict);
  if (!sender.empty()) verdict = sender;
  if (!verdict.empty()) os << verdict << "\n";
  os << "the step was aborted";
  return os.str();
}

}  // namespace troupe
