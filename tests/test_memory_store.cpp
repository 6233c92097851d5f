// Memory snapshots (checkpoint/memory_store.h), the recovery plan (actors/cluster.h) and
// rebuilding a TrainState from shards in memory (checkpoint/snapshot.h assemble_state).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "actors/cluster.h"
#include "checkpoint/memory_store.h"
#include "checkpoint/snapshot.h"
#include "cli_helpers.h"
#include "job_helpers.h"
#include "model/gpt.h"

using namespace troupe;
using troupe::test::Scratch;

namespace {
std::shared_ptr<const ShardData> shard(int dp, int pp, float v, size_t n = 4) {
  auto s = std::make_shared<ShardData>();
  s->dp = dp, s->pp = pp;
  s->records.push_back(ShardRecord{"x", StateField::value, 0, 0, (int64_t)n, std::vector<float>(n, v)});
  return s;
}
MemoryInfo info(int64_t k) {
  MemoryInfo i;
  i.step = k;
  i.updates = k;
  return i;
}
}  // namespace

TEST_CASE("memory store: a step is complete once its counters and every expected rank are in", "[memory]") {
  MemoryStore m;
  m.put_shard(4, 0, shard(0, 0, 1));
  CHECK(m.holdings().empty());
  m.expect(4, info(4), {0, 1});
  CHECK(m.holdings().empty());  // rank 1 missing
  CHECK(m.shard(4, 0) == nullptr);
  m.put_shard(4, 1, shard(0, 1, 2));
  auto h = m.holdings();
  REQUIRE(h.size() == 1);
  CHECK(h[0].step == 4);
  CHECK(h[0].ranks == std::vector<int>{0, 1});
  REQUIRE(m.shard(4, 1));
  CHECK(m.shard(4, 1)->records[0].data[0] == 2.0f);
  CHECK(m.info(4)->updates == 4);
  CHECK(m.bytes() == 2 * 4 * sizeof(float));
}

TEST_CASE("memory store: the previous complete step stays until a newer one completes, older ones go", "[memory]") {
  MemoryStore m;
  for (int64_t k : {1, 2, 3}) {
    m.expect(k, info(k), {0, 1});
    m.put_shard(k, 0, shard(0, 0, (float)k));
    m.put_shard(k, 1, shard(0, 1, (float)k));
  }
  auto h = m.holdings();
  REQUIRE(h.size() == 2);  // 3 and 2, newest first
  CHECK(h[0].step == 3);
  CHECK(h[1].step == 2);
  // step 4 half in (a failure during the snapshot): 3 and 2 are still there, 4 is not offered
  m.expect(4, info(4), {0, 1});
  m.put_shard(4, 0, shard(0, 0, 4));
  h = m.holdings();
  REQUIRE(h.size() == 2);
  CHECK(h[0].step == 3);
  // a shard older than every kept step is not kept
  m.put_shard(1, 0, shard(0, 0, 1));
  CHECK(m.shard(1, 0) == nullptr);
  m.clear();
  CHECK(m.holdings().empty());
  CHECK(m.bytes() == 0);
}

TEST_CASE("recovery plan: the newest memory step every rank is held for, own copies first, else the disk",
          "[memory]") {
  // 3 processes, ranks 0..2 (one each); process p holds its own rank and a copy of p - 1's
  const std::vector<int> proc = {0, 1, 2};
  auto offer = [](std::vector<std::pair<int64_t, std::vector<int64_t>>> steps) {
    std::vector<int64_t> o;
    for (auto& [k, ranks] : steps) {
      o.push_back(k);
      o.push_back((int64_t)ranks.size());
      o.insert(o.end(), ranks.begin(), ranks.end());
    }
    return o;
  };
  SECTION("process 1 was lost and started again: its rank comes from process 2's copy") {
    std::vector<std::vector<int64_t>> offers = {offer({{6, {0, 2}}, {5, {0, 2}}}), {}, offer({{6, {1, 2}}, {5, {1, 2}}})};
    RecoveryPlan p = make_recovery_plan(offers, 4, proc);
    CHECK(p.source == RecoveryPlan::memory);
    CHECK(p.step == 6);
    CHECK(p.provider == std::vector<int32_t>{0, 2, 2});
  }
  SECTION("a step only half copied when the failure came: the step before it") {
    std::vector<std::vector<int64_t>> offers = {offer({{6, {0, 2}}, {5, {0, 2}}}), {}, offer({{5, {1, 2}}})};
    RecoveryPlan p = make_recovery_plan(offers, 4, proc);
    CHECK(p.source == RecoveryPlan::memory);
    CHECK(p.step == 5);
  }
  SECTION("two neighbours lost: a rank has no copy left, so the disk") {
    std::vector<std::vector<int64_t>> offers = {offer({{6, {0, 2}}}), {}, {}};
    RecoveryPlan p = make_recovery_plan(offers, 4, proc);
    CHECK(p.source == RecoveryPlan::disk);
    CHECK(p.step == 4);
  }
  SECTION("the disk is newer than memory: the disk; at the same step memory wins") {
    std::vector<std::vector<int64_t>> offers = {offer({{6, {0, 2}}}), offer({{6, {0, 1}}}), offer({{6, {1, 2}}})};
    CHECK(make_recovery_plan(offers, 8, proc).source == RecoveryPlan::disk);
    CHECK(make_recovery_plan(offers, 8, proc).step == 8);
    RecoveryPlan p = make_recovery_plan(offers, 6, proc);
    CHECK(p.source == RecoveryPlan::memory);
    CHECK(p.provider == std::vector<int32_t>{0, 1, 2});  // every rank from its own process
  }
  SECTION("nothing anywhere: a fresh start") {
    CHECK(make_recovery_plan({{}, {}, {}}, 0, proc).source == RecoveryPlan::fresh);
  }
}

TEST_CASE("a state rebuilt from shards in memory equals the same shards loaded from disk, bit for bit", "[memory]") {
  Config c = troupe::test::tiny(2, 2);
  c.parallel.tp = 2;
  c.train.precision = "bf16";
  Scratch s("memory", "assemble");
  // every TP rank's local tensors, random, split over two "workers" (the moments in two
  // pieces each, as ZeRO-1 splits them over DP ranks)
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<ShardData> shards(4);
  for (int t = 0; t < 2; ++t) {
    const GPTConfig g = GPTConfig::from(c.model, 2, t);
    for (const ParamSpec& sp : gpt_param_specs(g)) {
      if (sp.shard == Shard::replicated && t != 0) continue;
      int64_t n = 1;
      for (auto d : local_shape(sp, g)) n *= d;
      for (StateField f : {StateField::value, StateField::master, StateField::adam_m, StateField::adam_v}) {
        std::vector<float> v(n);
        for (auto& x : v) x = nd(rng);
        const int64_t half = f >= StateField::adam_m ? n / 2 : n;
        shards[t * 2].records.push_back(ShardRecord{sp.name, f, t, 0, n, std::vector<float>(v.begin(), v.begin() + half)});
        if (half < n)
          shards[t * 2 + 1].records.push_back(ShardRecord{sp.name, f, t, half, n, std::vector<float>(v.begin() + half, v.end())});
      }
    }
  }
  for (int i = 0; i < 4; ++i) shards[i].dp = i % 2, shards[i].tp = i / 2;
  // on disk, as the checkpoint writer writes a snapshot
  const std::string dir = s.path("step-00000003");
  std::filesystem::create_directories(dir);
  std::vector<FileEntry> files;
  for (auto& sd : shards) files.push_back(write_shard_file(dir, sd));
  ManifestInfo mi;
  mi.step = 3;
  mi.updates = 3;
  mi.loss_scale = 1.0;
  mi.config_toml = c.to_toml();
  mi.tp = 2;
  mi.pp = 2;
  mi.dp = 2;
  mi.precision = "bf16";
  write_manifest(dir, mi, files);
  const TrainState disk = load_snapshot(dir, c);
  std::vector<std::shared_ptr<const ShardData>> mem;
  for (auto it = shards.rbegin(); it != shards.rend(); ++it) mem.push_back(std::make_shared<const ShardData>(*it));
  MemoryInfo info;
  info.step = 3;
  info.updates = 3;
  const TrainState got = assemble_state(info, mem, c, "memory");
  REQUIRE(got.tensors.size() == disk.tensors.size());
  for (auto& [name, lt] : disk.tensors) {
    const LogicalTensor& g = got.tensors.at(name);
    INFO(name);
    for (auto [a, b] : {std::pair{&lt.value, &g.value}, {&lt.master, &g.master}, {&lt.m, &g.m}, {&lt.v, &g.v}}) {
      REQUIRE(a->shape() == b->shape());
      CHECK(std::memcmp(a->data(), b->data(), a->nbytes()) == 0);
    }
  }
  CHECK(got.step == 3);
  CHECK(got.updates == 3);
  // one shard missing: an error naming what is missing, not a partial state
  mem.pop_back();
  CHECK_THROWS_WITH(assemble_state(info, mem, c, "memory"), Catch::Contains("lacks"));
}

TEST_CASE("a shard encoded for the data plane decodes to the same bits, damaged buffers are refused", "[memory]") {
  ShardData sd;
  sd.dp = 1, sd.pp = 2, sd.tp = 3;
  sd.records.push_back(ShardRecord{"h.0.attn.c_attn.weight", StateField::adam_v, 1, 5, 20, {1.5f, -0.0f, 3e-42f}});
  sd.records.push_back(ShardRecord{"wte", StateField::value, 0, 0, 2, {INFINITY, NAN}});
  MemoryInfo mi;
  mi.step = 42, mi.updates = 40, mi.loss_scale = 65536.0, mi.growth_tracker = 7, mi.hysteresis_tracker = 1;
  const std::vector<float> w = encode_shard(sd, mi);
  MemoryInfo got_info;
  const ShardData got = decode_shard(w.data(), w.size(), &got_info);
  CHECK(got.dp == 1);
  CHECK(got.pp == 2);
  CHECK(got.tp == 3);
  REQUIRE(got.records.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(got.records[i].name == sd.records[i].name);
    CHECK(got.records[i].field == sd.records[i].field);
    CHECK(got.records[i].tp == sd.records[i].tp);
    CHECK(got.records[i].offset == sd.records[i].offset);
    CHECK(got.records[i].local_numel == sd.records[i].local_numel);
    REQUIRE(got.records[i].data.size() == sd.records[i].data.size());
    CHECK(std::memcmp(got.records[i].data.data(), sd.records[i].data.data(), sd.records[i].data.size() * 4) == 0);
  }
  CHECK(got_info.step == 42);
  CHECK(got_info.updates == 40);
  CHECK(got_info.loss_scale == 65536.0);
  CHECK(got_info.growth_tracker == 7);
  CHECK(got_info.hysteresis_tracker == 1);
  // truncated anywhere, a float more or less, another magic: an error, never a crash
  for (size_t n = 0; n < w.size(); ++n) CHECK_THROWS(decode_shard(w.data(), n, nullptr));
  std::vector<float> longer = w;
  longer.push_back(0.f);
  CHECK_THROWS_WITH(decode_shard(longer.data(), longer.size(), nullptr), Catch::Contains("does not match"));
  std::vector<float> bad = w;
  bad[0] = 1.0f;
  CHECK_THROWS_WITH(decode_shard(bad.data(), bad.size(), nullptr), Catch::Contains("not a memory-snapshot shard"));
  // random garbage: refused or decoded, but bounded
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> g = w;
    for (int j = 0; j < 3; ++j) {
      uint32_t x;
      std::memcpy(&x, &g[rng() % g.size()], 4);
      x ^= 1u << (rng() % 32);
      std::memcpy(&g[rng() % g.size()], &x, 4);
    }
    try {
      decode_shard(g.data(), g.size(), nullptr);
    } catch (const std::exception&) {
    }
  }
}
