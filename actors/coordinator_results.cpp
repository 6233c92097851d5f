// The coordinator's results beyond the step loop (actors/coordinator.h): evaluation,
// sampling, the parameter dump and the trace (its analysis: stages/trace_analysis.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "actors/coordinator.h"
#include "checkpoint/disk.h"
#include "core/error.h"
#include "datasets/corpus.h"
#include "core/events.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"
#include "stages/trace_analysis.h"

namespace troupe {

// The validation loss: over one split, or (a blend) the mean of every source's, each kept
// in val_source_losses_.
double Coordinator::evaluate() {
  // Validation batches run as forward-only steps with negative ids.
  const int nb = cfg_.train.eval_batches;
  const int S = std::max<int>(1, (int)ctx_.val_sources.size());
  val_source_losses_.clear();
  double sum = 0;
  // a window of batches in flight keeps every stage busy (forward-only: P suffice; 4 per
  // stage) while a signal is noticed within one window, and memory holds one window's tokens
  const int window = std::max(16, 4 * plan_.P);
  for (int s = 0; s < S; ++s) {
    double loss_sum = 0, tokens = 0;
    for (int j0 = 0; j0 < nb; j0 += window) {
      if (stop_signal() != 0) {
        if (!ctx_.quiet)
          spdlog::info("signal {}: validation stopped after {} of {} batches{}; no val loss is recorded", stop_signal(),
                       (int64_t)s * nb + j0, (int64_t)S * nb, S > 1 ? " (of every source)" : "");
        val_source_losses_.clear();
        return NAN;
      }
      const int n = std::min(window, nb - j0);
      for (int j = j0; j < j0 + n; ++j) {
        int64_t k = -(++eval_counter_);
        for (auto& da : a_.datas) (*self_)->send(da, batch_atom::value, k, 1 + s, (int64_t)j);
        for (auto& w : a_.workers) (*self_)->send(w, step_atom::value, k, 1, scaler_ ? scaler_->scale() : 1.0);
      }
      auto total = collect_done(0, "validation", n * plan_.P * plan_.TP * plan_.DP);
      loss_sum += total.loss_sum;
      tokens += (double)total.tokens;
    }
    val_source_losses_.push_back(loss_sum / tokens);
    sum += val_source_losses_.back();
  }
  return S == 1 ? val_source_losses_[0] : sum / S;
}

std::string Coordinator::sample(int n, JobResult& res) {
  std::vector<int32_t> toks = ctx_.prompt;
  if (toks.empty()) toks = {ctx_.sample_start_token};
  std::mt19937_64 rng(ctx_.sample_seed ? ctx_.sample_seed : cfg_.train.seed ^ 0x5a5a5a5aULL);
  std::vector<int32_t> out;
  const auto t0 = std::chrono::steady_clock::now();
  auto said = t0;
  for (int i = 0; i < n; ++i) {
    // train's end-of-run sample is not streamed (generate's is, through on_token): a progress
    // line at most every 10 s, so a long one is never minutes of silence
    if (const auto now = std::chrono::steady_clock::now(); !ctx_.quiet && !ctx_.on_token && now - said > std::chrono::seconds(10)) {
      said = now;
      spdlog::info("sample: {} of {} tokens ({:.0f} tokens/s)", i, n, i / std::chrono::duration<double>(now - t0).count());
    }
    if (i > 0 && stop_signal() != 0) {  // Ctrl-C during the sample: it ends here
      if (!ctx_.quiet) spdlog::info("signal {}: the sample stops after {} of {} tokens", stop_signal(), i, n);
      break;
    }
    const int T = std::min<int>((int)toks.size(), plan_.gpt.maxT);
    auto ids = std::make_shared<std::vector<int32_t>>(toks.end() - T, toks.end());
    for (int t = 0; t < plan_.TP; ++t) (*self_)->send(a_.workers[t], infer_atom::value, (int64_t)i, TokenBlock{ids, 1, T});
    std::vector<float> logits;
    bool got = false;
    wait([&] { return got; }, "the logits of sample token " + std::to_string(i), [&](std::vector<float>& l) {
      logits = std::move(l);
      got = true;
    });
    if (i == 0) res.prompt_logits = logits;
    // softmax sampling at the temperature over the top-k tokens (temperature 0: greedy)
    std::vector<int32_t> idx(logits.size());
    for (size_t q = 0; q < idx.size(); ++q) idx[q] = (int32_t)q;
    const size_t topk = ctx_.top_k > 0 ? std::min<size_t>(ctx_.top_k, idx.size()) : idx.size();
    std::partial_sort(idx.begin(), idx.begin() + topk, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    int32_t next = idx[0];
    if (ctx_.temperature > 0) {
      std::vector<double> pr(topk);
      for (size_t q = 0; q < topk; ++q) pr[q] = std::exp((logits[idx[q]] - logits[idx[0]]) / ctx_.temperature);
      std::discrete_distribution<size_t> dist(pr.begin(), pr.end());
      next = idx[dist(rng)];
    }
    toks.push_back(next);
    out.push_back(next);
    if (ctx_.on_token) ctx_.on_token(next);
  }
  res.sample_ids = out;
  return ctx_.decode ? ctx_.decode(out) : std::string();
}

// Every worker's parameters; TP shards assembled into logical tensors (wte without its
// padding). With PP > 1 the tied embedding appears twice (first and last stage copies).
std::vector<std::pair<std::string, Tensor>> Coordinator::dump_params() {
  std::vector<ParamDump> dumps;
  for (auto& w : a_.workers) (*self_)->send(w, dump_atom::value);
  wait([&] { return (int)dumps.size() == plan_.P * plan_.TP * plan_.DP; }, "the parameter dump",
       [&](ParamDump& d) { dumps.push_back(std::move(d)); });
  std::sort(dumps.begin(), dumps.end(),
            [](auto& a, auto& b) { return std::tie(a.dp, a.stage, a.tp) < std::tie(b.dp, b.stage, b.tp); });
  // DP replicas hold bitwise the same parameters after every step
  for (size_t w = (size_t)plan_.P * plan_.TP; w < dumps.size(); ++w) {
    const auto& a = dumps[w % ((size_t)plan_.P * plan_.TP)];
    const auto& b = dumps[w];
    for (size_t i = 0; i < a.params.size(); ++i) {
      TROUPE_CHECK(std::memcmp(a.params[i].second.data(), b.params[i].second.data(), a.params[i].second.nbytes()) == 0)
          << "parameter " << a.params[i].first << " of stage " << b.stage << " differs between DP ranks 0 and " << b.dp;
    }
  }
  std::map<std::string, ParamSpec> specs;
  for (auto& sp : gpt_param_specs(plan_.gpt)) specs[sp.name] = sp;
  std::vector<std::pair<std::string, Tensor>> out;
  for (int s = 0; s < plan_.P; ++s) {
    const auto& d0 = dumps[s * plan_.TP];
    for (size_t i = 0; i < d0.params.size(); ++i) {
      const std::string& name = d0.params[i].first;
      std::vector<Tensor> parts;
      for (int t = 0; t < plan_.TP; ++t) parts.push_back(dumps[s * plan_.TP + t].params[i].second);
      if (specs.at(name).shard == Shard::replicated) {  // kept identical on every TP rank
        for (int t = 1; t < plan_.TP; ++t) {
          TROUPE_CHECK(std::memcmp(parts[t].data(), parts[0].data(), parts[0].nbytes()) == 0)
              << "replicated parameter " << name << " of stage " << s << " differs between TP ranks 0 and " << t;
        }
      }
      GPTConfig g = plan_.gpt;
      g.TP = plan_.TP;
      out.emplace_back(name, assemble(parts, specs.at(name), g));
    }
  }
  return out;
}

// Writes the Chrome trace of measured spans and compares the measured pipeline with the
// simulator fed the measured average cost of every (stage, chunk, action kind).
void Coordinator::analyze_trace(JobResult& res) {
  // through a temporary file: a disk that fills leaves no half trace. A trace that cannot be
  // written is a lost log, not a failed run (its space was checked before training; the disk
  // filled since): said once, and the run ends as it would have.
  bool written = true;
  try {
    write_file_atomic(ctx_.trace_path, measured_chrome_trace(plan_.P, trace_, cfg_.to_toml()));
  } catch (const std::exception& e) {
    written = false;
    spdlog::warn("warning: the trace was not written: {}; training and snapshots are complete", e.what());
  }
  const TraceAnalysis a = troupe::analyze_trace(*plan_.schedule, plan_.P, cfg_.train.steps, trace_);
  if (a.empty) return;
  res.measured_bubble = a.measured_bubble;
  res.simulated_bubble = a.simulated_bubble;
  res.measured_pipeline_ms = a.measured_ms;
  res.simulated_pipeline_ms = a.simulated_ms;
  if (!ctx_.quiet) {
    if (written) spdlog::info("trace written to {} (open in chrome://tracing or ui.perfetto.dev)", ctx_.trace_path);
    spdlog::info("pipeline over steps {}..{}: measured {:.2f} ms per step vs {:.2f} ms simulated from measured action "
                 "costs ({:+.1f}% runtime overhead)",
                 a.first_step, cfg_.train.steps, res.measured_pipeline_ms, res.simulated_pipeline_ms,
                 100.0 * (res.measured_pipeline_ms / res.simulated_pipeline_ms - 1.0));
    for (int s = 0; s < plan_.P; ++s)
      spdlog::info("stage {}: bubble measured {:.4f}, simulated {:.4f}; mean action cost{}", s, a.measured_bubble[s],
                   a.simulated_bubble[s], describe_costs(a, s));
  }
}

}  // namespace troupe
