// core/topology.h — global rank <-> (dp, pp, tp) coordinates and the process groups
// derived from them, in Megatron-LM's ordering: tp fastest, then dp, then pp
// (megatron/core/parallel_state.py): rank = tp + TP * (dp + DP * pp).
// With 16 ranks, TP=2, PP=4 (so DP=2) this gives Megatron's documented groups:
//   TP groups [0,1] [2,3] ...; DP groups [0,2] [1,3] [4,6] ...; PP groups [0,4,8,12] [1,5,9,13] ...
#pragma once
#include <string>
#include <vector>

namespace troupe {

struct Coord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const Coord&) const = default;
};

class Topology {
 public:
  // Throws UserError when a degree is < 1.
  Topology(int dp, int pp, int tp);
  int world() const { return dp_ * pp_ * tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int rank(Coord c) const { return c.tp + tp_ * (c.dp + dp_ * c.pp); }
  Coord coord(int rank) const;
  // Ranks of the groups `rank` belongs to, in ascending group-rank order (the canonical
  // reduction order of every collective).
  std::vector<int> tp_group(int rank) const;
  std::vector<int> dp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;
  // All groups of one kind, e.g. every TP group.
  std::vector<std::vector<int>> tp_groups() const;
  std::vector<std::vector<int>> dp_groups() const;
  std::vector<std::vector<int>> pp_groups() const;
  // "tp group of (dp 0, pp 1)" — for error messages.
  std::string tp_group_name(int rank) const;
  std::string dp_group_name(int rank) const;

 private:
  int dp_, pp_, tp_;
};

// Placement of the world's workers on `nprocs` processes (groundwork for issue 6):
//   "tp-first": consecutive global ranks share a process, so a TP group (the chattiest:
//   collectives inside every layer) stays inside one process whenever ranks per process is
//   a multiple of TP — as Megatron places TP inside a node; then DP, then PP.
//   "pp-first": each process holds whole pipeline columns (stage-major), so pipeline
//   neighbours share memory and TP/DP collectives cross processes.
// Returns, for each process, its global ranks in ascending order. Throws UserError when
// nprocs < 1, does not divide the world, or the rule is unknown.
std::vector<std::vector<int>> place(const Topology& t, int nprocs, const std::string& rule);
// One line per process: "process 0: (dp 0, pp 0, tp 0..1)" style listing, for logs.
std::string describe_placement(const Topology& t, const std::vector<std::vector<int>>& procs);

}  // namespace troupe
