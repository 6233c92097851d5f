#include "stages/simulator.h"

#include <set>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cctype>
#include <limits>
#include <map>
#include <fmt/format.h>
#include "core/text.h"

#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace troupe {

namespace {
constexpr double kMaxCost = 1e12;
}  // namespace

Costs parse_costs(const std::string& spec) {
  Costs c;
  std::stringstream ss(spec);
  std::string item;
  bool w_set = false;
  std::set<std::string> seen;
  while (std::getline(ss, item, ',')) {
    // an empty item (f=1,,b=2) is a slip, as an empty value is (trial 62, L11)
    TROUPE_USER_CHECK(!item.empty()) << "--cost '" << printable(spec, false, 80)
                                     << "' has an empty item between its commas; write f=1,b=2 (keys f, b, w, p2p)";
    auto eq = item.find('=');
    TROUPE_USER_CHECK(eq != std::string::npos) << "--cost item '" << item << "' must look like f=1 (keys f, b, w, p2p)";
    std::string k = item.substr(0, eq);
    // the key first: its value's message names it (trial 55: ",,,=" said "--cost  = ''")
    TROUPE_USER_CHECK(!k.empty()) << "--cost item '" << item << "' has no key before '='; use f, b, w, p2p (e.g. f=1,b=2)";
    TROUPE_USER_CHECK(k == "f" || k == "b" || k == "w" || k == "p2p")
        << "--cost key '" << k << "' is unknown; use f, b, w, p2p";
    TROUPE_USER_CHECK(seen.insert(k).second) << "--cost " << k << " is given twice; give each of f, b, w, p2p once";
    // strtod, not stod: stod throws out_of_range for a tiny value (1e-320) that is a number;
    // an overflow (1e999) comes back infinite and meets the range check below
    const std::string text = item.substr(eq + 1);
    char* end = nullptr;
    // decimal only, as every number troupe reads (strtod also takes 0x10 and inf)
    TROUPE_USER_CHECK(text.find_first_of("xXpP") == std::string::npos)
        << "--cost " << k << " = '" << text << "': 0x numbers are not taken here; write the cost in decimal (e.g. "
        << k << "=1.5)";
    errno = 0;
    const double v = text.empty() || std::isspace((unsigned char)text[0]) ? NAN : std::strtod(text.c_str(), &end);
    TROUPE_USER_CHECK(end == text.c_str() + text.size()) << "--cost " << k << " = '" << text << "' is not a number";
    // an underflow past the subnormals (1e-400) comes back 0 with ERANGE: not the number written
    TROUPE_USER_CHECK(!(errno == ERANGE && v == 0)) << "--cost " << k << " = " << text
                                                    << " is too small for a double (it would be 0); write 0, or a "
                                                       "cost of at least 1e-300";
    // a schedule's makespan adds up to millions of costs: a bound keeps every sum finite
    TROUPE_USER_CHECK(v >= 0 && std::isfinite(v) && v <= kMaxCost)
        << "--cost " << k << " = " << item.substr(eq + 1) << " must be a finite number from 0 to " << kMaxCost
        << " (costs are relative: e.g. f=1,b=2)";
    const double v_pos = v + 0.0;  // -0 is 0 (printed as typed otherwise: "f=-0")
    if (k == "f") c.f = v_pos;
    else if (k == "b") c.b = v_pos;
    else if (k == "w") c.w = v_pos, w_set = true;
    else c.p2p = v_pos;
  }
  if (!w_set) c.w = c.b / 2;
  TROUPE_USER_CHECK(c.w <= c.b) << "--cost w = " << c.w << " is part of b = " << c.b << " and cannot exceed it";
  // all-zero compute: the bubble would be 0/0 (trial 32, F8)
  TROUPE_USER_CHECK(c.f > 0 || c.b > 0)
      << "--cost gives f = 0 and b = 0: the schedule would have no computation to keep busy, and its bubble would be "
         "0/0; give f or b a positive cost (e.g. f=1,b=2)";
  return c;
}

SimResult simulate(const Schedule& sc, const Costs& c) {
  const double share = 1.0 / sc.V;  // a chunk's part of its stage
  return simulate(
      sc,
      [&](int, const Action& a) {
        if (a.kind == Action::F) return c.f * share;
        if (a.kind == Action::W) return c.w * share;
        return (sc.split_backward ? c.b - c.w : c.b) * share;
      },
      c.p2p);
}

namespace {

// What a simulation knows while it runs: when each (virtual stage, microbatch) finished
// F and B (-1: not yet), each stage's stash count, and the result so far.
struct SimState {
  std::vector<std::vector<double>> fend, bend;
  std::vector<int> inflight;
  SimResult r;
  SimState(const Schedule& sc) : fend(sc.P * sc.V, std::vector<double>(sc.M, -1)), bend(fend), inflight(sc.P, 0) {
    r.busy.assign(sc.P, 0);
    r.peak_inflight.assign(sc.P, 0);
  }
  // When the input of action a of stage s is there (its producer's end, plus p2p from
  // another stage), 0 without input, -1 while the producer has not finished.
  double input_at(const Schedule& sc, int s, const Action& a, double p2p) const {
    const int P = sc.P, PV = P * sc.V, v = a.chunk * P + s;
    if (a.kind == Action::F && v > 0) {
      if (fend[v - 1][a.mb] < 0) return -1;
      return fend[v - 1][a.mb] + ((v - 1) % P != s ? p2p : 0);
    }
    if (a.kind == Action::B) {
      TROUPE_CHECK(fend[v][a.mb] >= 0) << "simulate: validate the schedule first";
      if (v < PV - 1) {
        if (bend[v + 1][a.mb] < 0) return -1;
        return bend[v + 1][a.mb] + ((v + 1) % P != s ? p2p : 0);
      }
    }
    return 0;
  }
  void finish(const Schedule& sc, int s, const Action& a, double start, double end) {
    const int v = a.chunk * sc.P + s;
    if (a.kind == Action::F) fend[v][a.mb] = end, r.peak_inflight[s] = std::max(r.peak_inflight[s], ++inflight[s]);
    if (a.kind == Action::B) bend[v][a.mb] = end;
    // the stash is held until the last action that reads it: B, or W in a split schedule
    if (a.kind == (sc.split_backward ? Action::W : Action::B)) --inflight[s];
    r.timeline.push_back({s, a, start, end});
    r.busy[s] += end - start;
    r.makespan = std::max(r.makespan, end);
  }
  SimResult result(int P) {
    double idle = 0;
    for (int s = 0; s < P; ++s) {
      r.bubble.push_back(r.makespan > 0 ? (r.makespan - r.busy[s]) / r.makespan : 0);
      idle += r.makespan - r.busy[s];
    }
    r.bubble_overall = r.makespan > 0 ? idle / (P * r.makespan) : 0;
    return std::move(r);
  }
};

size_t total_actions(const Schedule& sc) {
  size_t total = 0;
  for (auto& l : sc.stages) total += l.size();
  return total;
}

}  // namespace

SimResult simulate(const Schedule& sc, const std::function<double(int stage, const Action& a)>& cost_of, double p2p) {
  const int P = sc.P;
  SimState st(sc);
  std::vector<size_t> pos(P, 0);
  std::vector<double> free_at(P, 0);
  const size_t total = total_actions(sc);
  size_t done = 0;
  while (done < total) {
    bool progress = false;
    for (int s = 0; s < P; ++s) {
      while (pos[s] < sc.stages[s].size()) {
        const Action& a = sc.stages[s][pos[s]];
        const double in = st.input_at(sc, s, a, p2p);
        if (in < 0) break;
        const double ready = std::max(free_at[s], in);
        const double end = ready + cost_of(s, a);
        st.finish(sc, s, a, ready, end);
        free_at[s] = end;
        ++pos[s];
        ++done;
        progress = true;
      }
    }
    TROUPE_CHECK(progress) << "simulate: schedule " << sc.name << " deadlocks; validate it first";
  }
  return st.result(P);
}

SimResult simulate_shared(const Schedule& sc, const std::function<double(int stage, const Action& a)>& cost_of,
                          double p2p, const std::vector<double>& demand, double cores) {
  const int P = sc.P;
  TROUPE_CHECK((int)demand.size() == P && cores > 0) << "simulate_shared: one demand per stage and cores > 0";
  SimState st(sc);
  std::vector<size_t> pos(P, 0);
  std::vector<double> left(P, -1), started(P, 0), cost(P, 0);  // left < 0: the stage is not in an action
  const size_t total = total_actions(sc);
  size_t done = 0;
  double now = 0;
  while (done < total) {
    // start every action whose input is there; note the next arrival of a pending one
    double next_in = std::numeric_limits<double>::infinity();
    for (int s = 0; s < P; ++s) {
      if (left[s] >= 0 || pos[s] >= sc.stages[s].size()) continue;
      const double in = st.input_at(sc, s, sc.stages[s][pos[s]], p2p);
      if (in < 0) continue;
      if (in > now) next_in = std::min(next_in, in);
      else cost[s] = left[s] = cost_of(s, sc.stages[s][pos[s]]), started[s] = now;
    }
    double want = 0, next_end = std::numeric_limits<double>::infinity();
    for (int s = 0; s < P; ++s)
      if (left[s] >= 0) want += demand[s];
    const double rate = want > cores ? cores / want : 1.0;
    for (int s = 0; s < P; ++s)
      if (left[s] >= 0) next_end = std::min(next_end, left[s] / rate);
    TROUPE_CHECK(std::isfinite(std::min(next_end, next_in))) << "simulate: schedule " << sc.name
                                                              << " deadlocks; validate it first";
    const double dt = std::min(next_end, next_in - now);
    now = next_end < next_in - now ? now + next_end : next_in;
    for (int s = 0; s < P; ++s) {
      if (left[s] < 0) continue;
      left[s] = left[s] / rate <= dt * (1 + 1e-12) ? 0.0 : left[s] - dt * rate;
      if (left[s] > 1e-12 * cost[s]) continue;
      st.finish(sc, s, sc.stages[s][pos[s]], started[s], now);
      left[s] = -1;
      ++pos[s];
      ++done;
    }
  }
  return st.result(P);
}

std::string ascii_timeline(const Schedule& sc, const SimResult& r, int width) {
  // Scale so the shortest action gets at least one column (capped by `width`); a cell
  // shows the action that covers most of it.
  double shortest = r.makespan;
  for (auto& e : r.timeline)
    if (e.end > e.start) shortest = std::min(shortest, e.end - e.start);
  double scale = shortest > 0 ? 1.0 / shortest : 1.0;
  if (r.makespan * scale > width) scale = width / r.makespan;
  const int cols = std::max(1, (int)std::ceil(r.makespan * scale - 1e-9));
  std::vector<std::string> rows(sc.P, std::string(cols, '.'));
  std::vector<std::vector<double>> cover(sc.P, std::vector<double>(cols, 0.0));
  for (auto& e : r.timeline) {
    const double a = e.start * scale, b = e.end * scale;
    char ch = e.action.kind == Action::F ? char('0' + e.action.mb % 10)
              : e.action.kind == Action::B ? char('a' + e.action.mb % 26)
                                           : char('A' + e.action.mb % 26);
    for (int i = std::max(0, (int)std::floor(a)); i < cols && i < b; ++i) {
      const double part = std::min<double>(b, i + 1) - std::max<double>(a, i);
      if (part > cover[e.stage][i]) cover[e.stage][i] = part, rows[e.stage][i] = ch;
    }
  }
  std::ostringstream os;
  for (int s = 0; s < sc.P; ++s) os << "stage " << s << " |" << rows[s] << "|\n";
  os << "legend: digit = F(m mod 10), a-z = B(m mod 26), A-Z = W(m mod 26), . = idle";
  if (sc.V > 1) os << "; chunks are not told apart";
  os << "; 1 column = " << 1 / scale << " time units\n";
  return os.str();
}

std::string chrome_trace(const Schedule& sc, const SimResult& r) {
  // Written out directly: a DOM of 3 million events (1024 stages x 1024 microbatches, zb-h1)
  // took 8 GB and 29 s; this takes the size of the text.
  std::string out;
  out.reserve(64 + (size_t)sc.P * 110 + r.timeline.size() * 150);
  out += "{\"traceEvents\":[";
  for (int s = 0; s < sc.P; ++s)
    fmt::format_to(std::back_inserter(out),
                   "{}{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":\"stage {}\"}}}}",
                   s ? "," : "", s, s);
  for (auto& e : r.timeline)
    fmt::format_to(std::back_inserter(out),
                   ",{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{},\"dur\":{},"
                   "\"args\":{{\"microbatch\":{},\"chunk\":{}}}}}",
                   to_string(e.action), (char)e.action.kind, e.stage, e.start * 1000.0, (e.end - e.start) * 1000.0,
                   e.action.mb, e.action.chunk);
  // the schedule's name may be a file path: escaped by the JSON library
  out += "],\"displayTimeUnit\":\"ms\",\"otherData\":";
  out += nlohmann::json{{"schedule", sc.name}, {"P", sc.P}, {"M", sc.M}, {"V", sc.V}}.dump();
  out += "}";
  return out;
}

double activation_bytes_per_layer(int B, int T, int C, int NH) {
  const double BT = (double)B * T;
  return 4.0 * (BT * (16.0 * C + 4) + (double)B * NH * T * T);
}

}  // namespace troupe
