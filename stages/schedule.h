// stages/schedule.h — pipeline schedules as data.
//
// A schedule is a pure function (stages P, microbatches M, virtual chunks V) -> for each
// stage the ordered list of actions it executes in one step. Sends and receives follow
// from the list; the stage worker executes the list and nothing else decides order.
//
// Model layout: with V chunks per stage, chunk c of stage s holds the model's virtual
// stage v = c*P + s (Megatron-LM's interleaved assignment; Narayanan et al. 2021), so
// activations flow v -> v+1: (s, c) -> (s+1, c), and (P-1, c) -> (0, c+1).
//   F(m, c)  forward of microbatch m through chunk c: needs the activation of m from
//            virtual stage v-1 (tokens when v = 0).
//   B(m, c)  backward: needs the output gradient of m from v+1 (the loss when v = PV-1)
//            and F(m, c) done here. In a schedule with W actions, B computes only the
//            input gradient (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024);
//            otherwise it also accumulates the weight gradients.
//   W(m, c)  weight gradients of m through chunk c; needs B(m, c) done here.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace troupe {

struct Action {
  enum Kind : char { F = 'F', B = 'B', W = 'W' } kind;
  int mb;         // microbatch in [0, M)
  int chunk = 0;  // virtual chunk on this stage in [0, V)
  bool operator==(const Action&) const = default;
};

struct Schedule {
  std::string name;                           // "gpipe", "1f1b", "interleaved", "zb-h1", or a file path
  int P = 1, M = 1, V = 1;
  bool split_backward = false;                // has W actions
  std::vector<std::vector<Action>> stages;    // stages[s] = the list stage s executes
};

// The built-in schedules. Each throws UserError (explaining the rule) for (P, M, V) it
// cannot serve.
// GPipe (Huang et al. 2019): all forwards, then all backwards (in microbatch order). V = 1.
Schedule schedule_gpipe(int P, int M);
// 1F1B (PipeDream-Flush; Narayanan et al. 2021): warmup = min(P-s-1, M) forwards, steady
// one-forward-one-backward, cooldown backwards. V = 1. Peak in-flight <= P - s.
Schedule schedule_1f1b(int P, int M);
// The names a schedule's error messages give its parameters, and how they set one: a training
// run's config keys (the default: `parallel.microbatches = 8`) or a command's flags
// (simulate: `--microbatches 8`), so each message names what its reader types.
struct ScheduleNames {
  std::string stages = "parallel.pp", microbatches = "parallel.microbatches", chunks = "parallel.chunks",
              schedule = "parallel.schedule";
  // "parallel.pp = 4" / "--stages 4"; a schedule name quoted as TOML wants it ("\"1f1b\"")
  std::string set(const std::string& name, const std::string& value) const;
  // The names of simulate's flags.
  static ScheduleNames flags() { return {"--stages", "--microbatches", "--chunks", "--schedule"}; }
  // A config's names, with its train.batch_size and parallel.dp: advice to change the
  // microbatch count then also names a batch size the new count divides (trial 61).
  static ScheduleNames config(int64_t batch_size, int dp);
  int64_t batch_size = 0;  // sequences per step; 0: not known (simulate)
  int dp = 1;              // data-parallel replicas the batch is split over
  // "parallel.microbatches = 8", and " and train.batch_size = 16 (...)" when batch_size is
  // known and dp x M does not divide it.
  std::string set_microbatches(int M) const;
};

// Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021 sec. 2.2) with V chunks per stage:
// microbatches go through chunks in groups of P; requires M % P == 0 (else a UserError
// says why and the nearest valid M). Bubble time is 1/V of 1F1B's.
Schedule schedule_interleaved(int P, int M, int V, const ScheduleNames& names = {});
// ZB-H1 (Qi et al. 2024): 1F1B with B split into B (input gradient) and W (weight
// gradient), W's deferred to fill the bubbles, 1F1B's activation memory (at most P - s
// microbatches between F and B). V = 1. With F = B = W costs its bubble is about a third
// of 1F1B's.
Schedule schedule_zb_h1(int P, int M);
// The largest schedule troupe builds, simulates or reads (stages P, microbatches M,
// chunks V, and P x M x V); beyond these make_schedule and read_schedule throw UserError
// naming the limit, before any memory is taken for the lists.
constexpr int kMaxStages = 1024;
constexpr int kMaxMicrobatches = 16384;
constexpr int kMaxChunks = 64;
constexpr int64_t kMaxScheduleCells = 1 << 20;
// Throws UserError when (P, M, V) is beyond the limits above; `what` names the schedule.
void check_schedule_size(const std::string& what, int64_t P, int64_t M, int64_t V);
// By name: gpipe | 1f1b | interleaved | zb-h1, or a path to a schedule file (read_schedule).
// Errors name the parameters as `names` says.
Schedule make_schedule(const std::string& name_or_path, int P, int M, int V, const ScheduleNames& names = {});
// Forward only (evaluation, inference) for one stage with V chunks: F(m, c) in virtual-stage order.
std::vector<Action> schedule_forward_only(int M, int V = 1);

// Checks a schedule before anything runs: every action of every (microbatch, chunk)
// exactly once per stage (F, B, and W iff split_backward), no B before its F nor W
// before its B, and no deadlock given the sends/receives the lists imply. Throws
// UserError naming the stage, the action and the dependency that fails.
void validate_schedule(const Schedule& s);

// Whether neighbouring stages agree on the order of their messages: for every ordered pair
// of physical stages (a, b), the activations and output gradients a sends to b, in the
// order of a's list, must be the ones b awaits from a, in the order of b's list. NCCL (and
// any transport that matches a pair's sends and receives in order, not by tag) needs it; the
// CPU data plane matches by (microbatch, chunk) and does not. Returns "" when they agree,
// else a sentence naming the first pair, position and the two messages. Assumes
// validate_schedule passed.
std::string p2p_order_disagreement(const Schedule& s);
// Throws UserError (the sentence above, `why` naming what needs the order, e.g. "over
// NCCL", and the fix) when p2p_order_disagreement is not "".
void validate_p2p_order(const Schedule& s, const std::string& why);

// Text/CSV format: one row per stage// Text/CSV format: one row per stage, one action per cell, cells "F3" (chunk 0) or
// "F3c1" (chunk 1), separated by commas; lines starting with '#' are comments.
std::string format_schedule(const Schedule& s);
// Reads that format; P from the rows, M and V from the actions (or throws UserError
// naming the line and cell). Sets name = path.
Schedule read_schedule(const std::string& path);
Schedule parse_schedule(const std::string& text, const std::string& name);

// "F0 F1 B0c1 ..." for logs and messages.
std::string to_string(const Action& a);
std::string to_string(const std::vector<Action>& actions);

}  // namespace troupe
