// datasets/minhash.h — near-duplicate detection: MinHash signatures (Broder 1997, "On the
// resemblance and containment of documents") and locality-sensitive hashing over bands
// (Leskovec, Rajaraman & Ullman, "Mining of Massive Datasets", ch. 3).
//
// Shingles are the SET of a document's words (whitespace-separated, lowercased ASCII):
// a 5% word edit leaves a word-set Jaccard similarity near 0.9, while word 5-grams would
// fall to about 0.6 and no longer look alike at the 0.8 threshold.
// A signature holds kMinHashPerms minima of h_i(x) = a_i * x + b_i (mod 2^64) over the
// 64-bit shingle hashes x, keeping the top 32 bits. P[sig_a[i] == sig_b[i]] = J(a, b).
// LSH: kBands bands of kRows values; two documents are candidates when any band agrees
// (probability 1 - (1 - J^r)^b: 0.9996 at J = 0.9, 0.96 at J = 0.8, 0.18 at J = 0.5). A
// candidate is a near duplicate when the fraction of equal signature values >= threshold.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe {

inline constexpr int kMinHashPerms = 128;
inline constexpr int kLshBands = 16;
inline constexpr int kLshRows = kMinHashPerms / kLshBands;  // 8

using MinHashSig = std::array<uint32_t, kMinHashPerms>;

// The signature of `text`. A text with no word gets all 0xFFFFFFFF (it matches only such texts).
// Pure and thread-safe; the same bits on every machine.
MinHashSig minhash_signature(std::string_view text);

// Fraction of equal positions of two signatures: an estimate of the Jaccard similarity.
double minhash_similarity(const MinHashSig& a, const MinHashSig& b);

// The documents kept so far, indexed by band. Memory: kMinHashPerms * 4 bytes per document
// plus kLshBands hash-table entries (about 1 KB per document in all). Not thread-safe:
// documents are offered in corpus order, so the first of a group of near duplicates stays.
class LshIndex {
 public:
  // If `sig` is within `threshold` of a document already kept, returns true (a near
  // duplicate: not added). Otherwise adds it and returns false.
  bool check_and_add(const MinHashSig& sig, double threshold);
  size_t size() const { return sigs_.size(); }

 private:
  std::vector<MinHashSig> sigs_;
  std::array<std::unordered_multimap<uint64_t, uint32_t>, kLshBands> buckets_;
};

}  // namespace troupe
