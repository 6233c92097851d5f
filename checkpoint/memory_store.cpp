#include "checkpoint/memory_store.h"

#include <cstring>

#include "core/error.h"

namespace troupe {

void MemoryStore::put_shard(int64_t k, int rank, std::shared_ptr<const ShardData> shard) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!steps_.empty() && k < steps_.begin()->first && steps_.begin()->second.complete) return;  // too old
  steps_[k].shards[rank] = std::move(shard);
  settle(k);
}

void MemoryStore::expect(int64_t k, const MemoryInfo& info, std::vector<int> ranks) {
  std::lock_guard<std::mutex> lk(mu_);
  Entry& e = steps_[k];
  e.info = info;
  e.expected = std::set<int>(ranks.begin(), ranks.end());
  settle(k);
}

void MemoryStore::settle(int64_t k) {
  Entry& e = steps_[k];
  if (e.complete || !e.info) return;
  for (int r : e.expected)
    if (!e.shards.count(r)) return;
  e.complete = true;
  // keep step k and the newest complete step before it; drop everything older
  int64_t keep_from = k;
  for (auto it = steps_.begin(); it != steps_.end() && it->first < k; ++it)
    if (it->second.complete) keep_from = it->first;
  for (auto it = steps_.begin(); it != steps_.end() && it->first < keep_from;) it = steps_.erase(it);
}

std::vector<MemoryStore::Holding> MemoryStore::holdings() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Holding> out;
  for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
    if (!it->second.complete) continue;
    Holding h;
    h.step = it->first;
    for (auto& [r, s] : it->second.shards) h.ranks.push_back(r);
    out.push_back(std::move(h));
  }
  return out;
}

std::shared_ptr<const ShardData> MemoryStore::shard(int64_t k, int rank) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = steps_.find(k);
  if (it == steps_.end() || !it->second.complete) return nullptr;
  auto s = it->second.shards.find(rank);
  return s == it->second.shards.end() ? nullptr : s->second;
}

std::optional<MemoryInfo> MemoryStore::info(int64_t k) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = steps_.find(k);
  if (it == steps_.end() || !it->second.complete) return std::nullopt;
  return it->second.info;
}

uint64_t MemoryStore::bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t b = 0;
  for (auto& [k, e] : steps_)
    for (auto& [r, s] : e.shards)
      for (auto& rec : s->records) b += rec.data.size() * sizeof(float);
  return b;
}

void MemoryStore::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  steps_.clear();
}

namespace {
constexpr uint32_t kShardMagic = 0x534d5254;  // "TRMS"
template <class T>
void put(std::vector<char>& b, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}
}  // namespace

std::vector<float> encode_shard(const ShardData& s, const MemoryInfo& info) {
  std::vector<char> head;
  put(head, kShardMagic);
  put(head, info.step);
  put(head, info.updates);
  put(head, info.loss_scale);
  put(head, (int32_t)info.growth_tracker);
  put(head, (int32_t)info.hysteresis_tracker);
  put(head, (int32_t)s.dp);
  put(head, (int32_t)s.pp);
  put(head, (int32_t)s.tp);
  put(head, (uint32_t)s.records.size());
  size_t floats = 0;
  for (const auto& r : s.records) {
    put(head, (uint32_t)r.name.size());
    head.insert(head.end(), r.name.begin(), r.name.end());
    put(head, (uint8_t)r.field);
    put(head, (int32_t)r.tp);
    put(head, (int64_t)r.offset);
    put(head, (int64_t)r.local_numel);
    put(head, (int64_t)r.data.size());
    floats += r.data.size();
  }
  while (head.size() % sizeof(float)) head.push_back(0);
  std::vector<float> out(head.size() / sizeof(float) + floats);
  std::memcpy(out.data(), head.data(), head.size());
  float* at = out.data() + head.size() / sizeof(float);
  for (const auto& r : s.records) {
    std::memcpy(at, r.data.data(), r.data.size() * sizeof(float));
    at += r.data.size();
  }
  return out;
}

ShardData decode_shard(const float* words, size_t n, MemoryInfo* info) {
  const char* b = reinterpret_cast<const char*>(words);
  const size_t size = n * sizeof(float);
  size_t at = 0;
  auto need = [&](size_t k, const char* what) {
    TROUPE_CHECK(k <= size - at) << "a memory-snapshot shard from the data plane is truncated (reading " << what
                                 << " at byte " << at << " of " << size << ")";
  };
  auto get = [&](auto& v, const char* what) {
    need(sizeof v, what);
    std::memcpy(&v, b + at, sizeof v);
    at += sizeof v;
  };
  uint32_t magic = 0;
  get(magic, "the magic");
  TROUPE_CHECK(magic == kShardMagic) << "a data-plane message of kind snapshot is not a memory-snapshot shard";
  MemoryInfo mi;
  int32_t growth = 0, hyst = 0, dp = 0, pp = 0, tp = 0;
  uint32_t nrec = 0;
  get(mi.step, "the step");
  get(mi.updates, "the update count");
  get(mi.loss_scale, "the loss scale");
  get(growth, "the growth tracker");
  get(hyst, "the hysteresis tracker");
  get(dp, "dp");
  get(pp, "pp");
  get(tp, "tp");
  get(nrec, "the record count");
  mi.growth_tracker = growth;
  mi.hysteresis_tracker = hyst;
  TROUPE_CHECK(nrec <= size / 32) << "a memory-snapshot shard claims " << nrec << " records in " << size << " bytes";
  ShardData s;
  s.dp = dp, s.pp = pp, s.tp = tp;
  s.records.resize(nrec);
  std::vector<int64_t> counts(nrec);
  uint64_t floats = 0;
  for (uint32_t i = 0; i < nrec; ++i) {
    ShardRecord& r = s.records[i];
    uint32_t len = 0;
    get(len, "a name length");
    TROUPE_CHECK(len <= 256) << "a memory-snapshot shard holds a name of " << len << " bytes";
    need(len, "a name");
    r.name.assign(b + at, len);
    at += len;
    uint8_t field = 0;
    int32_t rtp = 0;
    get(field, "a field");
    TROUPE_CHECK(field <= 3) << "a memory-snapshot shard holds field " << (int)field;
    r.field = (StateField)field;
    get(rtp, "a TP rank");
    r.tp = rtp;
    get(r.offset, "an offset");
    get(r.local_numel, "a size");
    get(counts[i], "a count");
    TROUPE_CHECK(counts[i] >= 0 && r.offset >= 0 && r.local_numel >= 0 && counts[i] <= r.local_numel - r.offset)
        << "a memory-snapshot shard holds a bad range [" << r.offset << ", +" << counts[i] << ") of " << r.local_numel;
    floats += (uint64_t)counts[i];
  }
  at = (at + sizeof(float) - 1) / sizeof(float) * sizeof(float);
  TROUPE_CHECK(at <= size && floats == (size - at) / sizeof(float) && (size - at) % sizeof(float) == 0)
      << "a memory-snapshot shard's data (" << (size - std::min(at, size)) << " bytes) does not match its records ("
      << floats << " floats)";
  const float* f = words + at / sizeof(float);
  for (uint32_t i = 0; i < nrec; ++i) {
    s.records[i].data.assign(f, f + counts[i]);
    f += counts[i];
  }
  if (info) *info = mi;
  return s;
}

}  // namespace troupe
