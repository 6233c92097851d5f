// stages/schedule.h — pipeline schedules as data.
//
// A schedule is a pure function (stages P, stage s, microbatches M) -> the ordered list of
// actions stage s executes in one step. Sends and receives follow from the list: F(m)
// receives microbatch m's activation from stage s-1 (or embeds tokens on s = 0) and sends
// its output to s+1; B(m) receives the output gradient from s+1 (or starts from the loss
// on s = P-1) and sends the input gradient to s-1. The stage worker executes the list and
// nothing else decides order.
#pragma once
#include <string>
#include <vector>

namespace troupe {

struct Action {
  enum Kind : char { F = 'F', B = 'B' } kind;
  int mb;  // microbatch index in [0, M)
  bool operator==(const Action&) const = default;
};

// 1F1B (PipeDream-Flush; Narayanan et al. 2021, Megatron-LM's non-interleaved schedule):
// warmup = min(P - s - 1, M) forwards, then alternate one forward / one backward
// (steady state), then the remaining backwards (cooldown). Works for any M >= 1 (M < P too).
std::vector<Action> schedule_1f1b(int P, int s, int M);
// Forward only (evaluation / inference): F(0) .. F(M-1).
std::vector<Action> schedule_forward_only(int M);
// "F0 F1 B0 ..." for logs and test messages.
std::string to_string(const std::vector<Action>& actions);

}  // namespace troupe
