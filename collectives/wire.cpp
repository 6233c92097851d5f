#include "collectives/wire.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#define OPENSSL_SUPPRESS_DEPRECATED  // SHA256_Init/Update/Final: see HmacCtx
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cstring>

#include "schemas/wire.capnp.h"

namespace troupe {

namespace {

// HMAC-SHA256 per thread, keyed once: the SHA-256 states after the key's inner and outer
// pad blocks are kept, and each message starts from copies of them (RFC 2104 as written).
// Per message (bench/ucx_bench --latency pays it twice per message): OpenSSL's one-shot
// HMAC() 1.6 us (it fetches the digest and schedules the key every time), EVP_MAC
// re-initialised 0.39 us, EVP_MD_CTX copies 0.29 us (OpenSSL 3.0 allocates per copy),
// these plain SHA256_CTX copies 0.18 us. The low-level SHA-256 calls are deprecated since
// OpenSSL 3.0 in favour of EVP, not removed; they use the same SHA-NI/AVX code.
struct HmacCtx {
  SHA256_CTX inner;  // after H(K ^ ipad)'s first block
  SHA256_CTX outer;  // after H(K ^ opad)'s first block
  std::string key;
  bool keyed = false;
};

bool hmac_key(HmacCtx& h, const std::string& key) {
  constexpr size_t kBlock = 64;  // SHA-256's block
  uint8_t k[kBlock] = {};
  if (key.size() > kBlock) {  // a long key is hashed first (RFC 2104)
    if (!SHA256((const uint8_t*)key.data(), key.size(), k)) return false;
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t ipad[kBlock], opad[kBlock];
  for (size_t i = 0; i < kBlock; ++i) ipad[i] = k[i] ^ 0x36, opad[i] = k[i] ^ 0x5c;
  const bool ok = SHA256_Init(&h.inner) == 1 && SHA256_Update(&h.inner, ipad, kBlock) == 1 &&
                  SHA256_Init(&h.outer) == 1 && SHA256_Update(&h.outer, opad, kBlock) == 1;
  OPENSSL_cleanse(k, kBlock);
  OPENSSL_cleanse(ipad, kBlock);
  OPENSSL_cleanse(opad, kBlock);
  return ok;
}

}  // namespace

void hmac_sha256(const std::string& key, const uint8_t* data, size_t n, uint8_t out[32]) {
  thread_local HmacCtx h;
  if (!h.keyed || h.key != key) {
    h.keyed = false;
    if (!hmac_key(h, key)) throw Error("HMAC-SHA256: keying failed");
    h.key = key;
    h.keyed = true;
  }
  uint8_t inner[32];
  SHA256_CTX c = h.inner;
  bool ok = SHA256_Update(&c, data, n) == 1 && SHA256_Final(inner, &c) == 1;
  c = h.outer;
  ok = ok && SHA256_Update(&c, inner, sizeof inner) == 1 && SHA256_Final(out, &c) == 1;
  OPENSSL_cleanse(&c, sizeof c);
  if (!ok) throw Error("HMAC-SHA256 failed");
}

std::vector<uint8_t> hmac_sha256(const std::string& key, const uint8_t* data, size_t n) {
  std::vector<uint8_t> out(32);
  hmac_sha256(key, data, n, out.data());
  return out;
}

std::vector<uint8_t> encode_header(const WireHeader& h, const std::string& secret, size_t extra) {
  // the message is built in a zeroed first segment on the stack (a header is about 10
  // words; MallocMessageBuilder would calloc 8 KiB) and written once into the frame
  capnp::word first[128];
  std::memset(first, 0, sizeof first);
  capnp::MallocMessageBuilder msg(kj::arrayPtr(first, 128));
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
  std::vector<uint8_t> out;
  auto segs = msg.getSegmentsForOutput();
  if (segs.size() == 1) {  // Cap'n Proto's flat array: u32 segments - 1, u32 words, the words
    const uint32_t words = (uint32_t)segs[0].size(), L = 8 + words * 8, table[2] = {0, words};
    out.reserve(4 + L + 32 + extra);
    out.resize(4 + L);
    std::memcpy(out.data(), &L, 4);
    std::memcpy(out.data() + 4, table, 8);
    std::memcpy(out.data() + 12, segs[0].begin(), (size_t)words * 8);
  } else {
    auto flat = capnp::messageToFlatArray(segs);
    auto bytes = flat.asBytes();
    const uint32_t L = (uint32_t)bytes.size();
    out.reserve(4 + L + 32 + extra);
    out.resize(4 + L);
    std::memcpy(out.data(), &L, 4);
    std::memcpy(out.data() + 4, bytes.begin(), bytes.size());
  }
  uint8_t tag[32];
  hmac_sha256(secret, out.data(), out.size(), tag);
  out.insert(out.end(), tag, tag + 32);
  return out;
}

WireHeader decode_header(const uint8_t* data, size_t n, const std::string& secret, const WireLimits& lim) {
  if (n < 4 + 32) throw ProtocolError("data-plane header: frame of " + std::to_string(n) + " bytes is too short");
  uint32_t L = 0;
  std::memcpy(&L, data, 4);
  if (L == 0 || L % 8 != 0 || L > 4096 || (size_t)L + 4 + 32 != n)
    throw ProtocolError("data-plane header: bad length " + std::to_string(L) + " for a frame of " + std::to_string(n) +
                        " bytes");
  uint8_t tag[32];
  hmac_sha256(secret, data, 4 + (size_t)L, tag);
  if (CRYPTO_memcmp(tag, data + 4 + L, 32) != 0)
    throw ProtocolError("data-plane header: authentication failed (not from a process of this job)");
  WireHeader h;
  try {
    capnp::word words[4096 / 8];  // L <= 4096, checked above; aligned for the reader
    std::memcpy(words, data + 4, L);
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = 512;
    opts.nestingLimit = 4;
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(words, L / 8), opts);
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
