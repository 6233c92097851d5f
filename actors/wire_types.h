// actors/wire_types.h — CAF serialization (inspect) of the message types that cross
// processes on the control plane (actors/cluster.h): step reports, norm reports, wait
// states, parameter dumps, snapshot shards and acks, token blocks. Pipeline tensors never
// go this way: they travel over UCX (collectives/ucx.h) with a Cap'n Proto header.
//
// Control messages are serialized with CAF's binary serializer and then authenticated by
// the cluster's HMAC envelope; a body is only deserialized after its tag checked out, and
// the load callbacks below still check every size they are given (a Tensor's element
// count against its shape).
#pragma once
#include <caf/all.hpp>
#include <cstring>

#include "actors/messages.h"

namespace troupe {

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
  return f(caf::meta::type_name("troupe::Tensor"), defined, shape, data, load);
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
  return f(caf::meta::type_name("troupe::TokenBlock"), x.B, x.T, x.dloss, ids, load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NormReport& x) {
  return f(caf::meta::type_name("troupe::NormReport"), x.stage, x.sumsq, x.found_inf);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Span& x) {
  return f(caf::meta::type_name("troupe::Span"), x.kind, x.mb, x.chunk, x.t0, x.t1);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepReport& x) {
  return f(caf::meta::type_name("troupe::StepReport"), x.stage, x.tp, x.dp, x.loss_sum, x.tokens, x.compute_s,
           x.wait_s, x.activation_bytes, x.loss_scale, x.spans);
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
  return f(caf::meta::type_name("troupe::SnapAck"), x.updates, x.loss_scale, x.growth_tracker, x.hysteresis_tracker,
           x.copy_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardRecord& x) {
  return f(caf::meta::type_name("troupe::ShardRecord"), x.name, x.field, x.tp, x.offset, x.local_numel, x.data);
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
  cfg.add_message_type<std::vector<float>>("std::vector<float>");
  cfg.add_message_type<std::vector<char>>("std::vector<char>");
  cfg.add_message_type<std::vector<std::vector<char>>>("std::vector<std::vector<char>>");
}

}  // namespace troupe
