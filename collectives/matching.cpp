// Text and identity helpers of collectives/matching.h.
#include "collectives/matching.h"

namespace troupe {

MatchKey match_key(const WireHeader& h) { return {h.kind, h.source, h.destination, h.step, h.microbatch, h.chunk}; }

bool same_layout(const WireHeader& a, const WireHeader& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.bytes == b.bytes;
}

const char* wire_kind_name(uint8_t k) {
  switch (k) {
    case kWireActivation: return "activation";
    case kWireGradient: return "gradient";
    case kWireTied: return "tied-embedding gradient";
    case kWireCollective: return "collective";
    case kWireInference: return "inference";
    case kWireSnapshot: return "memory-snapshot shard";
    default: return "unknown kind";
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string wire_ident(const WireHeader& h) {
  return std::string(wire_kind_name(h.kind)) + " (step " + std::to_string(h.step) + ", microbatch " +
         std::to_string(h.microbatch) + ", chunk " + std::to_string(h.chunk) + ")";
}

std::string wire_layout(const WireHeader& h) {
  return std::string(dtype_name(h.dtype)) + " " + shape_text(h.shape) + " (" + std::to_string(h.bytes) + " bytes)";
}

std::string layout_mismatch(const WireHeader& got, const WireHeader& want) {
  return "rank " + std::to_string(got.source) + " sent " + wire_layout(got) + " but rank " +
         std::to_string(want.destination) + " expects " + wire_layout(want);
}

}  // namespace troupe
