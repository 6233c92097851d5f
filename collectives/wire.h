// collectives/wire.h — the data-plane message header between processes (issue 6): a
// Cap'n Proto TensorHeader (schemas/wire.capnp) followed by an HMAC-SHA256 tag keyed by
// the job secret. Nothing from the network is trusted: decode_header checks the frame
// length, the tag, the Cap'n Proto message (traversal limits), every field's range and that
// `bytes` equals product(shape) x dtype size within the caller's limit — before the caller
// allocates or copies a payload.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace troupe {

// Header kinds (schemas/wire.capnp TensorHeader.kind).
enum WireKind : uint8_t {
  kWireActivation = 0,   // pipeline: (step, microbatch, receiving chunk), tensor (B, T, C)
  kWireGradient = 1,     // pipeline: output gradient, (B, T, C)
  kWireTied = 2,         // tied-embedding gradient between the first and last stage, (V, C)
  kWireCollective = 3,   // a Communicator's traffic: step = the group's call sequence number,
                         // microbatch = the group's id, chunk = the phase within the call
  kWireInference = 4,    // sampling: (id, 0, receiving chunk), tensor (1, T, C)
  kWireSnapshot = 5,     // a memory-snapshot shard (checkpoint/memory_store.h encode_shard): step = the
                         // snapshot's step, microbatch = the shard's global rank, chunk = 0 a peer's
                         // copy, 1 the state of an in-place recovery; a flat f32 buffer
};

struct WireHeader {
  int64_t step = 0;
  int32_t microbatch = 0, chunk = 0;
  uint8_t kind = 0;  // a WireKind
  int32_t source = 0, destination = 0;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// A header or message that must be rejected (malformed, unauthenticated, out of range).
struct ProtocolError : Error {
  using Error::Error;
};

struct WireLimits {
  int32_t world = 1;                 // ranks are in [0, world)
  uint64_t max_bytes = 1ull << 34;   // largest payload accepted
  int max_dims = 8;
};

// HMAC-SHA256 (RFC 2104) of data under key; 32 bytes. (OpenSSL's SHA-256.)
std::vector<uint8_t> hmac_sha256(const std::string& key, const uint8_t* data, size_t n);
void hmac_sha256(const std::string& key, const uint8_t* data, size_t n, uint8_t out[32]);

// Frame: u32 little-endian length L of the Cap'n Proto message, the message (L bytes, a
// multiple of 8), then the 32-byte HMAC of (length + message) under `secret`. The vector has
// room for `extra` more bytes (a payload sent after the frame) without reallocating.
std::vector<uint8_t> encode_header(const WireHeader& h, const std::string& secret, size_t extra = 0);

// Parses and checks a frame (see above). Throws ProtocolError naming what is wrong.
WireHeader decode_header(const uint8_t* data, size_t n, const std::string& secret, const WireLimits& lim);

}  // namespace troupe
