#include "model/gpt.h"

#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

namespace troupe {

int64_t GPTConfig::n_params() const { return n_params_no_wpe() + (int64_t)maxT * C; }
int64_t GPTConfig::n_params_no_wpe() const {
  int64_t per_block = 2 * C + 3LL * C * C + 3LL * C + (int64_t)C * C + C + 2 * C + 4LL * C * C + 4LL * C +
                      4LL * C * C + C;
  return (int64_t)V * C + L * per_block + 2 * C;
}

std::vector<ParamSpec> gpt_param_specs(const GPTConfig& c) {
  std::vector<ParamSpec> s;
  s.push_back({"wte", {c.V, c.C}, true, Init::normal, -1});
  s.push_back({"wpe", {c.maxT, c.C}, true, Init::normal, -1});
  for (int l = 0; l < c.L; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    s.push_back({p + "ln_1.weight", {c.C}, false, Init::ones, l});
    s.push_back({p + "ln_1.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "attn.qkv.weight", {3 * c.C, c.C}, true, Init::normal, l});
    s.push_back({p + "attn.qkv.bias", {3 * c.C}, false, Init::zeros, l});
    s.push_back({p + "attn.proj.weight", {c.C, c.C}, true, Init::normal_residual, l});
    s.push_back({p + "attn.proj.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "ln_2.weight", {c.C}, false, Init::ones, l});
    s.push_back({p + "ln_2.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "mlp.fc.weight", {4 * c.C, c.C}, true, Init::normal, l});
    s.push_back({p + "mlp.fc.bias", {4 * c.C}, false, Init::zeros, l});
    s.push_back({p + "mlp.proj.weight", {c.C, 4 * c.C}, true, Init::normal_residual, l});
    s.push_back({p + "mlp.proj.bias", {c.C}, false, Init::zeros, l});
  }
  s.push_back({"ln_f.weight", {c.C}, false, Init::ones, -1});
  s.push_back({"ln_f.bias", {c.C}, false, Init::zeros, -1});
  return s;
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}
}  // namespace

void init_param(Tensor& t, const ParamSpec& spec, const GPTConfig& cfg, uint64_t seed) {
  float* d = t.data();
  const int64_t n = t.numel();
  if (spec.init == Init::zeros) {
    t.zero_();
    return;
  }
  if (spec.init == Init::ones) {
    for (int64_t i = 0; i < n; ++i) d[i] = 1.0f;
    return;
  }
  double stddev = 0.02;
  if (spec.init == Init::normal_residual) stddev = 0.02 / std::sqrt(2.0 * cfg.L);
  uint64_t state = seed ^ fnv1a(spec.name);
  for (int64_t i = 0; i < n; i += 2) {
    // Box-Muller on two 53-bit uniforms in (0, 1].
    double u1 = ((splitmix64(state) >> 11) + 1) * 0x1.0p-53;
    double u2 = (splitmix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    d[i] = static_cast<float>(stddev * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) d[i + 1] = static_cast<float>(stddev * r * std::sin(2.0 * M_PI * u2));
  }
}

namespace {
void ensure(Tensor& t, std::vector<int64_t> shape) {
  if (!t.defined() || t.shape() != shape) t = Tensor(std::move(shape));
}
}  // namespace

void BlockActs::ensure(int B, int T, int C, int NH) {
  using troupe::ensure;
  const int64_t BT = (int64_t)B * T;
  ensure(ln1, {BT, C});
  ensure(ln1_mean, {BT});
  ensure(ln1_rstd, {BT});
  ensure(qkv, {BT, 3 * C});
  ensure(att, {B, NH, T, T});
  ensure(atty, {BT, C});
  ensure(x2, {BT, C});
  ensure(ln2, {BT, C});
  ensure(ln2_mean, {BT});
  ensure(ln2_rstd, {BT});
  ensure(fch, {BT, 4 * C});
  ensure(fch_gelu, {BT, 4 * C});
}

void BlockScratch::ensure(int B, int T, int C, int NH) {
  using troupe::ensure;
  const int64_t BT = (int64_t)B * T;
  ensure(datt, {B, NH, T, T});
  ensure(dqkv, {BT, 3 * C});
  ensure(datty, {BT, C});
  ensure(dln, {BT, C});
  ensure(dfch, {BT, 4 * C});
  ensure(dfch_gelu, {BT, 4 * C});
}

void BlockGrads::ensure(int B, int T, int C) {
  using troupe::ensure;
  const int64_t BT = (int64_t)B * T;
  ensure(dy, {BT, C});
  ensure(dfch, {BT, 4 * C});
  ensure(dln2, {BT, C});
  ensure(dx2, {BT, C});
  ensure(dqkv, {BT, 3 * C});
  ensure(dln1, {BT, C});
}

void Block::forward(float* y, BlockActs& a, int B, int T, const GPTConfig& cfg) const {
  namespace k = kernels;
  const int C = cfg.C;
  const int64_t BT = (int64_t)B * T;
  k::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), a.x.data(), ln1_w->value.data(),
                       ln1_b->value.data(), BT, C);
  k::matmul_forward(a.qkv.data(), a.ln1.data(), qkv_w->value.data(), qkv_b->value.data(), BT, C, 3 * C);
  k::attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, T, C, cfg.NH);
  // x2 = x + proj(atty): the projection goes to x2, then the residual is added.
  k::matmul_forward(a.x2.data(), a.atty.data(), proj_w->value.data(), proj_b->value.data(), BT, C, C);
  k::accumulate(a.x2.data(), a.x.data(), BT * C);
  k::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.x2.data(), ln2_w->value.data(),
                       ln2_b->value.data(), BT, C);
  k::matmul_forward(a.fch.data(), a.ln2.data(), fc_w->value.data(), fc_b->value.data(), BT, C, 4 * C);
  k::gelu_forward(a.fch_gelu.data(), a.fch.data(), BT * 4 * C);
  k::matmul_forward(y, a.fch_gelu.data(), fcproj_w->value.data(), fcproj_b->value.data(), BT, 4 * C, C);
  k::accumulate(y, a.x2.data(), BT * C);
}

void Block::backward(float* dres, BlockActs& a, BlockScratch& s, int B, int T, const GPTConfig& cfg) const {
  namespace k = kernels;
  const int C = cfg.C;
  const int64_t BT = (int64_t)B * T;
  // MLP half: y = x2 + proj(gelu(fc(ln2(x2)))); dres = dL/dy = dL/dx2 (residual path)
  k::matmul_backward(s.dfch_gelu.data(), fcproj_w->grad.data(), fcproj_b->grad.data(), dres, a.fch_gelu.data(),
                     fcproj_w->value.data(), BT, 4 * C, C);
  k::gelu_backward(s.dfch.data(), a.fch.data(), s.dfch_gelu.data(), BT * 4 * C);
  k::matmul_backward(s.dln.data(), fc_w->grad.data(), fc_b->grad.data(), s.dfch.data(), a.ln2.data(),
                     fc_w->value.data(), BT, C, 4 * C);
  k::layernorm_backward(dres, ln2_w->grad.data(), ln2_b->grad.data(), s.dln.data(), a.x2.data(),
                        ln2_w->value.data(), a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
  // attention half: x2 = x + proj(attn(qkv(ln1(x)))); dres = dL/dx2
  k::matmul_backward(s.datty.data(), proj_w->grad.data(), proj_b->grad.data(), dres, a.atty.data(),
                     proj_w->value.data(), BT, C, C);
  k::attention_backward(s.dqkv.data(), s.datt.data(), s.datty.data(), a.qkv.data(), a.att.data(), B, T, C, cfg.NH);
  k::matmul_backward(s.dln.data(), qkv_w->grad.data(), qkv_b->grad.data(), s.dqkv.data(), a.ln1.data(),
                     qkv_w->value.data(), BT, C, 3 * C);
  k::layernorm_backward(dres, ln1_w->grad.data(), ln1_b->grad.data(), s.dln.data(), a.x.data(),
                        ln1_w->value.data(), a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
}

void Block::backward_input(float* dres, BlockActs& a, BlockGrads& g, BlockScratch& s, int B, int T,
                           const GPTConfig& cfg) const {
  namespace k = kernels;
  const int C = cfg.C;
  const int64_t BT = (int64_t)B * T;
  std::memcpy(g.dy.data(), dres, BT * C * sizeof(float));
  k::matmul_backward(s.dfch_gelu.data(), nullptr, nullptr, dres, a.fch_gelu.data(), fcproj_w->value.data(), BT,
                     4 * C, C);
  k::gelu_backward(g.dfch.data(), a.fch.data(), s.dfch_gelu.data(), BT * 4 * C);
  k::matmul_backward(g.dln2.data(), nullptr, nullptr, g.dfch.data(), a.ln2.data(), fc_w->value.data(), BT, C, 4 * C);
  k::layernorm_backward(dres, nullptr, nullptr, g.dln2.data(), a.x2.data(), ln2_w->value.data(), a.ln2_mean.data(),
                        a.ln2_rstd.data(), BT, C);
  std::memcpy(g.dx2.data(), dres, BT * C * sizeof(float));
  k::matmul_backward(s.datty.data(), nullptr, nullptr, dres, a.atty.data(), proj_w->value.data(), BT, C, C);
  k::attention_backward(g.dqkv.data(), s.datt.data(), s.datty.data(), a.qkv.data(), a.att.data(), B, T, C, cfg.NH);
  k::matmul_backward(g.dln1.data(), nullptr, nullptr, g.dqkv.data(), a.ln1.data(), qkv_w->value.data(), BT, C, 3 * C);
  k::layernorm_backward(dres, nullptr, nullptr, g.dln1.data(), a.x.data(), ln1_w->value.data(), a.ln1_mean.data(),
                        a.ln1_rstd.data(), BT, C);
}

void Block::backward_weight(const BlockActs& a, const BlockGrads& g, int B, int T, const GPTConfig& cfg) const {
  namespace k = kernels;
  const int C = cfg.C;
  const int64_t BT = (int64_t)B * T;
  k::matmul_backward(nullptr, fcproj_w->grad.data(), fcproj_b->grad.data(), g.dy.data(), a.fch_gelu.data(),
                     fcproj_w->value.data(), BT, 4 * C, C);
  k::matmul_backward(nullptr, fc_w->grad.data(), fc_b->grad.data(), g.dfch.data(), a.ln2.data(), fc_w->value.data(),
                     BT, C, 4 * C);
  k::layernorm_backward(nullptr, ln2_w->grad.data(), ln2_b->grad.data(), g.dln2.data(), a.x2.data(),
                        ln2_w->value.data(), a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
  k::matmul_backward(nullptr, proj_w->grad.data(), proj_b->grad.data(), g.dx2.data(), a.atty.data(),
                     proj_w->value.data(), BT, C, C);
  k::matmul_backward(nullptr, qkv_w->grad.data(), qkv_b->grad.data(), g.dqkv.data(), a.ln1.data(),
                     qkv_w->value.data(), BT, C, 3 * C);
  k::layernorm_backward(nullptr, ln1_w->grad.data(), ln1_b->grad.data(), g.dln1.data(), a.x.data(),
                        ln1_w->value.data(), a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
}

}  // namespace troupe
