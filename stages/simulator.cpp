#include "stages/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>
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
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    TROUPE_USER_CHECK(eq != std::string::npos) << "--cost item '" << item << "' must look like f=1 (keys f, b, w, p2p)";
    std::string k = item.substr(0, eq);
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(item.substr(eq + 1), &used);
      TROUPE_USER_CHECK(used == item.size() - eq - 1) << "--cost " << k << " must be a number";
    } catch (const std::logic_error&) {
      throw UserError("--cost " + k + " = '" + item.substr(eq + 1) + "' is not a number");
    }
    // a schedule's makespan adds up to millions of costs: a bound keeps every sum finite
    TROUPE_USER_CHECK(v >= 0 && std::isfinite(v) && v <= kMaxCost)
        << "--cost " << k << " = " << item.substr(eq + 1) << " must be a finite number from 0 to " << kMaxCost
        << " (costs are relative: e.g. f=1,b=2)";
    if (k == "f") c.f = v;
    else if (k == "b") c.b = v;
    else if (k == "w") c.w = v, w_set = true;
    else if (k == "p2p") c.p2p = v;
    else throw UserError("--cost key '" + k + "' is unknown; use f, b, w, p2p");
  }
  if (!w_set) c.w = c.b / 2;
  TROUPE_USER_CHECK(c.w <= c.b) << "--cost w = " << c.w << " is part of b = " << c.b << " and cannot exceed it";
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

SimResult simulate(const Schedule& sc, const std::function<double(int stage, const Action& a)>& cost_of, double p2p) {
  const int P = sc.P, M = sc.M, V = sc.V, PV = P * V;
  Costs c;
  c.p2p = p2p;
  std::vector<std::vector<double>> fend(PV, std::vector<double>(M, -1)), bend(PV, std::vector<double>(M, -1));
  std::vector<size_t> pos(P, 0);
  std::vector<double> free_at(P, 0);
  SimResult r;
  r.busy.assign(P, 0);
  r.peak_inflight.assign(P, 0);
  std::vector<int> inflight(P, 0);
  size_t total = 0, done = 0;
  for (auto& l : sc.stages) total += l.size();
  while (done < total) {
    bool progress = false;
    for (int s = 0; s < P; ++s) {
      while (pos[s] < sc.stages[s].size()) {
        const Action& a = sc.stages[s][pos[s]];
        const int v = a.chunk * P + s;
        double ready = free_at[s];
        if (a.kind == Action::F && v > 0) {
          if (fend[v - 1][a.mb] < 0) break;
          ready = std::max(ready, fend[v - 1][a.mb] + ((v - 1) % P != s ? c.p2p : 0));
        }
        if (a.kind == Action::B) {
          if (v < PV - 1) {
            if (bend[v + 1][a.mb] < 0) break;
            ready = std::max(ready, bend[v + 1][a.mb] + ((v + 1) % P != s ? c.p2p : 0));
          }
          TROUPE_CHECK(fend[v][a.mb] >= 0) << "simulate: validate the schedule first";
        }
        const double end = ready + cost_of(s, a);
        if (a.kind == Action::F) fend[v][a.mb] = end, r.peak_inflight[s] = std::max(r.peak_inflight[s], ++inflight[s]);
        if (a.kind == Action::B) bend[v][a.mb] = end;
        // the stash is held until the last action that reads it: B, or W in a split schedule
        if (a.kind == (sc.split_backward ? Action::W : Action::B)) --inflight[s];
        r.timeline.push_back({s, a, ready, end});
        r.busy[s] += end - ready;
        free_at[s] = end;
        ++pos[s];
        ++done;
        progress = true;
      }
    }
    TROUPE_CHECK(progress) << "simulate: schedule " << sc.name << " deadlocks; validate it first";
  }
  for (double t : free_at) r.makespan = std::max(r.makespan, t);
  double idle = 0;
  for (int s = 0; s < P; ++s) {
    r.bubble.push_back(r.makespan > 0 ? (r.makespan - r.busy[s]) / r.makespan : 0);
    idle += r.makespan - r.busy[s];
  }
  r.bubble_overall = r.makespan > 0 ? idle / (P * r.makespan) : 0;
  return r;
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
  nlohmann::json ev = nlohmann::json::array();
  for (int s = 0; s < sc.P; ++s)
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", s}, {"args", {{"name", "stage " + std::to_string(s)}}}});
  for (auto& e : r.timeline) {
    std::string kind(1, (char)e.action.kind);
    ev.push_back({{"name", to_string(e.action)},
                  {"cat", kind},
                  {"ph", "X"},
                  {"pid", 0},
                  {"tid", e.stage},
                  {"ts", e.start * 1000.0},
                  {"dur", (e.end - e.start) * 1000.0},
                  {"args", {{"microbatch", e.action.mb}, {"chunk", e.action.chunk}}}});
  }
  nlohmann::json j = {{"traceEvents", ev}, {"displayTimeUnit", "ms"},
                      {"otherData", {{"schedule", sc.name}, {"P", sc.P}, {"M", sc.M}, {"V", sc.V}}}};
  return j.dump();
}

double activation_bytes_per_layer(int B, int T, int C, int NH) {
  const double BT = (double)B * T;
  return 4.0 * (BT * (16.0 * C + 4) + (double)B * NH * T * T);
}

}  // namespace troupe
