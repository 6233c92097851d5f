// model/params.cpp — the GPT's parameters: canonical specs, init, TP shards (model/params.h).
#include "model/params.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"

namespace troupe {

int64_t GPTConfig::n_params() const { return n_params_no_wpe() + (int64_t)maxT * C; }
int64_t GPTConfig::n_params_no_wpe() const {
  int64_t per_block = 2 * C + 3LL * C * C + 3LL * C + (int64_t)C * C + C + 2 * C + 4LL * C * C + 4LL * C +
                      4LL * C * C + C;
  return (int64_t)V * C + L * per_block + 2 * C;
}

std::vector<ParamSpec> gpt_param_specs(const GPTConfig& c) {
  std::vector<ParamSpec> s;
  s.push_back({"wte", {c.V, c.C}, true, Init::normal, -1, Shard::vocab_rows});
  s.push_back({"wpe", {c.maxT, c.C}, true, Init::normal, -1});
  for (int l = 0; l < c.L; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    s.push_back({p + "ln_1.weight", {c.C}, false, Init::ones, l});
    s.push_back({p + "ln_1.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "attn.qkv.weight", {3 * c.C, c.C}, true, Init::normal, l, Shard::qkv_rows});
    s.push_back({p + "attn.qkv.bias", {3 * c.C}, false, Init::zeros, l, Shard::qkv_rows});
    s.push_back({p + "attn.proj.weight", {c.C, c.C}, true, Init::normal_residual, l, Shard::cols});
    s.push_back({p + "attn.proj.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "ln_2.weight", {c.C}, false, Init::ones, l});
    s.push_back({p + "ln_2.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "mlp.fc.weight", {4 * c.C, c.C}, true, Init::normal, l, Shard::rows});
    s.push_back({p + "mlp.fc.bias", {4 * c.C}, false, Init::zeros, l, Shard::rows});
    s.push_back({p + "mlp.proj.weight", {c.C, 4 * c.C}, true, Init::normal_residual, l, Shard::cols});
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

std::vector<int64_t> local_shape(const ParamSpec& sp, const GPTConfig& c) {
  auto s = sp.shape;
  switch (sp.shard) {
    case Shard::replicated: break;
    case Shard::rows:
    case Shard::qkv_rows: s[0] /= c.TP; break;
    case Shard::cols: s[1] /= c.TP; break;
    case Shard::vocab_rows: s[0] = c.Vl(); break;
  }
  return s;
}

namespace {
// Row r of the local part comes from row src_row(r) of the full tensor (-1: padding).
int64_t src_row(const ParamSpec& sp, const GPTConfig& c, int64_t r, int rank) {
  switch (sp.shard) {
    case Shard::rows: return rank * (sp.shape[0] / c.TP) + r;
    case Shard::qkv_rows: {
      const int64_t part = sp.shape[0] / 3 / c.TP;  // rows of q (or k, v) per rank
      return (r / part) * (sp.shape[0] / 3) + rank * part + r % part;
    }
    case Shard::vocab_rows: {
      const int64_t g = (int64_t)rank * c.Vl() + r;
      return g < c.V ? g : -1;
    }
    default: return r;
  }
}
}  // namespace

Tensor shard_of(const Tensor& full, const ParamSpec& sp, const GPTConfig& c) {
  Tensor out(local_shape(sp, c));
  if (sp.shard == Shard::replicated) return full.clone();
  const int64_t cols = full.ndim() == 2 ? full.dim(1) : 1;
  if (sp.shard == Shard::cols) {
    const int64_t lc = out.dim(1);
    for (int64_t r = 0; r < out.dim(0); ++r)
      std::memcpy(out.data() + r * lc, full.data() + r * cols + c.tp_rank * lc, lc * sizeof(float));
    return out;
  }
  for (int64_t r = 0; r < out.dim(0); ++r) {
    int64_t s = src_row(sp, c, r, c.tp_rank);
    if (s >= 0) std::memcpy(out.data() + r * cols, full.data() + s * cols, cols * sizeof(float));
  }
  return out;
}

Tensor assemble(const std::vector<Tensor>& parts, const ParamSpec& sp, const GPTConfig& c) {
  TROUPE_CHECK((int)parts.size() == c.TP) << sp.name << ": " << parts.size() << " parts for TP = " << c.TP;
  if (sp.shard == Shard::replicated) return parts[0].clone();
  Tensor full(sp.shape);
  const int64_t cols = full.ndim() == 2 ? full.dim(1) : 1;
  for (int rank = 0; rank < c.TP; ++rank) {
    const Tensor& p = parts[rank];
    if (sp.shard == Shard::cols) {
      const int64_t lc = p.dim(1);
      for (int64_t r = 0; r < p.dim(0); ++r)
        std::memcpy(full.data() + r * cols + rank * lc, p.data() + r * lc, lc * sizeof(float));
      continue;
    }
    for (int64_t r = 0; r < p.dim(0); ++r) {
      int64_t s = src_row(sp, c, r, rank);
      if (s >= 0) std::memcpy(full.data() + s * cols, p.data() + r * cols, cols * sizeof(float));
    }
  }
  return full;
}

void set_compute_copy(Param& p, const float* from, DType dt) {
  const std::vector<int64_t> shape = p.value.defined() ? p.value.shape() : p.grad.shape();
  if (!p.value.defined() || p.value.dtype() != dt) p.value = Tensor(shape, dt);
  // 16-bit: rounded to nearest even, straight into the storage (f32: copied unless `from`
  // is the value's own storage)
  ops::cast(p.value, Tensor::wrap(from, shape));
}

}  // namespace troupe
