// The actors' typed interfaces (actors/interfaces.h): the handle conversions the job relies
// on hold at compile time, and the event-based actors, spawned typed, answer every message
// of their interface as actors/data_actor.h and actors/checkpointer.h describe. (The
// compiler checks the rest: sends against the receiver's interface, typed behaviors and
// the blocking actors' receive loops against theirs.)
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <type_traits>

#include "actors/checkpointer.h"
#include "actors/data_actor.h"
#include "actors/interfaces.h"

using namespace troupe;

// a worker is a pipeline peer (the tensor proxy is only that)
static_assert(std::is_convertible_v<WorkerActor, PipelinePeer>);
static_assert(caf::detail::tl_subset_of<PipelinePeer::signatures, WorkerActor::signatures>::value);
static_assert(!caf::detail::tl_subset_of<WorkerActor::signatures, PipelinePeer::signatures>::value);
// the spawn functions of the event-based actors return typed behaviors
static_assert(std::is_same_v<decltype(data_actor(nullptr, {}, {}, {}, 1, 1, 1, {})), DataActor::behavior_type>);
static_assert(std::is_same_v<decltype(memory_keeper(nullptr, nullptr, nullptr, {}, Topology(1, 1, 1))),
                             KeeperActor::behavior_type>);

namespace {
constexpr auto kWait = std::chrono::seconds(10);
}  // namespace

TEST_CASE("the data actor, spawned typed, answers each message of DataActor", "[interfaces]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  const int DP = 2, M = 2, B = 4, T = 3;  // 1 sequence per microbatch and DP rank
  JobContext ctx;
  ctx.fill_batch = [](int kind, int64_t index, int b, int t, int32_t* in, int32_t* tg) {
    if (kind == 7) throw std::runtime_error("no such split");
    for (int i = 0; i < b * t; ++i) {
      in[i] = (int32_t)(index * 1000 + i);
      tg[i] = i % 2 ? -1 : (int32_t)i;  // half the targets ignored
    }
  };
  // the scoped actor stands for the first and last stages of both DP ranks and the coordinator
  auto me = caf::actor_cast<WorkerActor>(self);
  std::vector<std::vector<WorkerActor>> firsts{{me}, {me}}, lasts{{me}, {}};
  auto data = sys.spawn(data_actor, ctx, firsts, lasts, M, B, T, caf::actor_cast<CoordinatorActor>(self));
  static_assert(std::is_same_v<decltype(data), DataActor>);

  self->send(data, batch_atom::value, (int64_t)5, 0, (int64_t)9);
  int tokens = 0, targets = 0;
  for (int i = 0; i < DP * M + M; ++i)
    self->receive(
        [&](tokens_atom, int64_t k, int mb, const TokenBlock& b) {
          CHECK(k == 5);
          CHECK(b.B == 1);
          CHECK(b.T == T);
          const int d = tokens / M;  // in order: DP rank, then microbatch
          CHECK(mb == tokens % M);
          CHECK((*b.ids)[0] == 9000 + (d * M + mb) * T);
          ++tokens;
        },
        [&](targets_atom, int64_t k, int mb, const TokenBlock& b) {
          CHECK(k == 5);
          CHECK(mb == targets);
          CHECK(b.dloss == 1.0f / (float)(B * T / 2));  // the mean over real targets
          ++targets;
        },
        caf::after(kWait) >> [] { FAIL("the data actor sent too few blocks"); });
  CHECK(tokens == DP * M);
  CHECK(targets == M);  // DP rank 1's last stage is in no process here

  self->send(data, batch_atom::value, (int64_t)6, 7, (int64_t)0);
  self->receive(
      [&](fail_atom, int stage, const std::string& msg) {
        CHECK(stage == -1);
        CHECK(msg.find("no such split") != std::string::npos);
      },
      caf::after(kWait) >> [] { FAIL("no failure reported"); });

  self->monitor(data);
  self->send(data, stop_atom::value);
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; }, caf::after(kWait) >> [] {});
  CHECK(down);
}

TEST_CASE("the memory keeper, spawned typed, answers each message of KeeperActor", "[interfaces]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto store = std::make_shared<MemoryStore>();
  const Topology topo(2, 1, 1);  // ranks 0 (dp 0) and 1 (dp 1)
  std::atomic<int> copies{0};
  std::vector<float> copy_of_0;
  auto to_peer = [&](int64_t k, int rank, const std::vector<float>& words) {
    if (rank == 0) copy_of_0 = words;
    ++copies;
  };
  auto keeper = sys.spawn<caf::detached>(memory_keeper, store, to_peer, std::vector<int>{0, 1}, topo);
  static_assert(std::is_same_v<decltype(keeper), KeeperActor>);

  ShardData own;
  own.dp = 0;
  self->send(keeper, shard_atom::value, (int64_t)3, own);
  self->send(keeper, meminfo_atom::value, (int64_t)3, (int64_t)2, (uint64_t)0, (int32_t)0, (int32_t)0);
  self->monitor(keeper);
  self->send(keeper, stop_atom::value);
  self->receive([&](caf::down_msg&) {}, caf::after(kWait) >> [] { FAIL("the keeper did not stop"); });
  CHECK(copies == 1);                        // rank 0's shard went to the peer
  CHECK(store->holdings().empty());          // rank 1 is still missing
  CHECK(store->shard(3, 0) == nullptr);      // (shard() answers for complete steps only)

  // the peer's copy completes step 3
  auto keeper2 = sys.spawn<caf::detached>(memory_keeper, store, to_peer, std::vector<int>{0, 1}, topo);
  Tensor t({(int64_t)copy_of_0.size()});
  std::copy(copy_of_0.begin(), copy_of_0.end(), t.data());
  self->send(keeper2, peershard_atom::value, (int64_t)3, (int32_t)1, t);
  self->monitor(keeper2);
  self->send(keeper2, stop_atom::value);
  self->receive([&](caf::down_msg&) {}, caf::after(kWait) >> [] { FAIL("the keeper did not stop"); });
  const auto held = store->holdings();
  REQUIRE(held.size() == 1);
  CHECK(held[0].step == 3);
  CHECK(held[0].ranks == std::vector<int>{0, 1});
}
