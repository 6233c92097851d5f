// datasets/minhash.cpp — see minhash.h.
#include "datasets/minhash.h"

#include <algorithm>

#include "datasets/corpus.h"

namespace troupe {

namespace {

struct Perms {
  uint64_t a[kMinHashPerms], b[kMinHashPerms];
  Perms() {
    for (int i = 0; i < kMinHashPerms; ++i) {
      a[i] = splitmix64(2 * static_cast<uint64_t>(i) + 1) | 1;  // odd: a bijection on 2^64
      b[i] = splitmix64(2 * static_cast<uint64_t>(i) + 2);
    }
  }
};
const Perms kPerms;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

MinHashSig minhash_signature(std::string_view text) {
  thread_local std::vector<uint64_t> shingles;
  thread_local std::string lower;
  shingles.clear();
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t b = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i == b) break;
    lower.assign(text.substr(b, i - b));
    for (char& c : lower)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    shingles.push_back(splitmix64(fnv1a64(lower)));
  }
  std::sort(shingles.begin(), shingles.end());
  shingles.erase(std::unique(shingles.begin(), shingles.end()), shingles.end());
  uint64_t mins[kMinHashPerms];
  std::fill(std::begin(mins), std::end(mins), ~0ull);
  for (const uint64_t x : shingles)
    for (int i = 0; i < kMinHashPerms; ++i) mins[i] = std::min(mins[i], kPerms.a[i] * x + kPerms.b[i]);
  MinHashSig sig;
  for (int i = 0; i < kMinHashPerms; ++i) sig[i] = static_cast<uint32_t>(mins[i] >> 32);
  return sig;
}

double minhash_similarity(const MinHashSig& a, const MinHashSig& b) {
  int eq = 0;
  for (int i = 0; i < kMinHashPerms; ++i) eq += a[i] == b[i];
  return static_cast<double>(eq) / kMinHashPerms;
}

bool LshIndex::check_and_add(const MinHashSig& sig, double threshold) {
  uint64_t keys[kLshBands];
  for (int band = 0; band < kLshBands; ++band) {
    uint64_t h = static_cast<uint64_t>(band) + 1;
    for (int r = 0; r < kLshRows; ++r) h = splitmix64(h ^ sig[band * kLshRows + r]);
    keys[band] = h;
    auto [lo, hi] = buckets_[band].equal_range(h);
    for (auto it = lo; it != hi; ++it)
      if (minhash_similarity(sigs_[it->second], sig) >= threshold) return true;
  }
  const auto id = static_cast<uint32_t>(sigs_.size());
  sigs_.push_back(sig);
  for (int band = 0; band < kLshBands; ++band) buckets_[band].emplace(keys[band], id);
  return false;
}

}  // namespace troupe
