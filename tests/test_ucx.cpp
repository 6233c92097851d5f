// The UCX data plane (collectives/ucx.h) across real processes: each test forks its
// processes first (the children create their transports — UCX and every thread — only
// after the fork), exchanges the ucp worker addresses through pipes, and checks each
// child's exit status. Every wait is bounded: a child that outlives its limit is killed
// and the test fails.
//   1. point to point, 0 B .. 64 MiB, bit-exact, the recv posted before or after the
//      message arrives; a shape mismatch names both sides; also over UCX_TLS=tcp only;
//   2. every collective over 2 and 4 processes and over 4 ranks in 2 processes (mixed
//      local/remote) is bitwise identical to the in-process backend (make_local_group);
//      a size mismatch names both ranks;
//   3. a header signed with another secret is rejected (rejected()), the recv times out;
//   4. a recv from a peer that died or never sends throws within its deadline naming it
//      (and waiting costs no CPU);
//   5. abort() wakes blocked recvs at once (remote and local) and fails later calls;
//   6. on_arrival gets a Tensor of the header's shape with the payload, remote and local;
//   7. on_peer_lost is called once for a peer whose endpoint failed, after its grace, and
//      never after abort().
// (Where the transport listens: tests/test_hostile.cpp.)
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "collectives/ucx.h"

using namespace troupe;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int g_proc = -1;  // in a child: its process index

// In a child: report and fail (a child never uses Catch2's assertions).
#define EXPECT(cond)                                                                                 \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      std::fprintf(stderr, "[process %d] %s:%d: expected %s\n", g_proc, __FILE__, __LINE__, #cond);  \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)

// Runs f, which should throw troupe::Error; returns its message, or "(no error)".
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// CPU seconds used by this process so far (all threads).
double cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

bool write_all(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n) {
    const ssize_t k = ::write(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= (size_t)k;
  }
  return true;
}

bool read_all(int fd, void* p, size_t n, Clock::time_point deadline) {
  char* c = (char*)p;
  while (n) {
    const int ms = (int)std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (ms <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, ms) <= 0) return false;
    const ssize_t k = ::read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= (size_t)k;
  }
  return true;
}

struct Job {
  explicit Job(std::vector<int> por, std::vector<std::string> sec = {}, const char* t = nullptr)
      : process_of_rank(std::move(por)), secrets(std::move(sec)), tls(t) {}
  std::vector<int> process_of_rank;  // rank -> process; nprocs = max + 1
  std::vector<std::string> secrets;  // per process; default "job-secret" for all
  const char* tls = nullptr;         // UCX_TLS in the children
  double limit_s = 25;               // whole-job bound (the parent kills the children after it)
  bool watch_lost = false;           // the children note on_peer_lost's calls (g_lost)
};

// In a child with Job::watch_lost: the on_peer_lost calls, as "process: why" lines.
std::mutex g_lost_mu;
std::vector<std::string> g_lost;
std::vector<std::string> lost_calls() {
  std::lock_guard<std::mutex> lk(g_lost_mu);
  return g_lost;
}

using Body = std::function<int(int proc, std::shared_ptr<UcxTransport> t)>;

// Forks one child per process; each creates its transport, sends its address to the
// parent, gets everyone's, connects and runs body; returns the children's exit codes
// (-1: killed at the limit or by a signal).
std::vector<int> run_procs(const Job& job, const Body& body) {
  const int n = *std::max_element(job.process_of_rank.begin(), job.process_of_rank.end()) + 1;
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(n, -1);
  std::vector<int> up(n, -1), down(n, -1);  // child -> parent, parent -> child
  auto kill_all = [&] {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, SIGKILL);
  };
  for (int p = 0; p < n; ++p) {
    int a[2], b[2];
    REQUIRE(::pipe(a) == 0);
    REQUIRE(::pipe(b) == 0);
    const pid_t pid = ::fork();
    if (pid < 0) kill_all();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      g_proc = p;
      ::close(a[0]);
      ::close(b[1]);
      for (int q = 0; q < p; ++q) ::close(up[q]), ::close(down[q]);
      if (job.tls) ::setenv("UCX_TLS", job.tls, 1);
      int rc = 1;
      try {
        TransportOptions o;
        o.process = p;
        o.nprocs = n;
        o.secret = job.secrets.empty() ? "job-secret" : job.secrets[p];
        o.limits.world = (int32_t)job.process_of_rank.size();
        o.process_of_rank = job.process_of_rank;
        if (job.watch_lost) {
          o.peer_lost_grace_s = 0.3;
          o.on_peer_lost = [](int q, const std::string& why) {
            std::lock_guard<std::mutex> lk(g_lost_mu);
            g_lost.push_back(std::to_string(q) + ": " + why);
          };
        }
        auto t = std::make_shared<UcxTransport>(o);
        const auto addr = t->address();
        const uint32_t len = (uint32_t)addr.size();
        if (!write_all(a[1], &len, 4) || !write_all(a[1], addr.data(), len)) throw Error("address to the parent");
        std::vector<std::vector<uint8_t>> all(n);
        const auto deadline = Clock::now() + std::chrono::seconds(10);
        for (auto& x : all) {
          uint32_t l = 0;
          if (!read_all(b[0], &l, 4, deadline) || l > (1u << 20)) throw Error("addresses from the parent");
          x.resize(l);
          if (!read_all(b[0], x.data(), l, deadline)) throw Error("addresses from the parent");
        }
        t->connect(all);
        rc = body(p, t);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[process %d] %s\n", p, e.what());
        rc = 1;
      }
      std::fflush(stderr);
      ::_exit(rc);
    }
    pids[p] = pid;
    ::close(a[1]);
    ::close(b[0]);
    up[p] = a[0];
    down[p] = b[1];
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(job.limit_s));
  std::vector<std::vector<uint8_t>> addrs(n);
  bool ok = true;
  for (int p = 0; p < n && ok; ++p) {
    uint32_t l = 0;
    ok = read_all(up[p], &l, 4, deadline) && l < (1u << 20);
    if (ok) addrs[p].resize(l), ok = read_all(up[p], addrs[p].data(), l, deadline);
  }
  for (int p = 0; p < n && ok; ++p)
    for (auto& a : addrs) {
      const uint32_t l = (uint32_t)a.size();
      ok = ok && write_all(down[p], &l, 4) && write_all(down[p], a.data(), l);
    }
  if (!ok) kill_all();
  std::vector<int> codes(n, -1);
  int left = n;
  while (left > 0) {
    for (int p = 0; p < n; ++p) {
      if (pids[p] <= 0) continue;
      int st = 0;
      if (::waitpid(pids[p], &st, WNOHANG) == pids[p]) {
        codes[p] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        pids[p] = -1;
        --left;
      }
    }
    if (left > 0 && Clock::now() > deadline) {
      kill_all();
      for (int p = 0; p < n; ++p)
        if (pids[p] > 0) ::waitpid(pids[p], nullptr, 0), std::fprintf(stderr, "process %d killed at the limit\n", p);
      break;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int p = 0; p < n; ++p) ::close(up[p]), ::close(down[p]);
  return codes;
}

// Deterministic bytes for message `seed`.
void fill(void* p, size_t n, uint64_t seed) {
  auto* b = (uint8_t*)p;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(b + i, &x, std::min<size_t>(8, n - i));
  }
}

WireHeader header(uint8_t kind, int64_t step, int src, int dst, std::vector<int64_t> shape) {
  WireHeader h;
  h.kind = kind;
  h.step = step;
  h.microbatch = 1;
  h.chunk = 2;
  h.source = src;
  h.destination = dst;
  h.dtype = DType::f32;
  h.shape = shape;
  h.bytes = 4;
  for (auto d : shape) h.bytes *= (uint64_t)d;
  return h;
}

// Random floats of widely varied magnitude (so the summation order shows in the bits).
std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f), e(-4.f, 4.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g) * std::pow(10.f, e(g));
  return v;
}

}  // namespace

TEST_CASE("ucx: point to point 0 B .. 64 MiB arrives bit-exact, posted before or after arrival", "[ucx]") {
  const size_t sizes[] = {0, 4, 1u << 20, 64u << 20};
  for (const char* tls : {(const char*)nullptr, "tcp"}) {
    INFO("UCX_TLS=" << (tls ? tls : "(default)"));
    Job job({0, 1}, {}, tls);
    auto codes = run_procs(job, [&](int p, std::shared_ptr<UcxTransport> t) -> int {
      // round 0: the receiver is late (payloads wait in staging buffers);
      // round 1: the sender is late (payloads land in the posted buffers)
      for (int round = 0; round < 2; ++round) {
        for (size_t i = 0; i < 4; ++i) {
          const size_t n = sizes[i];
          const WireHeader h = header(kWireActivation, round * 10 + (int64_t)i, 0, 1, {(int64_t)(n / 4)});
          std::vector<uint8_t> buf(n + 1, 0xAB);
          if (p == 0) {
            if (round == 1 && i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            fill(buf.data(), n, h.step);
            t->send(h, buf.data(), 20);
          } else {
            if (round == 0 && i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            t->recv(h, buf.data(), 20);
            std::vector<uint8_t> want(n + 1, 0xAB);
            fill(want.data(), n, h.step);
            EXPECT(std::memcmp(buf.data(), want.data(), n + 1) == 0);  // and not a byte more
          }
        }
      }
      // the other direction, and a recv that expects another shape than was sent
      float x[12] = {};
      if (p == 1) {
        x[0] = 42.f;
        t->send(header(kWireGradient, 7, 1, 0, {1}), x, 20);
        t->send(header(kWireGradient, 8, 1, 0, {10}), x, 20);
      } else {
        t->recv(header(kWireGradient, 7, 1, 0, {1}), x, 20);
        EXPECT(x[0] == 42.f);
        const std::string e = error_of([&] { t->recv(header(kWireGradient, 8, 1, 0, {12}), x, 20); });
        EXPECT(contains(e, "rank 1 sent f32 [10] (40 bytes) but rank 0 expects f32 [12] (48 bytes)"));
        EXPECT(contains(e, "gradient (step 8, microbatch 1, chunk 2)"));
      }
      EXPECT(t->rejected() == 0);
      return 0;
    });
    CHECK(codes == std::vector<int>{0, 0});
  }
}

namespace {

constexpr double kT = 20;  // seconds: deadline of every collective in the tests

// Runs the same sequence of collectives on group rank r (inputs seeded by the rank) and
// returns every output, concatenated.
std::vector<float> sequence(Communicator& c) {
  const int n = c.size(), r = c.rank();
  std::vector<float> out;
  auto keep = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
  uint32_t seed = 1000 * (uint32_t)r;
  for (size_t count : {1001ul, 3ul, 1ul << 20}) {  // odd, fewer than ranks, 4 MiB (rendezvous)
    auto a = random_floats(count, ++seed);
    c.all_reduce(a.data(), count, ReduceOp::sum, kT);
    keep(a);
    auto b = random_floats(count, ++seed);
    c.all_reduce(b.data(), count, ReduceOp::max, kT);
    keep(b);
  }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    auto in = random_floats(257 * n, ++seed);
    std::vector<float> o(257);
    c.reduce_scatter(in.data(), o.data(), 257, op, kT);
    keep(o);
  }
  auto g = random_floats(100, ++seed);
  std::vector<float> go(100 * n);
  c.all_gather(g.data(), go.data(), 100, kT);
  keep(go);
  auto bc = random_floats(333, ++seed);
  c.broadcast(bc.data(), 333, n - 1, kT);
  keep(bc);
  c.barrier(kT);
  for (int tag : {0, 5}) {  // a ring of point-to-point messages, twice per tag
    for (int k = 0; k < 2; ++k) {
      auto s = random_floats(50, ++seed);
      std::vector<float> in(50);
      c.send(s.data(), 50, (r + 1) % n, tag, kT);
      c.recv(in.data(), 50, (r + n - 1) % n, tag, kT);
      keep(in);
    }
  }
  return out;
}

// Every rank's sequence() on the in-process backend.
std::vector<std::vector<float>> local_reference(int n) {
  auto comms = make_local_group(n, "reference");
  std::vector<std::vector<float>> res(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back([&, r] { res[r] = sequence(*comms[r]); });
  for (auto& x : th) x.join();
  return res;
}

}  // namespace

TEST_CASE("ucx: collectives give bitwise the in-process backend's results over 2 and 4 processes", "[ucx]") {
  const std::vector<std::vector<int>> layouts = {{0, 1}, {0, 1, 2, 3}, {0, 0, 1, 1}, {0, 1, 0, 1}};
  for (const auto& por : layouts) {
    const int n = (int)por.size();
    std::string desc;
    for (int p : por) desc += std::to_string(p);
    INFO("process of each rank: " << desc);
    const bool mismatch_check = por == std::vector<int>{0, 1, 0, 1};
    auto codes = run_procs(Job(por), [&](int p, std::shared_ptr<UcxTransport> t) -> int {
      const auto ref = local_reference(n);
      std::vector<int> mine;
      for (int r = 0; r < n; ++r)
        if (por[r] == p) mine.push_back(r);
      std::vector<std::vector<float>> got(n);
      std::vector<std::string> errors(n);
      std::vector<std::thread> th;
      std::vector<int> all(n);
      for (int r = 0; r < n; ++r) all[r] = r;
      for (int r : mine)
        th.emplace_back([&, r] {
          try {
            auto c = make_ucx_communicator(t, all, r, 7, "test group");
            got[r] = sequence(*c);
            if (mismatch_check) {  // rank 0 reduces 101 elements, the others 100
              std::vector<float> v(101, 1.f);
              const auto t0 = Clock::now();
              errors[r] = error_of([&] { c->all_reduce(v.data(), r == 0 ? 101 : 100, ReduceOp::sum, 1.5); });
              if (since(t0) > 4) errors[r] = "too slow: " + errors[r];
              // the group is broken now: later calls fail at once
              if (error_of([&] { c->barrier(10); }).find("broken") == std::string::npos) errors[r] += " not broken";
            }
          } catch (const std::exception& e) {
            errors[r] = std::string("unexpected: ") + e.what();
          }
        });
      for (auto& x : th) x.join();
      bool saw_mismatch = false;
      for (int r : mine) {
        if (!mismatch_check && !errors[r].empty()) std::fprintf(stderr, "[rank %d] %s\n", r, errors[r].c_str());
        EXPECT(mismatch_check || errors[r].empty());
        if (mismatch_check) std::fprintf(stderr, "[rank %d] size mismatch: %s\n", r, errors[r].c_str());
        EXPECT(got[r].size() == ref[r].size());
        EXPECT(std::memcmp(got[r].data(), ref[r].data(), ref[r].size() * sizeof(float)) == 0);
        if (mismatch_check) {
          EXPECT(!contains(errors[r], "unexpected") && !contains(errors[r], "too slow") && !contains(errors[r], "not broken"));
          EXPECT(contains(errors[r], "all_reduce on test group (rank " + std::to_string(r) + " of 4, call 11): "));
          // a rank names the size mismatch, or (when the peer that would have shown it gave up
          // first and left) that peer's failure or silence
          const bool names_both = contains(errors[r], " sent f32 [") && contains(errors[r], " expects f32 [");
          EXPECT(names_both || contains(errors[r], "failed") || contains(errors[r], "nothing from rank"));
          if (names_both) saw_mismatch = true;
        }
      }
      return saw_mismatch ? 3 : 0;  // 3: fine, and a rank of this process named both sizes
    });
    if (mismatch_check) {  // e.g. rank 0: "rank 1 sent f32 [25] (100 bytes) but rank 0 expects f32 [26] (104 bytes)"
      for (int c : codes) CHECK((c == 0 || c == 3));
      CHECK(std::count(codes.begin(), codes.end(), 3) >= 1);
    } else {
      CHECK(codes == std::vector<int>(codes.size(), 0));
    }
  }
}

namespace {
// The deterministic reduce-scatter in buckets (reduce_scatter_v, as optimizer/grad_buckets.h
// calls it over ZeRO-1's shards of S elements per rank): a buffer of n*S with odd bucket
// bounds, so that some ranks get 0 elements of a bucket. Returns each rank's reduced slice.
std::vector<float> bucketed(Communicator& c) {
  const int n = c.size(), r = c.rank();
  const size_t S = 1001, total = S * n;
  auto buf = random_floats(total, 77 + (uint32_t)r);
  std::vector<size_t> cut = {0, 5, 900, 1002, total / 2 + 3, total - 1, total};
  for (size_t b = 0; b + 1 < cut.size(); ++b) {
    const size_t lo = cut[b], hi = cut[b + 1];
    std::vector<size_t> counts(n);
    for (int q = 0; q < n; ++q) counts[q] = std::clamp(q * S + S, lo, hi) - std::clamp(q * S, lo, hi);
    c.reduce_scatter_v(buf.data() + lo, buf.data() + std::clamp(r * S, lo, hi), counts, ReduceOp::sum, kT);
  }
  return std::vector<float>(buf.begin() + r * S, buf.begin() + (r + 1) * S);
}
}  // namespace

TEST_CASE("ucx: the bucketed reduce-scatter gives the bits of the in-process backend and of one reduce_scatter",
          "[ucx][overlap]") {
  const std::vector<std::vector<int>> layouts = {{0, 1}, {0, 0, 1, 1}, {0, 1, 0, 1}};
  for (const auto& por : layouts) {
    const int n = (int)por.size();
    INFO("ranks " << n << ", process of rank 1: " << por[1]);
    auto codes = run_procs(Job(por), [&](int p, std::shared_ptr<UcxTransport> t) -> int {
      // in process: the same buckets, and one reduce_scatter of the whole buffer
      auto comms = make_local_group(n, "reference");
      std::vector<std::vector<float>> ref(n), one(n), got(n);
      std::vector<std::thread> th;
      for (int r = 0; r < n; ++r)
        th.emplace_back([&, r] {
          ref[r] = bucketed(*comms[r]);
          auto in = random_floats(1001 * n, 77 + (uint32_t)r);
          one[r].resize(1001);
          comms[r]->reduce_scatter(in.data(), one[r].data(), 1001, ReduceOp::sum, kT);
        });
      for (auto& x : th) x.join();
      th.clear();
      std::vector<int> all(n);
      for (int r = 0; r < n; ++r) all[r] = r;
      std::vector<std::string> errors(n);
      for (int r = 0; r < n; ++r)
        if (por[r] == p)
          th.emplace_back([&, r] {
            try {
              auto c = make_ucx_communicator(t, all, r, 9, "bucket group");
              got[r] = bucketed(*c);
            } catch (const std::exception& e) {
              errors[r] = e.what();
            }
          });
      for (auto& x : th) x.join();
      for (int r = 0; r < n; ++r) {
        if (por[r] != p) continue;
        if (!errors[r].empty()) std::fprintf(stderr, "[rank %d] %s\n", r, errors[r].c_str());
        EXPECT(errors[r].empty());
        EXPECT(got[r].size() == 1001);
        EXPECT(std::memcmp(got[r].data(), ref[r].data(), 1001 * sizeof(float)) == 0);
        EXPECT(std::memcmp(got[r].data(), one[r].data(), 1001 * sizeof(float)) == 0);
      }
      return 0;
    });
    CHECK(codes == std::vector<int>(codes.size(), 0));
  }
}

TEST_CASE("ucx: a header signed with another secret is rejected and the recv times out", "[ucx]") {
  Job job({0, 1, 2}, {"job-secret", "not-the-job-secret", "job-secret"});
  auto codes = run_procs(job, [&](int p, std::shared_ptr<UcxTransport> t) -> int {
    float x[4] = {1, 2, 3, 4}, y[4] = {};
    if (p == 1) {  // the forger: stays up until its victim has given up
      t->send(header(kWireActivation, 1, 1, 0, {4}), x, 5);
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return 0;
    }
    if (p == 2) {
      t->send(header(kWireActivation, 1, 2, 0, {4}), x, 5);
      return 0;
    }
    const auto t0 = Clock::now();
    const std::string e = error_of([&] { t->recv(header(kWireActivation, 1, 1, 0, {4}), y, 0.5); });
    const double took = since(t0);
    EXPECT(contains(e, "nothing from rank 1 within 0.5 s"));
    EXPECT(took >= 0.45 && took < 2.0);
    EXPECT(t->rejected() == 1);
    t->recv(header(kWireActivation, 1, 2, 0, {4}), y, 5);  // the genuine one still arrives
    EXPECT(std::memcmp(x, y, sizeof x) == 0);
    EXPECT(t->rejected() == 1);
    return 0;
  });
  CHECK(codes == std::vector<int>{0, 0, 0});
}

TEST_CASE("ucx: a recv from a peer that died or never sends throws within its deadline naming the rank", "[ucx]") {
  SECTION("the peer dies after its first message") {
    auto codes = run_procs(Job({0, 1}), [&](int p, std::shared_ptr<UcxTransport> t) -> int {
      float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {};
      if (p == 1) {
        t->send(header(kWireActivation, 0, 1, 0, {8}), x, 5);
        ::_exit(0);  // dies without closing anything
      }
      t->recv(header(kWireActivation, 0, 1, 0, {8}), y, 5);
      EXPECT(std::memcmp(x, y, sizeof x) == 0);
      const auto t0 = Clock::now();
      const std::string e = error_of([&] { t->recv(header(kWireActivation, 1, 1, 0, {8}), y, 2); });
      std::fprintf(stderr, "[process 0] after the peer died: %s (%.2f s)\n", e.c_str(), since(t0));
      EXPECT(contains(e, "rank 1"));
      EXPECT(since(t0) < 3);
      return 0;
    });
    CHECK(codes == std::vector<int>{0, 0});
  }
  SECTION("the peer is alive but never sends") {
    auto codes = run_procs(Job({0, 1}), [&](int p, std::shared_ptr<UcxTransport> t) -> int {
      if (p == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1200));
        return 0;
      }
      float y[8];
      const double cpu0 = cpu_s();
      const auto t0 = Clock::now();
      const std::string e = error_of([&] { t->recv(header(kWireTied, 3, 1, 0, {8}), y, 0.5); });
      const double took = since(t0);
      EXPECT(cpu_s() - cpu0 < 0.1);  // waiting costs no CPU: the progress thread sleeps, it does not spin
      EXPECT(contains(e, "recv of tied-embedding gradient (step 3, microbatch 1, chunk 2) from rank 1 at rank 0: "
                         "nothing from rank 1 within 0.5 s"));
      EXPECT(took >= 0.45 && took < 1.5);
      return 0;
    });
    CHECK(codes == std::vector<int>{0, 0});
  }
}

TEST_CASE("ucx: on_peer_lost names a peer whose endpoint failed once, after its grace, never after abort",
          "[ucx][hostile]") {
  SECTION("the peer dies: reported once, not before the grace") {
    Job job({0, 1});
    job.watch_lost = true;
    auto codes = run_procs(job, [&](int p, std::shared_ptr<UcxTransport> t) -> int {
      float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {};
      if (p == 1) {
        t->send(header(kWireActivation, 0, 1, 0, {8}), x, 5);
        ::_exit(0);  // dies without closing anything
      }
      t->recv(header(kWireActivation, 0, 1, 0, {8}), y, 5);
      const auto t0 = Clock::now();
      while (lost_calls().empty() && since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a second call would come by now
      const auto calls = lost_calls();
      for (auto& c : calls) std::fprintf(stderr, "[process 0] on_peer_lost: %s (%.2f s)\n", c.c_str(), since(t0));
      EXPECT(calls.size() == 1);
      EXPECT(calls[0].rfind("1: ", 0) == 0 && calls[0].size() > 3);  // process 1, with UCX's reason
      EXPECT(since(t0) >= 0.3);
      return 0;
    });
    CHECK(codes == std::vector<int>{0, 0});
  }
  SECTION("the data plane was aborted first (the job ended): no call") {
    Job job({0, 1});
    job.watch_lost = true;
    auto codes = run_procs(job, [&](int p, std::shared_ptr<UcxTransport> t) -> int {
      float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {};
      if (p == 1) {
        t->send(header(kWireActivation, 0, 1, 0, {8}), x, 5);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::_exit(0);
      }
      t->recv(header(kWireActivation, 0, 1, 0, {8}), y, 5);
      t->abort("the job ended");
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      EXPECT(lost_calls().empty());
      return 0;
    });
    CHECK(codes == std::vector<int>{0, 0});
  }
}

TEST_CASE("ucx: abort wakes blocked recvs at once and fails every later call", "[ucx]") {
  // ranks 0 and 2 in process 0, rank 1 in process 1 (which never sends)
  auto codes = run_procs(Job({0, 1, 0}), [&](int p, std::shared_ptr<UcxTransport> t) -> int {
    if (p == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      return 0;
    }
    std::string remote, local;
    std::atomic<int64_t> woke_remote{0}, woke_local{0};
    auto stamp = [] { return (int64_t)std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count(); };
    float y[4];
    std::thread a([&] {
      remote = error_of([&] { t->recv(header(kWireActivation, 0, 1, 0, {4}), y, 20); });
      woke_remote = stamp();
    });
    std::thread b([&] {
      local = error_of([&] { t->recv(header(kWireActivation, 0, 2, 0, {4}), y, 20); });
      woke_local = stamp();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int64_t at = stamp();
    t->abort("job aborted by the test");
    a.join();
    b.join();
    EXPECT(remote == "job aborted by the test");
    EXPECT(local == "job aborted by the test");
    EXPECT(woke_remote - at < 300000 && woke_local - at < 300000);  // microseconds
    float x[4] = {};
    EXPECT(error_of([&] { t->send(header(kWireActivation, 1, 0, 1, {4}), x, 5); }) == "job aborted by the test");
    EXPECT(error_of([&] { t->send(header(kWireActivation, 1, 0, 2, {4}), x, 5); }) == "job aborted by the test");
    t->abort("again");  // idempotent: the first reason stays
    EXPECT(error_of([&] { t->recv(header(kWireActivation, 0, 1, 0, {4}), y, 5); }) == "job aborted by the test");
    return 0;
  });
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("ucx: on_arrival hands each message over as a Tensor of the header's shape", "[ucx]") {
  // ranks 0 and 2 in process 0, rank 1 in process 1
  auto codes = run_procs(Job({0, 1, 0}), [&](int p, std::shared_ptr<UcxTransport> t) -> int {
    std::vector<float> remote(24), local(5);
    fill(remote.data(), remote.size() * 4, 11);
    fill(local.data(), local.size() * 4, 12);
    if (p == 1) {  // sends once process 0's handler is in place
      t->recv(header(kWireGradient, 0, 0, 1, {0}), nullptr, 10);
      t->send(header(kWireActivation, 3, 1, 0, {2, 3, 4}), remote.data(), 5);
      return 0;
    }
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::pair<WireHeader, Tensor>> got;
    std::vector<std::thread::id> threads;
    t->on_arrival(kWireActivation, [&](const WireHeader& h, Tensor x) {
      std::lock_guard<std::mutex> lk(mu);
      got.emplace_back(h, x);
      threads.push_back(std::this_thread::get_id());
      cv.notify_all();
    });
    t->send(header(kWireGradient, 0, 0, 1, {0}), nullptr, 5);  // go
    t->send(header(kWireActivation, 4, 2, 0, {5}), local.data(), 5);  // same process: no UCX
    std::unique_lock<std::mutex> lk(mu);
    EXPECT(cv.wait_for(lk, std::chrono::seconds(10), [&] { return got.size() == 2; }));
    for (auto& [h, x] : got) {
      EXPECT(threads[0] != std::this_thread::get_id());  // the progress thread
      const std::vector<float>& want = h.source == 1 ? remote : local;
      EXPECT(h.kind == kWireActivation && h.destination == 0 && h.microbatch == 1 && h.chunk == 2);
      EXPECT(x.shape() == (h.source == 1 ? std::vector<int64_t>{2, 3, 4} : std::vector<int64_t>{5}));
      EXPECT(h.step == (h.source == 1 ? 3 : 4));
      EXPECT(x.nbytes() == want.size() * 4);
      EXPECT(std::memcmp(x.data(), want.data(), x.nbytes()) == 0);
    }
    return 0;
  });
  CHECK(codes == std::vector<int>{0, 0});
}
