// actors/wire_types.h — CAF serialization (inspect) of the message types that cross
// processes on the control plane (actors/cluster.h): step reports, norm reports, wait
// states, parameter dumps, snapshot shards and acks, token blocks. Pipeline tensors never
// go this way: they travel over UCX (collectives/ucx.h) with a Cap'n Proto header.
//
// Control messages are serialized with CAF's binary serializer and then authenticated by
// the cluster's HMAC envelope; a body is only deserialized after its tag checked out, and
// every float or double inside travels as its bits (below); and
// the load callbacks below still check every size they are given (a Tensor's element
// count against its shape).
#pragma once
#include <caf/all.hpp>
#include <cstring>

#include "actors/messages.h"

namespace troupe {

// Floating-point values travel as their bits. CAF 0.17's own float encoding (pack754)
// loops forever on an infinity and garbles NaNs and subnormals; an fp16 step that
// overflows reports inf, a diverged step NaN, and AdamW moments can be subnormal.
// A float or double seen through its bits (F = float, U = uint32_t; F = double, U = uint64_t).
template <class F, class U>
struct FloatBits {
  static_assert(sizeof(F) == sizeof(U));
  F* p;
};
using F64Bits = FloatBits<double, uint64_t>;
using F32Bits = FloatBits<float, uint32_t>;
struct F32VecBits {
  std::vector<float>* p;
};

template <class Inspector, class F, class U>
typename Inspector::result_type inspect(Inspector& f, FloatBits<F, U>& x) {
  U u = 0;
  if constexpr (Inspector::reads_state) std::memcpy(&u, x.p, sizeof u);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    std::memcpy(x.p, &u, sizeof u);
    return caf::none;
  });
  return f(u, load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, F32VecBits& x) {
  std::vector<uint32_t> u;
  if constexpr (Inspector::reads_state) {
    u.resize(x.p->size());
    if (!u.empty()) std::memcpy(u.data(), x.p->data(), u.size() * 4);
  }
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x.p->resize(u.size());
    if (!u.empty()) std::memcpy(x.p->data(), u.data(), u.size() * 4);
    return caf::none;
  });
  return f(u, load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Tensor& x) {
  std::vector<int64_t> shape;
  std::vector<float> data;
  bool defined = false;
  if constexpr (Inspector::reads_state) {
    defined = x.defined();
    shape = x.shape();
    if (defined) data.assign(x.data(), x.data() + x.numel());
  }
  auto load = caf::meta::load_callback([&]() -> caf::error {
    if (!defined) {
      x = Tensor();
      return caf::none;
    }
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0 || (d > 0 && n > (int64_t(1) << 40) / d)) return caf::make_error(caf::sec::invalid_argument, "tensor shape");
      n *= d;
    }
    if ((size_t)n != data.size()) return caf::make_error(caf::sec::invalid_argument, "tensor size differs from its shape");
    x = Tensor(shape);
    if (n) std::memcpy(x.data(), data.data(), data.size() * sizeof(float));
    return caf::none;
  });
  F32VecBits bits{&data};
  return f(caf::meta::type_name("troupe::Tensor"), defined, shape, bits, load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenBlock& x) {
  std::vector<int32_t> ids;
  if constexpr (Inspector::reads_state) {
    if (x.ids) ids = *x.ids;
  }
  auto load = caf::meta::load_callback([&]() -> caf::error {
    if ((int64_t)ids.size() != (int64_t)x.B * x.T) return caf::make_error(caf::sec::invalid_argument, "token block size");
    x.ids = std::make_shared<const std::vector<int32_t>>(std::move(ids));
    return caf::none;
  });
  F32Bits dloss{&x.dloss};
  return f(caf::meta::type_name("troupe::TokenBlock"), x.B, x.T, dloss, ids, load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NormReport& x) {
  std::vector<int32_t> idx;
  std::vector<uint64_t> bits;
  if constexpr (Inspector::reads_state) {
    for (auto& [i, v] : x.sumsq) {
      uint64_t u;
      std::memcpy(&u, &v, sizeof u);
      idx.push_back(i);
      bits.push_back(u);
    }
  }
  auto load = caf::meta::load_callback([&]() -> caf::error {
    if (idx.size() != bits.size()) return caf::make_error(caf::sec::invalid_argument, "norm report sizes");
    x.sumsq.clear();
    for (size_t i = 0; i < idx.size(); ++i) {
      double v;
      std::memcpy(&v, &bits[i], sizeof v);
      x.sumsq.emplace_back(idx[i], v);
    }
    return caf::none;
  });
  return f(caf::meta::type_name("troupe::NormReport"), x.stage, idx, bits, x.found_inf, load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Span& x) {
  F64Bits t0{&x.t0}, t1{&x.t1};
  return f(caf::meta::type_name("troupe::Span"), x.kind, x.mb, x.chunk, t0, t1);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepReport& x) {
  F64Bits loss{&x.loss_sum}, compute{&x.compute_s}, wait{&x.wait_s}, scale{&x.loss_scale};
  return f(caf::meta::type_name("troupe::StepReport"), x.stage, x.tp, x.dp, loss, x.tokens, compute, wait,
           x.activation_bytes, scale, x.spans);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WaitState& x) {
  return f(caf::meta::type_name("troupe::WaitState"), x.stage, x.tp, x.dp, x.waiting, x.timed_out, x.step, x.from,
           x.what, x.pos, x.msg, x.mb, x.from_chunk);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ParamDump& x) {
  return f(caf::meta::type_name("troupe::ParamDump"), x.stage, x.tp, x.dp, x.params);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SnapAck& x) {
  F64Bits scale{&x.loss_scale}, copy{&x.copy_s};
  return f(caf::meta::type_name("troupe::SnapAck"), x.updates, scale, x.growth_tracker, x.hysteresis_tracker, copy);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardRecord& x) {
  F32VecBits data{&x.data};
  return f(caf::meta::type_name("troupe::ShardRecord"), x.name, x.field, x.tp, x.offset, x.local_numel, data);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardData& x) {
  return f(caf::meta::type_name("troupe::ShardData"), x.dp, x.pp, x.tp, x.records);
}

// Registers every type above with an actor system's configuration (before the system
// is created), so CAF can serialize messages holding them.
inline void register_wire_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<Tensor>("troupe::Tensor");
  cfg.add_message_type<TokenBlock>("troupe::TokenBlock");
  cfg.add_message_type<NormReport>("troupe::NormReport");
  cfg.add_message_type<StepReport>("troupe::StepReport");
  cfg.add_message_type<WaitState>("troupe::WaitState");
  cfg.add_message_type<ParamDump>("troupe::ParamDump");
  cfg.add_message_type<SnapAck>("troupe::SnapAck");
  cfg.add_message_type<ShardData>("troupe::ShardData");
  cfg.add_message_type<std::vector<char>>("std::vector<char>");
  cfg.add_message_type<std::vector<std::vector<char>>>("std::vector<std::vector<char>>");
  cfg.add_message_type<std::vector<int64_t>>("std::vector<int64_t>");
  cfg.add_message_type<std::vector<int32_t>>("std::vector<int32_t>");
}

}  // namespace troupe
