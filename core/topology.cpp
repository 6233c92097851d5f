#include "core/topology.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace troupe {

Topology::Topology(int dp, int pp, int tp) : dp_(dp), pp_(pp), tp_(tp) {
  TROUPE_USER_CHECK(dp >= 1 && pp >= 1 && tp >= 1)
      << "parallel degrees must be >= 1 (got dp " << dp << ", pp " << pp << ", tp " << tp << ")";
}

Coord Topology::coord(int rank) const {
  TROUPE_CHECK(rank >= 0 && rank < world()) << "rank " << rank << " outside [0, " << world() << ")";
  return {(rank / tp_) % dp_, rank / (tp_ * dp_), rank % tp_};
}

std::vector<int> Topology::tp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int t = 0; t < tp_; ++t) g.push_back(rank({c.dp, c.pp, t}));
  return g;
}
std::vector<int> Topology::dp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int d = 0; d < dp_; ++d) g.push_back(rank({d, c.pp, c.tp}));
  return g;
}
std::vector<int> Topology::pp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int p = 0; p < pp_; ++p) g.push_back(rank({c.dp, p, c.tp}));
  return g;
}

namespace {
template <class F>
std::vector<std::vector<int>> all_groups(int world, F group_of) {
  std::set<std::vector<int>> seen;
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world; ++r) {
    auto g = group_of(r);
    if (seen.insert(g).second) out.push_back(g);
  }
  return out;
}
}  // namespace

std::vector<std::vector<int>> Topology::tp_groups() const {
  return all_groups(world(), [&](int r) { return tp_group(r); });
}
std::vector<std::vector<int>> Topology::dp_groups() const {
  return all_groups(world(), [&](int r) { return dp_group(r); });
}
std::vector<std::vector<int>> Topology::pp_groups() const {
  return all_groups(world(), [&](int r) { return pp_group(r); });
}

std::string Topology::tp_group_name(int r) const {
  Coord c = coord(r);
  return "tp group of (dp " + std::to_string(c.dp) + ", pp " + std::to_string(c.pp) + ")";
}
std::string Topology::dp_group_name(int r) const {
  Coord c = coord(r);
  return "dp group of (pp " + std::to_string(c.pp) + ", tp " + std::to_string(c.tp) + ")";
}

std::vector<std::vector<int>> place(const Topology& t, int nprocs, const std::string& rule) {
  const int W = t.world();
  TROUPE_USER_CHECK(nprocs >= 1 && W % nprocs == 0)
      << "cannot place " << W << " workers (DP " << t.dp() << " x PP " << t.pp() << " x TP " << t.tp() << ") on "
      << nprocs << " processes: the process count must divide the worker count";
  TROUPE_USER_CHECK(rule == "tp-first" || rule == "pp-first")
      << "placement rule '" << rule << "' is unknown; use \"tp-first\" or \"pp-first\"";
  const int per = W / nprocs;
  std::vector<int> order;  // ranks in the order they fill processes
  if (rule == "tp-first") {
    for (int r = 0; r < W; ++r) order.push_back(r);
  } else {
    for (int d = 0; d < t.dp(); ++d)
      for (int tp = 0; tp < t.tp(); ++tp)
        for (int pp = 0; pp < t.pp(); ++pp) order.push_back(t.rank({d, pp, tp}));
  }
  std::vector<std::vector<int>> procs(nprocs);
  for (int i = 0; i < W; ++i) procs[i / per].push_back(order[i]);
  for (auto& p : procs) std::sort(p.begin(), p.end());
  return procs;
}

std::string describe_placement(const Topology& t, const std::vector<std::vector<int>>& procs) {
  std::string out;
  for (size_t p = 0; p < procs.size(); ++p) {
    out += "process " + std::to_string(p) + ":";
    for (int r : procs[p]) {
      const Coord c = t.coord(r);
      out += " " + std::to_string(r) + "(dp" + std::to_string(c.dp) + " pp" + std::to_string(c.pp) + " tp" +
             std::to_string(c.tp) + ")";
    }
    out += "\n";
  }
  return out;
}

}  // namespace troupe
