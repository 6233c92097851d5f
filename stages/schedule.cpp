#include "stages/schedule.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/read_file.h"
#include "core/text.h"

namespace troupe {
namespace {

void check_common(const char* name, int P, int M, int V, const ScheduleNames& names = {}) {
  TROUPE_USER_CHECK(P >= 1) << "schedule " << name << ": the number of stages (" << names.stages
                            << ") must be >= 1 (got " << P << ")";
  TROUPE_USER_CHECK(M >= 1) << "schedule " << name << ": the number of microbatches (" << names.microbatches
                            << ") must be >= 1 (got " << M << ")";
  TROUPE_USER_CHECK(V >= 1) << "schedule " << name << ": " << names.chunks << " must be >= 1 (got " << V << ")";
  check_schedule_size(std::string("schedule ") + name, P, M, V);
}

Schedule make(const char* name, int P, int M, int V) {
  Schedule s;
  s.name = name;
  s.P = P;
  s.M = M;
  s.V = V;
  s.stages.resize(P);
  return s;
}

}  // namespace

Schedule schedule_gpipe(int P, int M) {
  check_common("gpipe", P, M, 1);
  Schedule s = make("gpipe", P, M, 1);
  for (int st = 0; st < P; ++st) {
    for (int m = 0; m < M; ++m) s.stages[st].push_back({Action::F, m, 0});
    for (int m = 0; m < M; ++m) s.stages[st].push_back({Action::B, m, 0});
  }
  return s;
}

Schedule schedule_1f1b(int P, int M) {
  check_common("1f1b", P, M, 1);
  Schedule s = make("1f1b", P, M, 1);
  for (int st = 0; st < P; ++st) {
    auto& a = s.stages[st];
    const int warmup = std::min(P - st - 1, M);
    int f = 0, b = 0;
    for (; f < warmup; ++f) a.push_back({Action::F, f, 0});  // warmup
    for (; f < M; ++f, ++b) {                                  // steady 1F1B
      a.push_back({Action::F, f, 0});
      a.push_back({Action::B, b, 0});
    }
    for (; b < M; ++b) a.push_back({Action::B, b, 0});        // cooldown
  }
  return s;
}

Schedule schedule_interleaved(int P, int M, int V, const ScheduleNames& names) {
  check_common("interleaved", P, M, V, names);
  if (M % P != 0) {
    // the multiples of P nearest M; where the batch is known, those it splits into (trial 61)
    const bool known = names.batch_size > 0;
    const int64_t per = known ? names.batch_size / names.dp : 0;
    const auto fits = [&](int64_t m) { return !known || (names.batch_size % names.dp == 0 && per % m == 0); };
    int64_t lo = M / P * P, hi = lo + P;
    while (lo > 0 && !fits(lo)) lo -= P;
    while (known && hi <= per && !fits(hi)) hi += P;
    if (known && hi > per) hi = 0;  // none above M that fits
    std::string use;
    if (lo > 0 && hi > 0) use = names.set(names.microbatches, std::to_string(lo) + " or " + std::to_string(hi));
    else if (lo > 0 || hi > 0) use = names.set(names.microbatches, std::to_string(lo > 0 ? lo : hi));
    else use = names.set_microbatches(M / P * P + P);  // with the batch size it needs
    TROUPE_USER_FAIL() << "schedule interleaved sends microbatches through the " << V << " chunks in groups of "
                       << names.set(names.stages, std::to_string(P)) << ", so " << names.microbatches
                       << " must be a multiple of " << P << " (got " << M << "); use " << use << ", or "
                       << names.set(names.schedule, "1f1b");
  }
  Schedule s = make("interleaved", P, M, V);
  const int total = M * V, group = P * V;
  auto chunk_of = [&](int k, bool forward) {
    int c = (k % group) / P;
    return forward ? c : V - 1 - c;
  };
  auto mb_of = [&](int k) { return (k / group) * P + (k % P); };
  for (int st = 0; st < P; ++st) {
    auto& a = s.stages[st];
    int warmup = (M == P) ? total : std::min(total, (P - st - 1) * 2 + (V - 1) * P);
    if (V == 1) warmup = std::min(P - st - 1, M);  // plain 1F1B
    for (int k = 0; k < warmup; ++k) a.push_back({Action::F, mb_of(k), chunk_of(k, true)});
    const int remaining = total - warmup;
    for (int k = 0; k < remaining; ++k) {
      a.push_back({Action::F, mb_of(k + warmup), chunk_of(k + warmup, true)});
      a.push_back({Action::B, mb_of(k), chunk_of(k, false)});
    }
    for (int k = remaining; k < total; ++k) a.push_back({Action::B, mb_of(k), chunk_of(k, false)});
  }
  return s;
}

Schedule schedule_zb_h1(int P, int M) {
  check_common("zb-h1", P, M, 1);
  Schedule s = make("zb-h1", P, M, 1);
  s.split_backward = true;
  // Built by list scheduling under ZB-H1's assumptions (Qi et al. 2024, sec. 3): unit
  // costs F = B = W = 1, no p2p cost, and 1F1B's activation limit (at most P - s
  // microbatches between F and B on stage s). Whenever a stage is free it runs, in
  // priority order: the B whose gradient has arrived (B is on the critical path), else
  // the next F if its activation has arrived and the limit allows, else a pending W
  // (which fills what would be bubble). The resulting per-stage order is the schedule.
  // As in the paper, the limit counts microbatches between F and B. In troupe a stage keeps
  // a microbatch's activations until its W, so the memory is that of the microbatches
  // between F and W — up to M on the last stage, which defers all its W's to the end (the
  // simulator reports it, and the memory check uses it). Limiting F - W to P - s instead
  // was measured: the bubble is then 2/3 of 1F1B's, not 1/3. `train.recompute = "full"`
  // bounds the cost of the deferred microbatches to their block inputs.
  const int INF = 1 << 30;
  std::vector<std::vector<int>> f_end(P, std::vector<int>(M, INF)), b_end(P, std::vector<int>(M, INF));
  std::vector<int> nf(P, 0), nb(P, 0);
  std::vector<std::deque<int>> pending(P);
  size_t done = 0, total = (size_t)3 * P * M;
  for (int t = 0; done < total; ++t) {
    TROUPE_CHECK(t < 100 * (int)total) << "zb-h1 construction did not converge";
    for (int st = 0; st < P; ++st) {
      auto& a = s.stages[st];
      const int b = nb[st], f = nf[st];
      const bool b_ready = b < M && b < f && f_end[st][b] < t + 1 && (st == P - 1 || b_end[st + 1][b] <= t);
      const bool f_ready = f < M && (st == 0 || f_end[st - 1][f] <= t) && f - b < P - st;
      if (b_ready) {
        a.push_back({Action::B, b, 0});
        b_end[st][b] = t + 1;
        pending[st].push_back(b);
        ++nb[st];
      } else if (f_ready) {
        a.push_back({Action::F, f, 0});
        f_end[st][f] = t + 1;
        ++nf[st];
      } else if (!pending[st].empty()) {
        a.push_back({Action::W, pending[st].front(), 0});
        pending[st].pop_front();
      } else {
        continue;
      }
      ++done;
    }
  }
  return s;
}

void check_schedule_size(const std::string& what, int64_t P, int64_t M, int64_t V) {
  TROUPE_USER_CHECK(P <= kMaxStages) << what << ": " << P << " stages exceed the limit of " << kMaxStages
                                     << "; use fewer stages";
  TROUPE_USER_CHECK(M <= kMaxMicrobatches) << what << ": " << M << " microbatches exceed the limit of "
                                           << kMaxMicrobatches << "; use fewer microbatches";
  TROUPE_USER_CHECK(V <= kMaxChunks) << what << ": " << V << " chunks exceed the limit of " << kMaxChunks
                                     << "; use fewer chunks";
  TROUPE_USER_CHECK(P * M * V <= kMaxScheduleCells)
      << what << ": " << P << " stages x " << M << " microbatches x " << V << " chunk(s) = " << P * M * V
      << " (stage, microbatch, chunk) cells exceed the limit of " << kMaxScheduleCells
      << "; use fewer stages or microbatches";
}

std::string ScheduleNames::set(const std::string& name, const std::string& value) const {
  if (name.rfind("--", 0) == 0) return name + " " + value;
  return name + " = " + (name == schedule ? "\"" + value + "\"" : value);
}

ScheduleNames ScheduleNames::config(int64_t batch_size, int dp) {
  ScheduleNames n;
  n.batch_size = batch_size;
  n.dp = std::max(1, dp);
  return n;
}

std::string ScheduleNames::set_microbatches(int M) const {
  std::string s = set(microbatches, std::to_string(M));
  const int64_t unit = (int64_t)dp * M;
  if (batch_size > 0 && batch_size % unit != 0)
    s += " and train.batch_size = " + std::to_string((batch_size + unit - 1) / unit * unit) + " (a multiple of " +
         (dp > 1 ? "parallel.dp x " + microbatches + " = " + std::to_string(unit) : std::to_string(M)) + ")";
  return s;
}

Schedule make_schedule(const std::string& name, int P, int M, int V, const ScheduleNames& n) {
  // (each parameter named as its reader types it: a config key or simulate's flag)
  for (const auto& [v, key] : {std::pair<int, const std::string&>{P, n.stages}, {M, n.microbatches}, {V, n.chunks}})
    TROUPE_USER_CHECK(v >= 1) << "schedule " << printable(name, false) << ": " << key << " must be >= 1 (got " << v << "); set "
                              << n.set(key, "1") << " or more";
  if (name == "gpipe" || name == "1f1b" || name == "zb-h1") {
    TROUPE_USER_CHECK(V == 1) << "schedule " << name << " runs one chunk per stage; set " << n.set(n.chunks, "1")
                              << " or use " << n.set(n.schedule, "interleaved") << " for " << V << " chunks";
    if (name == "gpipe") return schedule_gpipe(P, M);
    if (name == "1f1b") return schedule_1f1b(P, M);
    return schedule_zb_h1(P, M);
  }
  if (name == "interleaved") return schedule_interleaved(P, M, V, n);
  TROUPE_USER_CHECK(name.find('/') != std::string::npos || name.find('.') != std::string::npos)
      << "unknown schedule '" << name << "'; use gpipe, 1f1b, interleaved, zb-h1 or a path to a schedule file";
  Schedule s = read_schedule(name);
  // the file's own faults first: a typo (F4 for F3) also changes the M it seems to use, and
  // "set microbatches = 5" would not mend it (trial 59, L3)
  validate_schedule(s);
  TROUPE_USER_CHECK(s.P == P) << "schedule file " << name << " has " << s.P << " rows (stages) but "
                              << n.set(n.stages, std::to_string(P)) << "; set " << n.set(n.stages, std::to_string(s.P))
                              << ", or give the file one row per stage";
  TROUPE_USER_CHECK(s.M == M) << "schedule file " << name << " uses " << s.M
                              << (s.M == 1 ? " microbatch" : " microbatches") << " but "
                              << n.set(n.microbatches, std::to_string(M)) << "; set "
                              << n.set_microbatches(s.M) << ", or write the file for " << M << " (F0..F"
                              << M - 1 << " on every row)";
  TROUPE_USER_CHECK(s.V == V) << "schedule file " << name << " uses " << s.V << " chunks but "
                              << n.set(n.chunks, std::to_string(V)) << "; set " << n.set(n.chunks, std::to_string(s.V))
                              << ", or write the file for " << V << " chunks";
  return s;
}

std::vector<Action> schedule_forward_only(int M, int V) {
  std::vector<Action> a;
  for (int c = 0; c < V; ++c)
    for (int m = 0; m < M; ++m) a.push_back({Action::F, m, c});
  return a;
}

std::string to_string(const Action& a) {
  // (appended in place: GCC 12's -Wrestrict misfires on string + string temporaries here)
  std::string s(1, (char)a.kind);
  s.append(std::to_string(a.mb));
  if (a.chunk) s.append(1, 'c').append(std::to_string(a.chunk));
  return s;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (auto& a : actions) {
    if (!s.empty()) s.push_back(' ');
    s.append(to_string(a));
  }
  return s;
}

namespace {
// The fix for a stage list that lacks, repeats or misorders an action (a schedule file's: the
// built-in schedules pass these checks by construction).
constexpr const char* kListFix =
    "; list each F<m> and B<m> of every microbatch once per stage (and W<m> when the file splits the backward), "
    "each B after its F, each W after its B (troupe simulate --schedule 1f1b --stages P --microbatches M --dump "
    "FILE writes a valid file to edit)";
}  // namespace

void validate_schedule(const Schedule& sc) {
  const int P = sc.P, M = sc.M, V = sc.V, PV = P * V;
  TROUPE_USER_CHECK(P >= 1 && M >= 1 && V >= 1) << "schedule " << sc.name << ": P, M and V must be >= 1";
  TROUPE_USER_CHECK((int)sc.stages.size() == P)
      << "schedule " << sc.name << " has " << sc.stages.size() << " stage lists for " << P << " stages";
  // 1. every action exactly once, in range, and in order on its own stage
  for (int s = 0; s < P; ++s) {
    std::map<std::tuple<char, int, int>, int> seen;
    for (size_t i = 0; i < sc.stages[s].size(); ++i) {
      const Action& a = sc.stages[s][i];
      TROUPE_USER_CHECK(a.kind == Action::F || a.kind == Action::B || a.kind == Action::W)
          << "schedule " << sc.name << ": stage " << s << " has an action of unknown kind";
      TROUPE_USER_CHECK(a.mb >= 0 && a.mb < M) << "schedule " << sc.name << ": stage " << s << " action " << to_string(a)
                                               << " names microbatch " << a.mb << ", outside [0, " << M << ")";
      TROUPE_USER_CHECK(a.chunk >= 0 && a.chunk < V) << "schedule " << sc.name << ": stage " << s << " action "
                                                     << to_string(a) << " names chunk " << a.chunk << ", outside [0, "
                                                     << V << ")";
      TROUPE_USER_CHECK(a.kind != Action::W || sc.split_backward)
          << "schedule " << sc.name << ": stage " << s << " has " << to_string(a) << " but the schedule has no split backward";
      TROUPE_USER_CHECK((seen[{(char)a.kind, a.mb, a.chunk}]++ == 0))
          << "schedule " << sc.name << ": stage " << s << " repeats " << to_string(a) << " (position " << i << ")" << kListFix;
      if (a.kind == Action::B) {
        TROUPE_USER_CHECK((seen.count({'F', a.mb, a.chunk}) > 0))
            << "schedule " << sc.name << ": stage " << s << " runs " << to_string(a) << " before its forward "
            << to_string(Action{Action::F, a.mb, a.chunk}) << kListFix;
      }
      if (a.kind == Action::W) {
        TROUPE_USER_CHECK((seen.count({'B', a.mb, a.chunk}) > 0))
            << "schedule " << sc.name << ": stage " << s << " runs " << to_string(a) << " before its backward "
            << to_string(Action{Action::B, a.mb, a.chunk}) << kListFix;
      }
    }
    for (int c = 0; c < V; ++c)
      for (int m = 0; m < M; ++m)
        for (char k : {'F', 'B', 'W'}) {
          if (k == 'W' && !sc.split_backward) continue;
          TROUPE_USER_CHECK((seen.count({k, m, c}) > 0))
              << "schedule " << sc.name << ": stage " << s << " is missing "
              << to_string(Action{(Action::Kind)k, m, c}) << kListFix;
        }
  }
  // 2. no deadlock: run the lists against their data dependencies
  std::vector<std::vector<char>> fdone(PV, std::vector<char>(M)), bdone(PV, std::vector<char>(M));
  std::vector<size_t> pos(P, 0);
  size_t total = 0, done = 0;
  for (auto& l : sc.stages) total += l.size();
  auto blocker = [&](int s, const Action& a) -> std::string {
    const int v = a.chunk * P + s;
    if (a.kind == Action::F && v > 0 && !fdone[v - 1][a.mb])
      return "the activation of microbatch " + std::to_string(a.mb) + " from stage " + std::to_string((v - 1) % P) +
             " (chunk " + std::to_string((v - 1) / P) + ")";
    if (a.kind == Action::B && v < PV - 1 && !bdone[v + 1][a.mb])
      return "the output gradient of microbatch " + std::to_string(a.mb) + " from stage " + std::to_string((v + 1) % P) +
             " (chunk " + std::to_string((v + 1) / P) + ")";
    return "";
  };
  while (done < total) {
    bool progress = false;
    for (int s = 0; s < P; ++s) {
      while (pos[s] < sc.stages[s].size()) {
        const Action& a = sc.stages[s][pos[s]];
        if (!blocker(s, a).empty()) break;
        const int v = a.chunk * P + s;
        if (a.kind == Action::F) fdone[v][a.mb] = 1;
        if (a.kind == Action::B) bdone[v][a.mb] = 1;
        ++pos[s];
        ++done;
        progress = true;
      }
    }
    if (!progress) {
      std::ostringstream os;
      os << "schedule " << sc.name << " deadlocks:";
      for (int s = 0; s < P; ++s)
        if (pos[s] < sc.stages[s].size()) {
          const Action& a = sc.stages[s][pos[s]];
          os << " stage " << s << " waits at " << to_string(a) << " (position " << pos[s] << ") for " << blocker(s, a)
             << ";";
        }
      os << " reorder the lists so every action's input is produced before it is awaited";
      throw UserError(os.str());
    }
  }
}

namespace {
// One pipeline message between two physical stages: an activation ('A') or an output
// gradient ('G') of microbatch mb, from virtual stage `from`.
struct P2pMessage {
  char kind;
  int mb, from;
  bool operator==(const P2pMessage&) const = default;
};

std::string describe(const P2pMessage& m, int P) {
  return std::string(m.kind == 'A' ? "the activation" : "the output gradient") + " of microbatch " +
         std::to_string(m.mb) + " (chunk " + std::to_string(m.from / P) + ")";
}
}  // namespace

std::string p2p_order_disagreement(const Schedule& sc) {
  const int P = sc.P, PV = sc.P * sc.V;
  // per ordered pair (a -> b), a's sends in a's list order and b's receives in b's list order
  std::map<std::pair<int, int>, std::vector<P2pMessage>> sent, received;
  for (int s = 0; s < P; ++s)
    for (const Action& a : sc.stages[s]) {
      const int v = a.chunk * P + s;
      if (a.kind == Action::F) {
        if (v + 1 < PV) sent[{s, (v + 1) % P}].push_back({'A', a.mb, v});
        if (v > 0) received[{(v - 1) % P, s}].push_back({'A', a.mb, v - 1});
      } else if (a.kind == Action::B) {
        if (v > 0) sent[{s, (v - 1) % P}].push_back({'G', a.mb, v});
        if (v + 1 < PV) received[{(v + 1) % P, s}].push_back({'G', a.mb, v + 1});
      }
    }
  for (const auto& [pair, out] : sent) {
    const auto [a, b] = pair;
    if (a == b) continue;  // a stage's chunk to its own next chunk: no transport
    const std::vector<P2pMessage>& in = received[pair];
    for (size_t i = 0; i < out.size() && i < in.size(); ++i)
      if (!(out[i] == in[i]))
        return "stage " + std::to_string(a) + "'s message " + std::to_string(i + 1) + " to stage " + std::to_string(b) +
               " is " + describe(out[i], P) + ", but stage " + std::to_string(b) + " awaits " + describe(in[i], P) +
               " as its message " + std::to_string(i + 1) + " from stage " + std::to_string(a);
  }
  return "";
}

void validate_p2p_order(const Schedule& sc, const std::string& why) {
  const std::string d = p2p_order_disagreement(sc);
  TROUPE_USER_CHECK(d.empty()) << "schedule " << sc.name << " cannot run " << why << ": " << d
                               << "; a transport that matches sends and receives in order per pair of ranks (NCCL) "
                               << "would pair the wrong tensors or wait forever. Reorder the lists so that each "
                               << "stage receives from a neighbour in the order that neighbour sends (as the built-in "
                               << "schedules do)";
}

std::string format_schedule(const Schedule& s) {
  std::ostringstream os;
  os << "# troupe pipeline schedule v1: " << s.name << ", stages P=" << s.P << ", microbatches M=" << s.M
     << ", chunks V=" << s.V << "\n";
  os << "# one row per stage, one action per cell: F<m>, B<m>" << (s.split_backward ? ", W<m>" : "")
     << " (add c<chunk> for chunk > 0)\n";
  for (auto& row : s.stages) {
    for (size_t i = 0; i < row.size(); ++i) os << (i ? "," : "") << to_string(row[i]);
    os << "\n";
  }
  return os.str();
}

Schedule parse_schedule(const std::string& text, const std::string& name) {
  Schedule s;
  s.name = name;
  std::istringstream is(text);
  std::string line;
  int lineno = 0, maxm = -1, maxc = -1;
  while (std::getline(is, line)) {
    ++lineno;
    // a UTF-8 byte-order mark (an editor's) is invisible: skipped, as the corpus reader does
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::vector<Action> row;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) {
      cell.erase(0, cell.find_first_not_of(" \t\r"));
      cell.erase(cell.find_last_not_of(" \t\r") + 1);
      if (cell.empty()) continue;
      Action a{Action::F, 0, 0};
      char k = cell[0];
      bool ok = (k == 'F' || k == 'B' || k == 'W') && cell.size() >= 2;
      size_t i = 1, n = 0;
      if (ok) {
        ok = false;
        while (i < cell.size() && isdigit((unsigned char)cell[i]) && n < 7) a.mb = a.mb * 10 + (cell[i++] - '0'), ++n;
        ok = n > 0 && (i == cell.size() || !isdigit((unsigned char)cell[i]));
        if (ok && i < cell.size()) {
          ok = cell[i++] == 'c';
          size_t nc = 0;
          while (ok && i < cell.size() && isdigit((unsigned char)cell[i]) && nc < 4) a.chunk = a.chunk * 10 + (cell[i++] - '0'), ++nc;
          ok = ok && nc > 0 && i == cell.size();
        }
      }
      TROUPE_USER_CHECK(ok) << "schedule file " << name << " line " << lineno << ": cannot read cell '"
                            << printable(cell, false, 32) << "'; write F<m>, B<m> or W<m>, with c<chunk> for chunks > 0 (e.g. F3, B2c1)";
      a.kind = (Action::Kind)k;
      if (k == 'W') s.split_backward = true;
      maxm = std::max(maxm, a.mb);
      maxc = std::max(maxc, a.chunk);
      row.push_back(a);
    }
    s.stages.push_back(std::move(row));
    check_schedule_size("schedule file " + name, (int64_t)s.stages.size(), maxm + 1, maxc + 1);
  }
  TROUPE_USER_CHECK(!s.stages.empty()) << "schedule file " << name << " has no rows; write one row of actions per stage";
  s.P = (int)s.stages.size();
  s.M = maxm + 1;
  s.V = maxc + 1;
  TROUPE_USER_CHECK(s.M >= 1) << "schedule file " << name << " has no actions";
  return s;
}

Schedule read_schedule(const std::string& path) {
  std::error_code ec;
  TROUPE_USER_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec))
      << "schedule file '" << printable(path, false, 200) << "' is not a regular file; pass a file written by "
      << "`troupe simulate --schedule 1f1b ... --dump FILE`";
  std::ifstream in(path);
  const int err = errno;
  if (!in.good()) {  // a file this user may not read, or one behind a folder it may not enter, is not missing
    const std::string why = missing_reason(path);
    if (why.rfind("cannot be reached", 0) == 0)
      TROUPE_USER_FAIL() << "schedule file '" << printable(path, false, 200) << "' " << why
                         << " write one with `troupe simulate --schedule 1f1b ... --dump FILE`";
    TROUPE_USER_CHECK(err != EACCES) << "schedule file '" << printable(path, false, 200) << "' cannot be read ("
                                     << std::strerror(EACCES) << "); give the user who runs troupe read permission "
                                     << "on it (chmod a+r) or copy it";
    if (why != "exists")
      TROUPE_USER_FAIL() << "schedule file '" << printable(path, false, 200) << "' " << why
                         << " write one with `troupe simulate --schedule 1f1b ... --dump FILE`";
  }
  TROUPE_USER_CHECK(in.good()) << "schedule file '" << path << "' cannot be read (" << std::strerror(err)
                               << "); write one with `troupe simulate --schedule 1f1b ... --dump FILE`";
  in.seekg(0, std::ios::end);
  const auto size = (int64_t)in.tellg();
  in.close();
  TROUPE_USER_CHECK(size <= (64 << 20)) << "schedule file '" << printable(path, false, 200) << "' has " << size
                                        << " bytes, more than a schedule within the limits needs (64 MiB); pass a "
                                           "schedule file written by troupe simulate --dump";
  // (a read that fails, /proc/self/mem's EIO, is named: an istream would read it as empty)
  const std::string text = read_file_checked(path, "schedule file", "write one with `troupe simulate --schedule "
                                                                    "1f1b ... --dump FILE`", 64u << 20);
  TROUPE_USER_CHECK(text.size() <= (64u << 20)) << "schedule file '" << printable(path, false, 200)
                                                << "' holds more than a schedule within the limits needs (64 MiB); "
                                                   "pass a schedule file written by troupe simulate --dump";
  return parse_schedule(text, path);
}

}  // namespace troupe
