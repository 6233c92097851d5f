// cuda_kernel_dump OUTDIR — runs troupe's CUDA kernels on fixed random inputs and writes
// inputs and outputs as raw little-endian files plus OUTDIR/manifest.json, for
// bench/gpu/torch_check.py to hold against PyTorch on the same GPU (the kernel-vs-PyTorch
// check of bench/gpu/run.sh). Shapes are GPT-2 small's where it matters (C 768, NH 12,
// T 1024). Exit 2 with a sentence when there is no GPU.
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>  // the typed cudaMalloc

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/hd_math.h"

namespace kc = troupe::kernels::cuda;

namespace {
std::string g_dir;
std::string g_manifest = "{\n";

std::vector<float> randn(size_t n, uint32_t seed, float s = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
template <class T>
T* up(const std::vector<T>& v) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T>
void save(const std::string& name, const T* data, const std::vector<long>& shape, const char* dtype, bool device) {
  size_t n = 1;
  for (long s : shape) n *= (size_t)s;
  std::vector<T> h(n);
  if (device) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost));
  } else {
    h.assign(data, data + n);
  }
  std::ofstream(g_dir + "/" + name + ".bin", std::ios::binary).write((const char*)h.data(), n * sizeof(T));
  std::string sh;
  for (size_t i = 0; i < shape.size(); ++i) sh += (i ? ", " : "") + std::to_string(shape[i]);
  if (g_manifest.size() > 2) g_manifest += ",\n";
  g_manifest += "  \"" + name + "\": {\"shape\": [" + sh + "], \"dtype\": \"" + dtype + "\"}";
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cuda_kernel_dump OUTDIR\n");
    return 2;
  }
  g_dir = argv[1];
  std::string why;
  if (kc::device_count(&why) == 0) {
    std::fprintf(stderr, "cuda_kernel_dump: %s\n", why.c_str());
    return 2;
  }
  try {
    const int B = 2, T = 1024, C = 768, NH = 12, BT = B * T, V = 50304;
    // layernorm + gelu
    auto x = randn((size_t)BT * C, 1), w = randn(C, 2), b = randn(C, 3);
    float *dx = up(x), *dw = up(w), *db = up(b), *dout, *dmean, *drstd;
    CUDA_CHECK(cudaMalloc(&dout, x.size() * 4));
    CUDA_CHECK(cudaMalloc(&dmean, BT * 4));
    CUDA_CHECK(cudaMalloc(&drstd, BT * 4));
    kc::layernorm_forward(dout, dmean, drstd, dx, dw, db, BT, C, 0);
    save("ln_x", x.data(), {BT, C}, "f32", false);
    save("ln_w", w.data(), {C}, "f32", false);
    save("ln_b", b.data(), {C}, "f32", false);
    save("ln_out", dout, {BT, C}, "f32", true);
    kc::gelu_forward(dout, dx, (int64_t)x.size(), 0);
    save("gelu_out", dout, {BT, C}, "f32", true);
    // flash attention forward + backward
    auto qkv = randn((size_t)BT * 3 * C, 4), dy = randn((size_t)BT * C, 5);
    float *dq = up(qkv), *ddy = up(dy), *datt_out, *dlse, *ddinp, *dsum;
    CUDA_CHECK(cudaMalloc(&datt_out, (size_t)BT * C * 4));
    CUDA_CHECK(cudaMalloc(&dlse, (size_t)B * NH * T * 4));
    CUDA_CHECK(cudaMalloc(&dsum, (size_t)B * NH * T * 4));
    CUDA_CHECK(cudaMalloc(&ddinp, (size_t)BT * 3 * C * 4));
    kc::flash_attention_forward(datt_out, dlse, dq, B, T, C, NH, nullptr, 0);
    kc::flash_attention_backward(ddinp, dsum, ddy, dq, datt_out, dlse, B, T, C, NH, nullptr, 0);
    save("att_qkv", qkv.data(), {B, T, 3 * C}, "f32", false);
    save("att_dout", dy.data(), {B, T, C}, "f32", false);
    save("att_out", datt_out, {B, T, C}, "f32", true);
    save("att_dqkv", ddinp, {B, T, 3 * C}, "f32", true);
    // cross-entropy over the full vocabulary (one rank): mean loss, dlogits
    const int R = 256;
    auto logits = randn((size_t)R * V, 6, 2.0f);
    std::vector<int32_t> tgt(R);
    for (int i = 0; i < R; ++i) tgt[i] = (i * 7919) % V;
    float *dl = up(logits), *dmx, *dsm, *dtl, *dloss;
    int32_t* dt = up(tgt);
    double* dtotal;
    CUDA_CHECK(cudaMalloc(&dmx, R * 4));
    CUDA_CHECK(cudaMalloc(&dsm, R * 4));
    CUDA_CHECK(cudaMalloc(&dtl, R * 4));
    CUDA_CHECK(cudaMalloc(&dloss, R * 4));
    CUDA_CHECK(cudaMalloc(&dtotal, 8));
    save("ce_logits", logits.data(), {R, V}, "f32", false);
    save("ce_targets", tgt.data(), {R}, "i32", false);
    kc::ce_vp_max(dmx, dl, R, V, V, 0);
    kc::ce_vp_exp_sum(dl, dsm, dtl, dmx, dt, 0, R, V, V, true, 0);
    kc::ce_vp_finish(dl, dloss, dtotal, dmx, dsm, dtl, dt, 0, R, V, V, 1.0f / R, 0);
    save("ce_losses", dloss, {R}, "f32", true);
    save("ce_dlogits", dl, {R, V}, "f32", true);
    // AdamW, three steps
    const int N = 100003;
    auto p = randn(N, 7), g = randn(N, 8);
    std::vector<float> zeros(N, 0.f);
    float *dp = up(p), *dg = up(g), *dm = up(zeros), *dv = up(zeros);
    for (int t = 1; t <= 3; ++t)
      kc::adamw_update(dp, dg, dm, dv, nullptr, troupe::DType::bf16, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t, 0);
    save("adamw_p0", p.data(), {N}, "f32", false);
    save("adamw_g", g.data(), {N}, "f32", false);
    save("adamw_p3", dp, {N}, "f32", true);
    // bf16 GEMM (cuBLASLt): out (BT, 4C) = x16 . w16^T + bias
    const int OC = 4 * C;
    auto w2 = randn((size_t)OC * C, 9, 0.02f), bias = randn(OC, 10);
    std::vector<uint16_t> x16(x.size()), w16(w2.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = troupe::kernels::hd::f32_to_bf16(x[i]);
    for (size_t i = 0; i < w2.size(); ++i) w16[i] = troupe::kernels::hd::f32_to_bf16(w2[i]);
    uint16_t *dx16 = up(x16), *dw16 = up(w16);
    float *dbias = up(bias), *dmm, *dpre;
    CUDA_CHECK(cudaMalloc(&dmm, (size_t)BT * OC * 4));
    CUDA_CHECK(cudaMalloc(&dpre, (size_t)BT * OC * 4));
    void* ws;
    CUDA_CHECK(cudaMalloc(&ws, 32 << 20));
    {
      kc::GemmLt lt(0, ws, 32 << 20);
      lt.forward(dmm, dx16, dw16, dbias, nullptr, BT, C, OC, kc::GemmType::bf16);
      save("mm_x16", x16.data(), {BT, C}, "bf16", false);
      save("mm_w16", w16.data(), {OC, C}, "bf16", false);
      save("mm_bias", bias.data(), {OC}, "f32", false);
      save("mm_out", dmm, {BT, OC}, "f32", true);
      lt.forward(dmm, dx16, dw16, dbias, dpre, BT, C, OC, kc::GemmType::bf16);
      save("mm_gelu_out", dmm, {BT, OC}, "f32", true);
    }
    std::ofstream(g_dir + "/manifest.json") << g_manifest << "\n}\n";
    std::printf("cuda_kernel_dump: wrote %s/manifest.json on %s\n", g_dir.c_str(), kc::device_description(0).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_kernel_dump: %s\n", e.what());
    return 1;
  }
  return 0;
}
