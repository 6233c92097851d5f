// stages/diagnosis.h — hang diagnosis as a pure function beside the simulator: from what
// every pipeline stage says it waits for (WaitState), which stages have not reported to
// the coordinator and the schedule, the wait-for graph as text, with its verdict: a cycle,
// or a missing sender (a stage waits for a message its sender's list already produced).
// The coordinator (actors/coordinator_wait.cpp) gathers the states; nothing here waits.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "stages/schedule.h"

namespace troupe {

// What a worker is waiting for, for hang diagnosis: (status_atom) asks, (status_atom,
// WaitState) answers; a worker whose wait times out sends its state before failing.
struct WaitState {
  static constexpr int kCoordinator = -1, kDataActor = -2, kNothing = -3;
  int stage = 0;
  int tp = 0;
  int dp = 0;
  bool waiting = false;     // false: computing or idle between steps
  bool timed_out = false;
  int64_t step = 0;
  int from = kNothing;      // stage index, or kCoordinator / kDataActor
  std::string what;         // "the output gradient of step 3 microbatch 0 for chunk 0 from stage 1 (chunk 0)"
  int pos = -1;             // actions of this step's list done so far (-1: not in a step's list)
  char msg = 0;             // awaited message: 'F' activation or 'B' gradient (0: other)
  int mb = -1, from_chunk = -1;  // ... of microbatch mb, produced by the sender's chunk from_chunk
};

// The wait-for graph of P stages as text, ending "the step was aborted":
//   states:   by stage, what each said (only the stages in `answered` are read);
//   answered: stages that answered (others: "no answer within 2 s");
//   reported: by stage, whether it reported to the coordinator for the awaited message
//             (the coordinator waits on the first that has not);
//   coordinator_waits_for: what the coordinator waited for ("the end of step 3");
//   schedule: the action lists (null: no missing-sender verdict).
// Names a cycle ("cycle: stage 0 -> stage 1 -> stage 0") and, over it, a missing sender
// ("missing sender: stage 0 waits for stage 1, which already ran B0 (position 5 of its
// list) and ..."). Throws nothing.
std::string wait_for_graph(int P, const std::map<int, WaitState>& states, const std::set<int>& answered,
                           const std::vector<bool>& reported, const std::string& coordinator_waits_for,
                           const Schedule* schedule);

}  // namespace troupe
