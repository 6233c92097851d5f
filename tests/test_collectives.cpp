// collectives/: every op against a plain reference (ascending-rank fp32 reduction, so
// bitwise), uneven sizes including sizes smaller than the group, a peer that never
// arrives, mismatched calls; core/topology.h group tables.
#include <algorithm>
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "collectives/communicator.h"
#include "core/error.h"
#include "core/topology.h"

using namespace troupe;

namespace {
std::vector<float> data_of(int rank, size_t n) {
  std::mt19937 g(1000 + rank);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
// Runs fn(rank, comm) on one thread per rank; rethrows the first error. (Catch2 v2's
// assertions are not thread-safe: threads record failures in `bad`, checked afterwards.)
void run_group(int n, const std::function<void(int, Communicator&)>& fn, const std::string& name = "test group") {
  auto comms = make_local_group(n, name);
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> err(n);
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        fn(r, *comms[r]);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}
}  // namespace

#define EXPECT(cond) \
  if (!(cond)) ++bad

TEST_CASE("all_reduce, reduce_scatter, all_gather, broadcast match the reference bitwise", "[collectives]") {
  for (int n : {1, 2, 3, 4})
    for (size_t count : {size_t(0), size_t(1), size_t(3), size_t(1000), size_t(4099)}) {
      INFO("group " << n << " count " << count);
      // reference, ascending rank in fp32
      std::vector<float> sum(count, 0.f), mx(count);
      for (int r = 0; r < n; ++r) {
        auto d = data_of(r, count);
        for (size_t i = 0; i < count; ++i) {
          sum[i] = r == 0 ? d[i] : sum[i] + d[i];
          mx[i] = r == 0 ? d[i] : std::max(mx[i], d[i]);
        }
      }
      std::atomic<int> bad{0};
      run_group(n, [&](int r, Communicator& c) {
        auto buf = data_of(r, count);
        c.all_reduce(buf.data(), count, ReduceOp::sum, 10);
        EXPECT(std::memcmp(buf.data(), sum.data(), count * 4) == 0);
        buf = data_of(r, count);
        c.all_reduce(buf.data(), count, ReduceOp::max, 10);
        EXPECT(std::memcmp(buf.data(), mx.data(), count * 4) == 0);
        // reduce_scatter: each rank contributes n*count, gets its chunk of the sum
        auto in = data_of(r, count * n);
        std::vector<float> out(count);
        c.reduce_scatter(in.data(), out.data(), count, ReduceOp::sum, 10);
        for (size_t i = 0; i < count; ++i) {
          float ref = 0;
          for (int q = 0; q < n; ++q) {
            float x = data_of(q, count * n)[(size_t)r * count + i];
            ref = q == 0 ? x : ref + x;
          }
          EXPECT(out[i] == ref);
        }
        auto mine = data_of(r, count);
        std::vector<float> all(count * n);
        c.all_gather(mine.data(), all.data(), count, 10);
        for (int q = 0; q < n; ++q) EXPECT(std::memcmp(all.data() + q * count, data_of(q, count).data(), count * 4) == 0);
        auto b = data_of(r, count);
        c.broadcast(b.data(), count, n - 1, 10);
        EXPECT(std::memcmp(b.data(), data_of(n - 1, count).data(), count * 4) == 0);
        c.barrier(10);
      });
      CHECK(bad == 0);
    }
}

TEST_CASE("reduce_scatter_v: buckets of any split give the bits of one reduce_scatter, in place or not",
          "[collectives][overlap]") {
  // A buffer of n*S elements cut into buckets (optimizer/grad_buckets.h) at every split below;
  // each bucket reduce-scattered with the part of each rank's slice [r*S, (r+1)*S) inside
  // it (zeros included) must leave every rank the bits one reduce_scatter of S gives it.
  for (int n : {1, 2, 3, 4})
    for (size_t S : {size_t(1), size_t(7), size_t(1000)}) {
      INFO("group " << n << " slice " << S);
      const size_t total = S * n;
      std::vector<std::vector<size_t>> cuts = {{0, total}, {0, 1, total}, {0, S / 2, S + 1, total}};
      std::vector<size_t> every;  // a bucket of 3 elements at a time: many zero counts
      for (size_t i = 0; i < total; i += 3) every.push_back(i);
      every.push_back(total);
      cuts.push_back(every);
      std::atomic<int> bad{0};
      run_group(n, [&](int r, Communicator& c) {
        const auto in = data_of(r, total);
        std::vector<float> one(S);
        c.reduce_scatter(in.data(), one.data(), S, ReduceOp::sum, 10);
        for (const auto& cut : cuts)
          for (bool in_place : {false, true}) {
            std::vector<float> buf = in, out(S, NAN);
            for (size_t b = 0; b + 1 < cut.size(); ++b) {
              const size_t lo = std::min(cut[b], total), hi = std::min(cut[b + 1], total);
              if (lo >= hi) continue;
              std::vector<size_t> counts(n);
              for (int q = 0; q < n; ++q) {
                const size_t a = std::clamp(q * S, lo, hi), e = std::clamp((q + 1) * S, lo, hi);
                counts[q] = e - a;
              }
              const size_t mine = std::clamp(r * S, lo, hi);
              float* dst = in_place ? buf.data() + mine : out.data() + (counts[r] ? mine - r * S : 0);
              c.reduce_scatter_v(buf.data() + lo, dst, counts, ReduceOp::sum, 10);
            }
            const float* got = in_place ? buf.data() + r * S : out.data();
            EXPECT(std::memcmp(got, one.data(), S * sizeof(float)) == 0);
          }
      });
      CHECK(bad == 0);
    }
}

TEST_CASE("send/recv and async all_reduce", "[collectives]") {
  std::atomic<int> bad{0};
  run_group(3, [&](int r, Communicator& c) {
    auto d = data_of(r, 17);
    c.send(d.data(), d.size(), (r + 1) % 3, 7, 10);
    std::vector<float> got(17);
    c.recv(got.data(), got.size(), (r + 2) % 3, 7, 10);
    EXPECT(got == data_of((r + 2) % 3, 17));
    auto buf = data_of(r, 100);
    auto w = c.all_reduce_async(buf.data(), buf.size(), ReduceOp::sum, 10);
    w->wait(10);
    float ref = data_of(0, 100)[5] + data_of(1, 100)[5];
    ref += data_of(2, 100)[5];
    EXPECT(buf[5] == ref);
  });
  CHECK(bad == 0);
}

TEST_CASE("a peer that never arrives fails by the deadline, naming the op and group", "[collectives]") {
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_group(
                        3,
                        [](int r, Communicator& c) {
                          if (r == 2) return;  // never arrives
                          std::vector<float> b(8, 1.f);
                          c.all_reduce(b.data(), 8, ReduceOp::sum, 0.3);
                        },
                        "tp group of (dp 0, pp 1)"),
                    Catch::Contains("all_reduce on tp group of (dp 0, pp 1)") && Catch::Contains("rank(s) 2 did not arrive"));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5);
  CHECK_THROWS_WITH(run_group(2,
                              [](int r, Communicator& c) {
                                std::vector<float> b(8, 1.f), o(16);
                                if (r == 0) c.all_reduce(b.data(), 8, ReduceOp::sum, 2);
                                else c.all_gather(b.data(), o.data(), 8, 2);
                              }),
                    Catch::Contains("called"));
  CHECK_THROWS_WITH(run_group(2,
                              [](int r, Communicator& c) {
                                std::vector<float> b(4);
                                if (r == 0) c.recv(b.data(), 4, 1, 3, 0.2);
                              }),
                    Catch::Contains("recv on test group") && Catch::Contains("nothing from rank 1"));
}

TEST_CASE("topology: Megatron's rank ordering and group tables", "[collectives][topology]") {
  Topology t(2, 4, 2);  // dp 2, pp 4, tp 2: the 16-GPU example of Megatron's parallel_state.py
  REQUIRE(t.world() == 16);
  CHECK(t.tp_groups() == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(t.pp_groups() == std::vector<std::vector<int>>{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(t.dp_groups() == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  for (int r = 0; r < 16; ++r) CHECK(t.rank(t.coord(r)) == r);
  CHECK(t.coord(7) == Coord{1, 1, 1});
  CHECK(t.tp_group_name(6) == "tp group of (dp 1, pp 1)");
  CHECK_THROWS_AS(Topology(0, 1, 1), UserError);
}

TEST_CASE("placement: tp-first keeps TP groups inside a process, pp-first keeps pipeline columns", "[topology][launch]") {
  Topology t(2, 2, 2);  // 8 workers
  auto tp = place(t, 4, "tp-first");
  REQUIRE(tp.size() == 4);
  for (auto& g : t.tp_groups()) {  // every TP group lies in one process
    int owner = -1;
    for (size_t p = 0; p < tp.size(); ++p)
      if (std::count(tp[p].begin(), tp[p].end(), g[0])) owner = (int)p;
    for (int r : g) CHECK(std::count(tp[owner].begin(), tp[owner].end(), r) == 1);
  }
  auto pp = place(t, 4, "pp-first");
  for (auto& g : t.pp_groups()) {  // every pipeline column lies in one process
    int owner = -1;
    for (size_t p = 0; p < pp.size(); ++p)
      if (std::count(pp[p].begin(), pp[p].end(), g[0])) owner = (int)p;
    for (int r : g) CHECK(std::count(pp[owner].begin(), pp[owner].end(), r) == 1);
  }
  size_t n = 0;
  for (auto& p : tp) n += p.size();
  CHECK(n == 8);
  CHECK(describe_placement(t, tp).find("process 3:") != std::string::npos);
  CHECK_THROWS_WITH(place(t, 3, "tp-first"), Catch::Contains("must divide"));
  CHECK_THROWS_WITH(place(t, 2, "random"), Catch::Contains("tp-first"));
}
