#include "collectives/wire.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>

#include <cstring>

#include "schemas/wire.capnp.h"

namespace troupe {

namespace {

// One HMAC-SHA256 context per thread, keyed once and re-initialised per message (OpenSSL's
// one-shot HMAC() fetches the digest and schedules the key on every call: 1.6 us against
// 0.3 us, paid twice per data-plane message; bench/ucx_bench --latency).
struct HmacCtx {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
  std::string key;
  bool keyed = false;
  ~HmacCtx() {
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
  }
};

}  // namespace

std::vector<uint8_t> hmac_sha256(const std::string& key, const uint8_t* data, size_t n) {
  thread_local HmacCtx h;
  if (!h.ctx) {
    h.mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (!h.mac || !(h.ctx = EVP_MAC_CTX_new(h.mac))) throw Error("HMAC-SHA256: OpenSSL has no HMAC");
  }
  bool ok;
  if (!h.keyed || h.key != key) {
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
    h.keyed = false;
    ok = EVP_MAC_init(h.ctx, (const unsigned char*)key.data(), key.size(), params) == 1;
    if (ok) h.key = key, h.keyed = true;
  } else {
    ok = EVP_MAC_init(h.ctx, nullptr, 0, nullptr) == 1;  // the same key again
  }
  std::vector<uint8_t> out(32);
  size_t len = 0;
  if (!ok || EVP_MAC_update(h.ctx, data, n) != 1 || EVP_MAC_final(h.ctx, out.data(), &len, out.size()) != 1 ||
      len != 32)
    throw Error("HMAC-SHA256 failed");
  return out;
}

std::vector<uint8_t> encode_header(const WireHeader& h, const std::string& secret) {
  capnp::MallocMessageBuilder msg;
  auto m = msg.initRoot<schema::TensorHeader>();
  m.setVersion(1);
  m.setStep(h.step);
  m.setMicrobatch(h.microbatch);
  m.setChunk(h.chunk);
  m.setKind(h.kind);
  m.setSource(h.source);
  m.setDestination(h.destination);
  m.setDtype((uint8_t)h.dtype);
  auto sh = m.initShape((unsigned)h.shape.size());
  for (size_t i = 0; i < h.shape.size(); ++i) sh.set((unsigned)i, h.shape[i]);
  m.setBytes(h.bytes);
  auto words = capnp::messageToFlatArray(msg);
  auto bytes = words.asBytes();
  std::vector<uint8_t> out(4 + bytes.size());
  const uint32_t L = (uint32_t)bytes.size();
  std::memcpy(out.data(), &L, 4);
  std::memcpy(out.data() + 4, bytes.begin(), bytes.size());
  auto tag = hmac_sha256(secret, out.data(), out.size());
  out.insert(out.end(), tag.begin(), tag.end());
  return out;
}

WireHeader decode_header(const uint8_t* data, size_t n, const std::string& secret, const WireLimits& lim) {
  if (n < 4 + 32) throw ProtocolError("data-plane header: frame of " + std::to_string(n) + " bytes is too short");
  uint32_t L = 0;
  std::memcpy(&L, data, 4);
  if (L == 0 || L % 8 != 0 || L > 4096 || (size_t)L + 4 + 32 != n)
    throw ProtocolError("data-plane header: bad length " + std::to_string(L) + " for a frame of " + std::to_string(n) +
                        " bytes");
  auto tag = hmac_sha256(secret, data, 4 + (size_t)L);
  if (CRYPTO_memcmp(tag.data(), data + 4 + L, 32) != 0)
    throw ProtocolError("data-plane header: authentication failed (not from a process of this job)");
  WireHeader h;
  try {
    std::vector<capnp::word> words(L / 8);
    std::memcpy(words.data(), data + 4, L);
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = 512;
    opts.nestingLimit = 4;
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(words.data(), words.size()), opts);
    auto m = reader.getRoot<schema::TensorHeader>();
    if (m.getVersion() != 1) throw ProtocolError("data-plane header: version " + std::to_string(m.getVersion()));
    h.step = m.getStep();
    h.microbatch = m.getMicrobatch();
    h.chunk = m.getChunk();
    h.kind = m.getKind();
    h.source = m.getSource();
    h.destination = m.getDestination();
    const uint8_t dt = m.getDtype();
    if (dt > 2) throw ProtocolError("data-plane header: unknown dtype " + std::to_string(dt));
    h.dtype = (DType)dt;
    auto sh = m.getShape();
    if ((int)sh.size() > lim.max_dims)
      throw ProtocolError("data-plane header: " + std::to_string(sh.size()) + " dimensions");
    for (auto d : sh) h.shape.push_back(d);
    h.bytes = m.getBytes();
  } catch (const kj::Exception& e) {
    throw ProtocolError(std::string("data-plane header: malformed (") + e.getDescription().cStr() + ")");
  }
  // steps: training steps are >= 1, validation batches are negative (actors/job.cpp)
  if (h.step < -(int64_t(1) << 62) || h.step > (int64_t(1) << 62) || h.microbatch < 0 || h.chunk < 0 || h.kind > 5)
    throw ProtocolError("data-plane header: step/microbatch/chunk/kind out of range");
  if (h.source < 0 || h.source >= lim.world || h.destination < 0 || h.destination >= lim.world)
    throw ProtocolError("data-plane header: rank " + std::to_string(h.source) + " -> " + std::to_string(h.destination) +
                        " outside a world of " + std::to_string(lim.world));
  // bytes must equal product(shape) * dtype size, computed without overflow
  unsigned __int128 elems = 1;
  for (int64_t d : h.shape) {
    if (d < 0) throw ProtocolError("data-plane header: negative dimension");
    elems *= (unsigned __int128)d;
    if (elems > ((unsigned __int128)1 << 64)) throw ProtocolError("data-plane header: shape overflows");
  }
  const unsigned __int128 want = elems * dtype_size(h.dtype);
  if (want != h.bytes) throw ProtocolError("data-plane header: bytes " + std::to_string(h.bytes) + " do not match the shape");
  if (h.bytes > lim.max_bytes)
    throw ProtocolError("data-plane header: payload of " + std::to_string(h.bytes) + " bytes exceeds the limit");
  return h;
}

}  // namespace troupe
