// bench/ucx_bench.cpp — the UCX data plane (collectives/ucx.h) between processes of this
// machine (fork; UCX picks its transports from UCX_TLS as usual):
//   1. point-to-point bandwidth, 8 B .. 64 MiB: a unidirectional stream of messages from
//      process 0 to process 1 with `window` messages in flight (like ucx_perftest's tag_bw:
//      the receiver keeps `window` recvs posted), one thread per window slot on each side
//      since send/recv block; MiB/s (2^20 bytes/s, ucx_perftest's "MB/s") over the receiver's
//      time for all messages;
//   2. ping-pong latency of 8 B messages: half the average (and the median) round trip,
//      microseconds, over 10000 round trips like bench/run.sh's ucx_perftest (--latency
//      [N]: this part alone, N round trips);
//   3. all-reduce bus bandwidth (nccl-tests: busbw = bytes / time * 2 (n-1) / n) over 2 and
//      4 processes, one rank each, 1 MiB .. 64 MiB of fp32.
// Prints one JSON object per line.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/ucx.h"

using namespace troupe;

namespace {

bool g_failed = false;  // a run failed: exit status 1

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool write_all(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n) {
    const ssize_t k = ::write(fd, c, n);
    if (k <= 0) return false;
    c += k, n -= (size_t)k;
  }
  return true;
}

bool read_all(int fd, void* p, size_t n, double timeout_s) {
  char* c = (char*)p;
  const double end = now() + timeout_s;
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    const int ms = (int)((end - now()) * 1e3);
    if (ms <= 0 || ::poll(&pf, 1, ms) <= 0) return false;
    const ssize_t k = ::read(fd, c, n);
    if (k <= 0) return false;
    c += k, n -= (size_t)k;
  }
  return true;
}

// Forks n processes (one rank each), connects their transports through pipes to this one
// and runs body in each; returns false if any failed or outlived limit_s.
bool run_procs(int n, double limit_s, const std::function<void(int, std::shared_ptr<UcxTransport>)>& body) {
  std::fflush(stdout);
  std::vector<pid_t> pids(n);
  std::vector<int> up(n), down(n);
  for (int p = 0; p < n; ++p) {
    int a[2], b[2];
    if (::pipe(a) || ::pipe(b)) return false;
    pids[p] = ::fork();
    if (pids[p] < 0) return false;
    if (pids[p] == 0) {
      ::close(a[0]), ::close(b[1]);
      int rc = 0;
      try {
        TransportOptions o;
        o.process = p;
        o.nprocs = n;
        o.secret = "bench-secret";
        o.limits.world = n;
        for (int r = 0; r < n; ++r) o.process_of_rank.push_back(r);
        auto t = std::make_shared<UcxTransport>(o);
        auto addr = t->address();
        uint32_t len = (uint32_t)addr.size();
        if (!write_all(a[1], &len, 4) || !write_all(a[1], addr.data(), len)) throw Error("address to the parent");
        std::vector<std::vector<uint8_t>> all(n);
        for (auto& x : all) {
          uint32_t l = 0;
          if (!read_all(b[0], &l, 4, 30) || l > (1u << 20)) throw Error("addresses from the parent");
          x.resize(l);
          if (!read_all(b[0], x.data(), l, 30)) throw Error("addresses from the parent");
        }
        t->connect(all);
        body(p, t);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ucx_bench process %d: %s\n", p, e.what());
        rc = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    ::close(a[1]), ::close(b[0]);
    up[p] = a[0], down[p] = b[1];
  }
  std::vector<std::vector<uint8_t>> addrs(n);
  bool ok = true;
  for (int p = 0; p < n && ok; ++p) {
    uint32_t l = 0;
    ok = read_all(up[p], &l, 4, limit_s) && l < (1u << 20);
    if (ok) addrs[p].resize(l), ok = read_all(up[p], addrs[p].data(), l, limit_s);
  }
  for (int p = 0; p < n && ok; ++p)
    for (auto& a : addrs) {
      uint32_t l = (uint32_t)a.size();
      ok = write_all(down[p], &l, 4) && write_all(down[p], a.data(), l);
    }
  const double end = now() + limit_s;
  int left = n;
  while (left) {
    for (int p = 0; p < n; ++p) {
      int st = 0;
      if (pids[p] > 0 && ::waitpid(pids[p], &st, ok ? WNOHANG : 0) == pids[p]) {
        ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        pids[p] = -1, --left;
      }
    }
    if (left && (now() > end || !ok)) {
      for (pid_t pid : pids)
        if (pid > 0) ::kill(pid, SIGKILL);
      ok = false;
    }
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int p = 0; p < n; ++p) ::close(up[p]), ::close(down[p]);
  if (!ok) std::fprintf(stderr, "ucx_bench: a run over %d processes failed\n", n);
  g_failed = g_failed || !ok;
  return ok;
}

WireHeader msg(int64_t step, int32_t chunk, int src, int dst, size_t bytes) {
  WireHeader h;
  h.kind = kWireActivation;
  h.step = step;
  h.chunk = chunk;
  h.source = src;
  h.destination = dst;
  h.dtype = DType::f32;
  h.shape = {(int64_t)(bytes / 4)};
  h.bytes = bytes;
  return h;
}

// A zero-byte handshake in both directions (chunk 1 << 20 | round), so the timed part
// starts with both processes ready.
void sync(UcxTransport& t, int p, int round) {
  const int peer = 1 - p;
  t.send(msg(0, (1 << 20) | round, p, peer, 0), nullptr, 60);
  t.recv(msg(0, (1 << 20) | round, peer, p, 0), nullptr, 60);
}

void bandwidth(size_t bytes) {
  // the same volume per size, at least 8 messages; window 32 like ucx_perftest's default,
  // fewer for big messages so every slot has its own buffer (at most 256 MiB per process)
  const int window = (int)std::clamp<size_t>((256u << 20) / bytes, 2, 32);
  const int iters = (int)std::clamp<size_t>((1024ull << 20) / bytes, 8 * (size_t)window, 20000) / window * window;
  run_procs(2, 300, [&](int p, std::shared_ptr<UcxTransport> t) {
    std::vector<std::vector<uint8_t>> bufs(window, std::vector<uint8_t>(bytes, (uint8_t)p));
    auto stream = [&](int round) {
      std::vector<std::thread> th;
      for (int w = 0; w < window; ++w)
        th.emplace_back([&, w] {
          for (int i = w; i < iters; i += window) {
            const WireHeader h = msg(i, round, 0, 1, bytes);
            if (p == 0)
              t->send(h, bufs[w].data(), 60);
            else
              t->recv(h, bufs[w].data(), 60);
          }
        });
      for (auto& x : th) x.join();
    };
    sync(*t, p, 0);
    stream(0);  // warm-up: endpoints, registration caches
    sync(*t, p, 1);
    const double t0 = now();
    stream(1);
    const double dt = now() - t0;
    sync(*t, p, 2);
    if (p == 1)
      std::printf("{\"name\": \"ucx_p2p_bw\", \"bytes\": %zu, \"window\": %d, \"messages\": %d, \"mib_s\": %.1f}\n",
                  bytes, window, iters, (double)bytes * iters / dt / (1 << 20));
  });
}

void latency(int iters = 10000) {  // as many round trips as bench/run.sh asks of ucx_perftest
  run_procs(2, 120, [&](int p, std::shared_ptr<UcxTransport> t) {
    char b[8] = {};
    std::vector<double> rtt;
    auto round_trips = [&](int round, int n) {
      for (int i = 0; i < n; ++i) {
        const double r0 = now();
        if (p == 0) {
          t->send(msg(i, round, 0, 1, 8), b, 60);
          t->recv(msg(i, round, 1, 0, 8), b, 60);
        } else {
          t->recv(msg(i, round, 0, 1, 8), b, 60);
          t->send(msg(i, round, 1, 0, 8), b, 60);
        }
        if (round == 1) rtt.push_back(now() - r0);
      }
    };
    sync(*t, p, 0);
    round_trips(0, 200);
    sync(*t, p, 1);
    const double t0 = now();
    round_trips(1, iters);
    const double dt = now() - t0;
    std::sort(rtt.begin(), rtt.end());
    if (p == 0)  // half the round trip: the mean, and the median (less moved by a busy machine)
      std::printf("{\"name\": \"ucx_p2p_latency\", \"bytes\": 8, \"iterations\": %d, \"usec\": %.2f, "
                  "\"usec_median\": %.2f}\n",
                  iters, dt / iters / 2 * 1e6, rtt[rtt.size() / 2] / 2 * 1e6);
  });
}

void allreduce(int n, size_t bytes) {
  const size_t count = bytes / 4;
  const int iters = (int)std::clamp<size_t>((512u << 20) / bytes, 3, 50);
  run_procs(n, 600, [&](int p, std::shared_ptr<UcxTransport> t) {
    std::vector<int> ranks(n);
    for (int r = 0; r < n; ++r) ranks[r] = r;
    auto c = make_ucx_communicator(t, ranks, p, 1, "bench group");
    std::vector<float> buf(count, 1.0f / n);
    c->all_reduce(buf.data(), count, ReduceOp::sum, 120);  // warm-up
    c->barrier(120);
    const double t0 = now();
    for (int i = 0; i < iters; ++i) c->all_reduce(buf.data(), count, ReduceOp::sum, 120);
    c->barrier(120);
    const double per = (now() - t0) / iters;
    if (p == 0)
      std::printf("{\"name\": \"ucx_allreduce_busbw\", \"bytes\": %zu, \"processes\": %d, \"iterations\": %d, "
                  "\"ms\": %.3f, \"busbw_gbs\": %.3f}\n",
                  bytes, n, iters, per * 1e3, bytes / per * 2.0 * (n - 1) / n / 1e9);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;  // 64 MiB figures only
  if (argc > 1 && std::strcmp(argv[1], "--latency") == 0) {  // the 8-byte round trip only [N round trips]
    latency(argc > 2 ? std::clamp(std::atoi(argv[2]), 1, 10000000) : 10000);
    return g_failed ? 1 : 0;
  }
  if (!quick)
    for (size_t b = 8; b < (64u << 20); b *= 8) bandwidth(b);
  bandwidth(64u << 20);
  latency();
  for (int n : {2, 4}) {
    if (!quick) {
      allreduce(n, 1u << 20);
      allreduce(n, 16u << 20);
    }
    allreduce(n, 64u << 20);
  }
  return g_failed ? 1 : 0;
}
