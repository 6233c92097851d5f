// cuda_kernel_dump [--cpu] OUTDIR — runs troupe's CUDA kernels (or, with --cpu, the CPU
// kernels of kernels/kernels.h: the same check of the files and the script on a machine
// without a GPU) on fixed random inputs and writes inputs and outputs as raw little-endian
// files plus OUTDIR/manifest.json, for bench/gpu/torch_check.py to hold against PyTorch
// (the kernel-vs-PyTorch step of bench/gpu/run.sh). GPT-2 small's shapes: C 768, NH 12,
// T 1024, V 50304. Exit 2 with a sentence when there is no GPU (and no --cpu).
#include <cuda_runtime.h>  // the typed cudaMalloc

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/kernels.h"

namespace k = troupe::kernels;
namespace kc = troupe::kernels::cuda;

namespace {
std::string g_dir, g_manifest;
bool g_cpu = false;
std::vector<void*> g_dev;  // device buffers, freed at exit

std::vector<float> randn(size_t n, uint32_t seed, float s = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
// A buffer that lives on the GPU (or, with --cpu, on the host): init, pointer, readback.
template <class T>
struct Buf {
  std::vector<T> h;
  T* d = nullptr;
  explicit Buf(std::vector<T> v) : h(std::move(v)) {
    if (g_cpu) return;
    CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    g_dev.push_back(d);
  }
  explicit Buf(size_t n) : Buf(std::vector<T>(n)) {}
  T* p() { return g_cpu ? h.data() : d; }
  const std::vector<T>& host() {
    if (!g_cpu) {
      CUDA_CHECK(cudaDeviceSynchronize()) << "a kernel failed";
      CUDA_CHECK(cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return h;
  }
};
template <class T>
void save(const std::string& name, const std::vector<T>& h, const std::vector<long>& shape, const char* dtype) {
  std::ofstream(g_dir + "/" + name + ".bin", std::ios::binary).write((const char*)h.data(), h.size() * sizeof(T));
  std::string sh;
  for (size_t i = 0; i < shape.size(); ++i) sh += (i ? ", " : "") + std::to_string(shape[i]);
  g_manifest += std::string(g_manifest.empty() ? "{\n" : ",\n") + "  \"" + name + "\": {\"shape\": [" + sh +
                "], \"dtype\": \"" + dtype + "\"}";
}
constexpr int B = 2, T = 1024, C = 768, NH = 12, BT = B * T, V = 50304;

void layernorm_gelu() {
  Buf<float> x(randn((size_t)BT * C, 1)), w(randn(C, 2)), b(randn(C, 3)), out((size_t)BT * C), mean(BT), rstd(BT);
  if (g_cpu) k::layernorm_forward(out.p(), mean.p(), rstd.p(), x.p(), w.p(), b.p(), BT, C);
  else kc::layernorm_forward(out.p(), mean.p(), rstd.p(), x.p(), w.p(), b.p(), BT, C, 0);
  save("ln_x", x.h, {BT, C}, "f32");
  save("ln_w", w.h, {C}, "f32");
  save("ln_b", b.h, {C}, "f32");
  save("ln_out", out.host(), {BT, C}, "f32");
  if (g_cpu) k::gelu_forward(out.p(), x.p(), (int64_t)BT * C);
  else kc::gelu_forward(out.p(), x.p(), (int64_t)BT * C, 0);
  save("gelu_out", out.host(), {BT, C}, "f32");
}

void attention() {  // the fused kernel on the GPU; the plain CPU one with --cpu
  Buf<float> qkv(randn((size_t)BT * 3 * C, 4)), dy(randn((size_t)BT * C, 5)), out((size_t)BT * C),
      dinp((size_t)BT * 3 * C);
  if (g_cpu) {
    std::vector<float> att((size_t)B * NH * T * T), datt(att.size());
    k::attention_forward(out.p(), att.data(), qkv.p(), B, T, C, NH);
    k::attention_backward(dinp.p(), datt.data(), dy.p(), qkv.p(), att.data(), B, T, C, NH);
  } else {
    Buf<float> lse((size_t)B * NH * T), dsum((size_t)B * NH * T);
    kc::flash_attention_forward(out.p(), lse.p(), qkv.p(), B, T, C, NH, nullptr, 0);
    kc::flash_attention_backward(dinp.p(), dsum.p(), dy.p(), qkv.p(), out.p(), lse.p(), B, T, C, NH, nullptr, 0);
  }
  save("att_qkv", qkv.h, {B, T, 3 * C}, "f32");
  save("att_dout", dy.h, {B, T, C}, "f32");
  save("att_out", out.host(), {B, T, C}, "f32");
  save("att_dqkv", dinp.host(), {B, T, 3 * C}, "f32");
}

void crossentropy() {  // over the full vocabulary (one rank); dlogits of the mean loss
  const int R = 256;
  std::vector<int32_t> t(R);
  for (int i = 0; i < R; ++i) t[i] = (i * 7919) % V;
  Buf<float> logits(randn((size_t)R * V, 6, 2.0f)), mx(R), sm(R), tl(R), loss(R);
  Buf<int32_t> tgt(t);
  Buf<double> total(1);
  save("ce_logits", logits.h, {R, V}, "f32");
  save("ce_targets", tgt.h, {R}, "i32");
  if (g_cpu) {
    k::ce_vp_max(mx.p(), logits.p(), R, V, V);
    k::ce_vp_exp_sum(logits.p(), sm.p(), tl.p(), mx.p(), tgt.p(), 0, R, V, V, true);
    k::ce_vp_finish(logits.p(), loss.p(), mx.p(), sm.p(), tl.p(), tgt.p(), 0, R, V, V, 1.0f / R);
  } else {
    kc::ce_vp_max(mx.p(), logits.p(), R, V, V, 0);
    kc::ce_vp_exp_sum(logits.p(), sm.p(), tl.p(), mx.p(), tgt.p(), 0, R, V, V, true, 0);
    kc::ce_vp_finish(logits.p(), loss.p(), total.p(), mx.p(), sm.p(), tl.p(), tgt.p(), 0, R, V, V, 1.0f / R, 0);
  }
  save("ce_losses", loss.host(), {R}, "f32");
  save("ce_dlogits", logits.host(), {R, V}, "f32");
}

void adamw() {  // three steps on fp32 masters
  const int N = 100003;
  Buf<float> p(randn(N, 7)), g(randn(N, 8)), m(N), v(N);
  save("adamw_p0", p.h, {N}, "f32");
  save("adamw_g", g.h, {N}, "f32");
  for (int t = 1; t <= 3; ++t) {
    if (g_cpu) k::adamw_update(p.p(), g.p(), m.p(), v.p(), N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t);
    else kc::adamw_update(p.p(), g.p(), m.p(), v.p(), nullptr, troupe::DType::bf16, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t, 0);
  }
  save("adamw_p3", p.host(), {N}, "f32");
}

void gemm_bf16() {  // out (BT, 4C) = x16 . w16^T + bias, then with the GELU epilogue
  const int OC = 4 * C;
  auto x = randn((size_t)BT * C, 1), w = randn((size_t)OC * C, 9, 0.02f);
  std::vector<uint16_t> x16(x.size()), w16(w.size());
  troupe::f32_to_bf16(x.data(), x16.data(), x.size());
  troupe::f32_to_bf16(w.data(), w16.data(), w.size());
  save("mm_x16", x16, {BT, C}, "bf16");
  save("mm_w16", w16, {OC, C}, "bf16");
  Buf<float> bias(randn(OC, 10)), out((size_t)BT * OC), pre((size_t)BT * OC);
  save("mm_bias", bias.h, {OC}, "f32");
  if (g_cpu) {
    troupe::bf16_to_f32(x16.data(), x.data(), x.size());  // the bf16 values as fp32 inputs
    k::matmul_forward_bf16(out.p(), x.data(), w16.data(), bias.p(), BT, C, OC);
    save("mm_out", out.h, {BT, OC}, "f32");
    k::gelu_forward(pre.p(), out.p(), (int64_t)BT * OC);
    save("mm_gelu_out", pre.h, {BT, OC}, "f32");
    return;
  }
  Buf<uint16_t> dx16(x16), dw16(w16);
  Buf<char> ws(size_t(32) << 20);
  kc::GemmLt lt(0, ws.p(), ws.h.size());
  lt.forward(out.p(), dx16.p(), dw16.p(), bias.p(), nullptr, BT, C, OC, kc::GemmType::bf16);
  save("mm_out", out.host(), {BT, OC}, "f32");
  lt.forward(out.p(), dx16.p(), dw16.p(), bias.p(), pre.p(), BT, C, OC, kc::GemmType::bf16);
  save("mm_gelu_out", out.host(), {BT, OC}, "f32");
}
}  // namespace

int main(int argc, char** argv) {
  const bool ok_args = argc == 2 || (argc == 3 && std::string(argv[1]) == "--cpu");
  if (!ok_args) {
    std::fprintf(stderr, "usage: cuda_kernel_dump [--cpu] OUTDIR\n");
    return 2;
  }
  g_cpu = argc == 3;
  g_dir = argv[argc - 1];
  std::string why;
  if (!g_cpu && kc::device_count(&why) == 0) {
    std::fprintf(stderr, "cuda_kernel_dump: %s (use --cpu for the CPU kernels)\n", why.c_str());
    return 2;
  }
  try {
    layernorm_gelu();
    attention();
    crossentropy();
    adamw();
    gemm_bf16();
    std::ofstream(g_dir + "/manifest.json") << g_manifest << "\n}\n";
    for (void* p : g_dev) cudaFree(p);
    std::printf("cuda_kernel_dump: wrote %s/manifest.json (%s)\n", g_dir.c_str(),
                g_cpu ? "CPU kernels" : kc::device_description(0).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_kernel_dump: %s\n", e.what());
    return 1;
  }
  return 0;
}
