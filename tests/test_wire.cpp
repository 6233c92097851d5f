// The data-plane header (collectives/wire.h; groundwork for issue 6): round trip, the
// job secret (HMAC), and fuzzing — random frames and every single-byte and truncation
// mutation of a valid frame are either rejected with ProtocolError or (only when
// authentic) decode to a header that passes every range check. Never a crash, never an
// accepted payload size that disagrees with the shape.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "collectives/wire.h"

using namespace troupe;

namespace {
WireHeader sample() {
  WireHeader h;
  h.step = 42;
  h.microbatch = 3;
  h.chunk = 1;
  h.kind = 1;
  h.source = 2;
  h.destination = 5;
  h.dtype = DType::bf16;
  h.shape = {4, 128, 256};
  h.bytes = 4ull * 128 * 256 * 2;
  return h;
}
}  // namespace

TEST_CASE("HMAC-SHA256 gives RFC 4231's values, for short, block-sized and long keys, key after key", "[wire]") {
  auto hex = [](const std::vector<uint8_t>& v) {
    std::string s;
    char b[3];
    for (uint8_t c : v) std::snprintf(b, sizeof b, "%02x", c), s += b;
    return s;
  };
  auto mac = [&](const std::string& key, const std::string& data) {
    return hex(hmac_sha256(key, (const uint8_t*)data.data(), data.size()));
  };
  const std::string k1(20, '\x0b'), k6(131, '\xaa'), k64(64, 'k');
  for (int round = 0; round < 2; ++round) {  // the per-thread key cache must follow each key
    CHECK(mac(k1, "Hi There") == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");  // case 1
    CHECK(mac("Jefe", "what do ya want for nothing?") ==
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");  // case 2
    CHECK(mac(k6, "Test Using Larger Than Block-Size Key - Hash Key First") ==
          "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");  // case 6
    // a key of exactly one block is used as it is; one byte longer is hashed first (Python's hmac)
    CHECK(mac(k64, "") == "83026a325aaee70e36cfe607536aa1054104ad1077c36134810d4ccded1ccd3b");
    CHECK(mac(k64 + "k", std::string(200, 'x')) == "f21efe1ab8581cb729f0daa95d5be8a9215cb01b164e877913770c9d0bf74bb5");
  }
  uint8_t out[32];
  hmac_sha256("Jefe", (const uint8_t*)"what do ya want for nothing?", 28, out);
  CHECK(hex(std::vector<uint8_t>(out, out + 32)) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("data-plane headers round-trip and are refused without the job secret", "[wire]") {
  WireLimits lim;
  lim.world = 8;
  auto f = encode_header(sample(), "job-secret");
  WireHeader h = decode_header(f.data(), f.size(), "job-secret", lim);
  CHECK(h.step == 42);
  CHECK(h.shape == std::vector<int64_t>{4, 128, 256});
  CHECK(h.dtype == DType::bf16);
  CHECK(h.bytes == 262144);
  CHECK_THROWS_AS(decode_header(f.data(), f.size(), "another-secret", lim), ProtocolError);
  // authentic but out of range: a rank outside the world, a size that lies about the shape
  WireHeader bad = sample();
  bad.destination = 8;
  auto fb = encode_header(bad, "job-secret");
  CHECK_THROWS_WITH(decode_header(fb.data(), fb.size(), "job-secret", lim), Catch::Contains("outside a world of 8"));
  bad = sample();
  bad.bytes += 1;
  fb = encode_header(bad, "job-secret");
  CHECK_THROWS_WITH(decode_header(fb.data(), fb.size(), "job-secret", lim), Catch::Contains("do not match"));
  bad = sample();
  bad.shape = {1ll << 40, 1ll << 40};
  bad.bytes = 0;
  fb = encode_header(bad, "job-secret");
  CHECK_THROWS_AS(decode_header(fb.data(), fb.size(), "job-secret", lim), ProtocolError);
  lim.max_bytes = 1000;
  CHECK_THROWS_WITH(decode_header(f.data(), f.size(), "job-secret", lim), Catch::Contains("exceeds the limit"));
}

TEST_CASE("fuzzed data-plane frames never crash the parser", "[wire][fuzz]") {
  WireLimits lim;
  lim.world = 8;
  const std::string key = "k";
  auto good = encode_header(sample(), key);
  std::mt19937 g(7);
  int rejected = 0, accepted = 0;
  auto attempt = [&](const std::vector<uint8_t>& f, const std::string& secret) {
    try {
      WireHeader h = decode_header(f.data(), f.size(), secret, lim);
      ++accepted;
      uint64_t n = dtype_size(h.dtype);
      for (auto d : h.shape) n *= (uint64_t)d;
      CHECK(n == h.bytes);
      CHECK(h.bytes <= lim.max_bytes);
    } catch (const ProtocolError&) {
      ++rejected;
    }
  };
  for (size_t i = 0; i < good.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      auto f = good;
      f[i] ^= (uint8_t)(1u << bit);
      attempt(f, key);
    }
  CHECK(rejected == (int)good.size() * 8);  // any flipped bit: the tag or the length fails
  CHECK(accepted == 0);
  for (size_t n = 0; n < good.size(); ++n) attempt(std::vector<uint8_t>(good.begin(), good.begin() + n), key);
  CHECK(accepted == 0);  // every truncation is refused
  for (int r = 0; r < 20000; ++r) {
    std::vector<uint8_t> f(g() % 200);
    for (auto& b : f) b = (uint8_t)g();
    if (f.size() >= 4 && r % 2 == 0) {  // a plausible length field
      const uint32_t L = (uint32_t)(f.size() - 36) & ~7u;
      std::memcpy(f.data(), &L, 4);
    }
    attempt(f, key);
  }
  // forged frames: a valid tag over random Cap'n Proto bytes (what a peer holding the
  // secret but sending garbage would produce) exercise the message checks themselves
  for (int r = 0; r < 20000; ++r) {
    const uint32_t L = 8 * (1 + g() % 16);
    std::vector<uint8_t> f(4 + L);
    std::memcpy(f.data(), &L, 4);
    for (size_t i = 4; i < f.size(); ++i) f[i] = (uint8_t)g();
    if (r % 3 == 0) std::memcpy(f.data() + 4, good.data() + 4, std::min<size_t>(L, good.size() - 36));
    auto tag = hmac_sha256(key, f.data(), f.size());
    f.insert(f.end(), tag.begin(), tag.end());
    attempt(f, key);
  }
  INFO("rejected " << rejected << ", accepted " << accepted);
  CHECK(rejected + accepted == (int)good.size() * 9 + 40000);
}
