// bench/train_bench.cpp — troupe's side of `make bench`:
//   1. tokens/s, ms/step and MFU of a full training step (forward, backward, clip, AdamW)
//      through the actor pipeline, PP=1, on the bench model (default L=4, C=256, NH=4,
//      T=128, V=8192, B=16, 2 threads, --precision fp32|bf16|fp16), median of --iters steps
//      after --warmup;
//   2. troupe's matmul (fixed-block GEMM calls, kernels/gemm.cpp) GFLOP/s on the model's
//      shapes against oneDNN's own multi-threaded sgemm on the whole matrices.
// Prints one JSON object per line.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <dnnl.h>
#include <random>
#include <string>
#include <vector>

#include "actors/job.h"
#include "bench/bench_common.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

using namespace troupe;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}

int main(int argc, char** argv) {
  int L = 4, C = 256, NH = 4, T = 128, V = 8192, B = 16, threads = 2, warmup = 3, iters = 10, pp = 1, M = 1;
  std::string precision = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--precision") {
      precision = argv[i + 1];
      continue;
    }
    int v = std::atoi(argv[i + 1]);
    if (a == "--n_layer") L = v;
    else if (a == "--n_embd") C = v;
    else if (a == "--n_head") NH = v;
    else if (a == "--seq_len") T = v;
    else if (a == "--vocab_size") V = v;
    else if (a == "--batch_size") B = v;
    else if (a == "--threads") threads = v;
    else if (a == "--warmup") warmup = v;
    else if (a == "--iters") iters = v;
    else if (a == "--pp") pp = v;
    else if (a == "--microbatches") M = v;
  }
  Config c = bench::job_config(L, NH, C, T, V, B, warmup + iters);
  c.parallel.pp = pp;
  c.parallel.microbatches = M;
  c.train.threads = threads;
  c.train.precision = precision;  // fp32 | bf16 | fp16 (train.precision)
  JobContext ctx = bench::random_tokens(V);
  auto r = run_job(c, ctx);
  std::vector<double> ms(r.step_ms.begin() + warmup, r.step_ms.end());
  std::sort(ms.begin(), ms.end());
  double med = ms[ms.size() / 2];
  double tps = B * T / (med / 1e3);
  printf("{\"name\": \"train_step\", \"tokens_per_s\": %.1f, \"ms_per_step\": %.2f, \"mfu\": %.4f, "
         "\"peak_gflops\": %.1f, \"flops_per_token\": %.0f, \"threads\": %d, \"pp\": %d, \"microbatches\": %d, "
         "\"precision\": \"%s\", \"activation_bytes\": %zu}\n",
         tps, med, tps * r.flops_per_token / r.peak_flops, r.peak_flops / 1e9, r.flops_per_token, threads, pp, M,
         precision.c_str(), r.activation_bytes);

  // GEMM: troupe's blocked matmul vs the library's own threaded GEMM, same shapes, same threads.
  set_thread_budget(threads);
  const int BT = B * T;
  struct S { const char* what; int OC, Cin; };
  std::vector<S> shapes = {{"qkv", 3 * C, C}, {"attn_proj", C, C}, {"fc", 4 * C, C}, {"mlp_proj", C, 4 * C}, {"lm_head", V, C}};
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  double t_troupe = 0, t_lib = 0, flop_all = 0;
  for (auto& s : shapes) {
    std::vector<float> x((size_t)BT * s.Cin), w((size_t)s.OC * s.Cin), y((size_t)BT * s.OC), dy(y.size()),
        dx(x.size()), dw(w.size());
    for (auto& v : x) v = nd(g);
    for (auto& v : w) v = nd(g);
    for (auto& v : dy) v = nd(g);
    const double flop = 3 * 2.0 * BT * s.OC * s.Cin;  // forward + dinp + dweight
    auto run_troupe = [&] {
      kernels::matmul_forward(y.data(), x.data(), w.data(), nullptr, BT, s.Cin, s.OC);
      kernels::matmul_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), BT, s.Cin, s.OC);
    };
    auto run_lib = [&] {
      omp_set_num_threads(threads);
      dnnl_sgemm('N', 'T', BT, s.OC, s.Cin, 1.f, x.data(), s.Cin, w.data(), s.Cin, 0.f, y.data(), s.OC);
      dnnl_sgemm('N', 'N', BT, s.Cin, s.OC, 1.f, dy.data(), s.OC, w.data(), s.Cin, 0.f, dx.data(), s.Cin);
      dnnl_sgemm('T', 'N', s.OC, s.Cin, BT, 1.f, dy.data(), s.OC, x.data(), s.Cin, 1.f, dw.data(), s.Cin);
      omp_set_num_threads(1);
    };
    double bt = 1e30, bl = 1e30;
    for (int r2 = 0; r2 < 7; ++r2) {
      double t0 = now();
      run_troupe();
      bt = std::min(bt, now() - t0);
      t0 = now();
      run_lib();
      bl = std::min(bl, now() - t0);
    }
    t_troupe += bt;
    t_lib += bl;
    flop_all += flop;
    printf("{\"name\": \"gemm_%s\", \"troupe_gflops\": %.1f, \"library_gflops\": %.1f}\n", s.what, flop / bt / 1e9,
           flop / bl / 1e9);
  }
  printf("{\"name\": \"gemm_all\", \"troupe_gflops\": %.1f, \"library_gflops\": %.1f, \"threads\": %d}\n",
         flop_all / t_troupe / 1e9, flop_all / t_lib / 1e9, threads);
  return 0;
}
