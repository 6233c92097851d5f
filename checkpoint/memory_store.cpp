#include "checkpoint/memory_store.h"

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

}  // namespace troupe
