// The single-worker model against the PyTorch reference (tests/fixtures/gpt_tiny.bin,
// made by bench/reference/make_fixture.py): logits and loss within 1e-5, every parameter
// gradient within 1e-4 (norm-relative, per tensor), the losses of 10 AdamW steps within 1e-5.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "fixture_io.h"
#include "kernels/kernels.h"
#include "optimizer/optimizer.h"
#include "stages/stage.h"

using namespace troupe;

namespace {
Fixture& fixture() {
  static Fixture f = load_fixture(std::string(TROUPE_SOURCE_DIR) + "/tests/fixtures/gpt_tiny.bin");
  return f;
}
GPTConfig fixture_cfg() {
  auto& h = fixture().header;
  return {h["n_layer"].get<int>(), h["n_head"].get<int>(), h["n_embd"].get<int>(), h["block_size"].get<int>(),
          h["vocab_size"].get<int>()};
}
void load_params(Stage& st) {
  for (auto& p : st.params()) {
    auto& t = fixture().at("param/" + p.name);
    // wte is padded with zero rows to a multiple of 64 (Megatron's vocab padding)
    REQUIRE((size_t)p.value.numel() >= t.f.size());
    REQUIRE((p.name == "wte" || (size_t)p.value.numel() == t.f.size()));
    std::memcpy(p.value.data(), t.f.data(), t.f.size() * 4);
  }
}
// (the padding rows of wte beyond ref.size() must stay exactly zero: checked by callers)
double rel_err(const float* a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return std::sqrt(num) / std::max(1e-30, std::sqrt(den));
}
// Forward + backward of the fixture batch on a one-stage model; returns the mean loss.
double forward_backward(Stage& st) {
  const int B = fixture().header["B"], T = fixture().header["T"];
  auto& tok = fixture().at("input/tokens").i;
  auto& tgt = fixture().at("input/targets").i;
  double loss = 0;
  st.forward(0, B, T, tok.data(), Tensor(), tgt.data(), 1.0f / (B * T), &loss, true);
  st.backward(0, Tensor());
  st.tie_grads(st.head_grad());
  return loss / (B * T);
}
}  // namespace

TEST_CASE("logits and loss match PyTorch", "[model][reference]") {
  GPTConfig cfg = fixture_cfg();
  const int B = fixture().header["B"], T = fixture().header["T"];
  Stage st(cfg, 0, 1, 0, cfg.L, 1);
  load_params(st);
  auto& tok = fixture().at("input/tokens").i;
  // logits: the last position's logits of every prefix (Stage::infer)
  std::vector<float> logits((size_t)B * T * cfg.V);
  {
    Stage probe(cfg, 0, 1, 0, cfg.L, 1);
    load_params(probe);
    std::vector<float> last;
    // infer gives the last position only: check every prefix length's last position.
    for (int b = 0; b < B; ++b)
      for (int t = 1; t <= T; ++t) {
        probe.infer(t, tok.data() + b * T, Tensor(), &last);
        std::memcpy(&logits[((size_t)b * T + t - 1) * cfg.V], last.data(), cfg.V * 4);
      }
  }
  auto& ref = fixture().at("out/logits").f;
  double max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i) max_abs = std::max(max_abs, std::fabs((double)logits[i] - ref[i]));
  INFO("first logits: " << logits[0] << " " << logits[1] << " vs " << ref[0] << " " << ref[1]);
  CHECK(max_abs < 1e-5);
  const double loss = forward_backward(st);
  CHECK(std::fabs(loss - fixture().at("out/loss").f[0]) < 1e-5);
}

TEST_CASE("every parameter gradient matches PyTorch", "[model][reference]") {
  GPTConfig cfg = fixture_cfg();
  Stage st(cfg, 0, 1, 0, cfg.L, 1);
  load_params(st);
  forward_backward(st);
  for (auto& p : st.params()) {
    const auto& ref = fixture().at("grad/" + p.name).f;
    for (int64_t i = (int64_t)ref.size(); i < p.grad.numel(); ++i) REQUIRE(p.grad.data()[i] == 0.0f);
    double e = rel_err(p.grad.data(), ref);
    INFO(p.name << ": norm-relative error " << e << ", first value " << p.grad.data()[0] << " vs "
                << fixture().at("grad/" + p.name).f[0]);
    CHECK(e < 1e-4);
  }
}

TEST_CASE("10 AdamW steps match PyTorch", "[model][reference][optimizer]") {
  GPTConfig cfg = fixture_cfg();
  auto& h = fixture().header;
  OptimConfig o;
  o.lr = h["lr"];
  o.min_lr = h["min_lr"];
  o.warmup_steps = h["warmup_steps"];
  o.lr_decay_steps = h["lr_decay_steps"];
  o.weight_decay = h["weight_decay"];
  o.beta1 = h["beta1"];
  o.beta2 = h["beta2"];
  o.eps = h["eps"];
  o.grad_clip = h["grad_clip"];
  Stage st(cfg, 0, 1, 0, cfg.L, 1);
  load_params(st);
  auto& ref_losses = fixture().at("train/losses").f;
  auto& ref_lrs = fixture().at("train/lrs").f;
  auto& ref_norms = fixture().at("train/grad_norms").f;
  std::vector<AdamWState> state(st.params().size());
  for (int s = 1; s <= (int)ref_losses.size(); ++s) {
    st.zero_grads();
    const double loss = forward_backward(st);
    double norm = global_grad_norm(st.grad_sumsq());
    double lr = lr_at(o, s);
    INFO("step " << s << ": loss " << loss << " vs " << ref_losses[s - 1] << ", norm " << norm << " vs "
                 << ref_norms[s - 1]);
    CHECK(std::fabs(loss - ref_losses[s - 1]) < 1e-5);
    CHECK(std::fabs(lr - ref_lrs[s - 1]) < 1e-9 * std::max(1.0, lr) + 1e-9);
    CHECK(std::fabs(norm - ref_norms[s - 1]) < 1e-4 * ref_norms[s - 1]);
    float sc = clip_scale(norm, o.grad_clip);
    for (size_t i = 0; i < st.params().size(); ++i) {
      auto& p = st.params()[i];
      adamw_step(p.value, p.grad, state[i], o, p.decay, lr, sc, s);
    }
  }
}
