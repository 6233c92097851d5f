// collectives/matching.h without UCX: receives and messages pair by their whole identity,
// first-in first-out whichever side comes first; a receive that gives up leaves no trace;
// the hint for a peer that called another operation; the texts of a layout mismatch.
// collectives/group.h's reduction routine against a plain loop, bitwise.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "collectives/group.h"
#include "collectives/matching.h"

using namespace troupe;

namespace {

struct Entry {
  WireHeader h;
  int id = 0;
};

WireHeader hdr(int src, int dst, int64_t step, int32_t chunk, int64_t n = 4) {
  WireHeader h;
  h.kind = kWireCollective;
  h.source = src;
  h.destination = dst;
  h.step = step;
  h.microbatch = 7;
  h.chunk = chunk;
  h.shape = {n};
  h.bytes = (uint64_t)n * 4;
  return h;
}

std::shared_ptr<Entry> entry(const WireHeader& h, int id) { return std::make_shared<Entry>(Entry{h, id}); }

}  // namespace

TEST_CASE("matching: a receive posted first is found by its message, then first-in first-out", "[matching]") {
  Matcher<Entry> m;
  CHECK(m.post(entry(hdr(1, 0, 3, 16), 1)) == nullptr);
  CHECK(m.post(entry(hdr(1, 0, 3, 16), 2)) == nullptr);
  CHECK(m.posted() == 2);
  CHECK(m.arrive(hdr(1, 0, 3, 17)) == nullptr);  // another chunk: no match
  CHECK(m.arrive(hdr(2, 0, 3, 16)) == nullptr);  // another source
  auto a = m.arrive(hdr(1, 0, 3, 16));
  REQUIRE(a);
  CHECK(a->id == 1);
  auto b = m.arrive(hdr(1, 0, 3, 16));
  REQUIRE(b);
  CHECK(b->id == 2);
  CHECK(m.arrive(hdr(1, 0, 3, 16)) == nullptr);
  CHECK(m.posted() == 0);
}

TEST_CASE("matching: a message held before its receive is taken by it, oldest first, every field counts", "[matching]") {
  Matcher<Entry> m;
  m.hold(entry(hdr(1, 0, 3, 16), 10));
  m.hold(entry(hdr(1, 0, 3, 16), 11));
  WireHeader other_mb = hdr(1, 0, 3, 16);
  other_mb.microbatch = 8;
  WireHeader other_kind = hdr(1, 0, 3, 16);
  other_kind.kind = kWireActivation;
  m.hold(entry(other_mb, 12));
  m.hold(entry(other_kind, 13));
  CHECK(m.held() == 4);
  CHECK(m.post(entry(hdr(1, 0, 4, 16), 1)) == nullptr);  // another step: queued
  auto x = m.post(entry(hdr(1, 0, 3, 16), 2));
  REQUIRE(x);
  CHECK(x->id == 10);
  auto y = m.post(entry(hdr(1, 0, 3, 16), 3));
  REQUIRE(y);
  CHECK(y->id == 11);
  auto z = m.post(entry(other_mb, 4));
  REQUIRE(z);
  CHECK(z->id == 12);
  CHECK(m.held() == 1);
  CHECK(m.posted() == 1);
}

TEST_CASE("matching: a withdrawn receive is never matched, others of its identity keep their order", "[matching]") {
  Matcher<Entry> m;
  auto r1 = entry(hdr(1, 0, 3, 16), 1), r2 = entry(hdr(1, 0, 3, 16), 2), r3 = entry(hdr(1, 0, 3, 16), 3);
  m.post(r1);
  m.post(r2);
  m.post(r3);
  CHECK(m.withdraw(r2));
  CHECK_FALSE(m.withdraw(r2));  // already gone
  CHECK(m.arrive(hdr(1, 0, 3, 16))->id == 1);
  CHECK(m.arrive(hdr(1, 0, 3, 16))->id == 3);
  CHECK(m.posted() == 0);
  CHECK_FALSE(m.withdraw(r1));  // matched already
  auto r4 = entry(hdr(1, 0, 5, 16), 4);
  m.post(r4);
  auto all = m.take_all_posted();
  REQUIRE(all.size() == 1);
  CHECK(all[0] == r4);
  CHECK(m.arrive(hdr(1, 0, 5, 16)) == nullptr);
  auto h1 = entry(hdr(1, 0, 6, 16), 5), h2 = entry(hdr(1, 0, 6, 16), 6);  // held messages taken back
  m.hold(h1);
  m.hold(h2);
  CHECK(m.unhold(h1));
  CHECK_FALSE(m.unhold(h1));
  CHECK(m.post(entry(hdr(1, 0, 6, 16), 7))->id == 6);
  CHECK(m.held() == 0);
}

TEST_CASE("matching: other_chunk finds a peer's message of the same call under another chunk", "[matching]") {
  Matcher<Entry> m;
  const WireHeader want = hdr(1, 0, 3, kAllReduceSum << 4);
  CHECK(m.other_chunk(want) == nullptr);
  m.hold(entry(hdr(2, 0, 3, kAllGather << 4), 1));  // another source
  m.hold(entry(hdr(1, 0, 4, kAllGather << 4), 2));  // another call
  CHECK(m.other_chunk(want) == nullptr);
  m.hold(entry(hdr(1, 0, 3, kAllGather << 4, 8), 3));
  const Entry* o = m.other_chunk(want);
  REQUIRE(o);
  CHECK(o->id == 3);
  CHECK(chunk_call_name(o->h.chunk) == "all_gather");
  CHECK(chunk_call_name(want.chunk) == "all_reduce (sum)");
  CHECK(chunk_call_name(kP2PChunk | 5) == "send/recv with tag 5");
  CHECK(m.held() == 3);  // only looked at
}

TEST_CASE("matching: layouts must agree, and a mismatch names both sides", "[matching]") {
  WireHeader got = hdr(1, 0, 8, 2, 10), want = hdr(1, 0, 8, 2, 12);
  got.kind = want.kind = kWireGradient;
  CHECK_FALSE(same_layout(got, want));
  CHECK(same_layout(got, got));
  WireHeader bf = got;
  bf.dtype = DType::bf16;
  CHECK_FALSE(same_layout(got, bf));
  CHECK(layout_mismatch(got, want) == "rank 1 sent f32 [10] (40 bytes) but rank 0 expects f32 [12] (48 bytes)");
  got.microbatch = 1;
  CHECK(wire_ident(got) == "gradient (step 8, microbatch 1, chunk 2)");
  CHECK(shape_text({2, 3, 4}) == "[2, 3, 4]");
  CHECK(std::string(wire_kind_name(200)) == "unknown kind");
}

TEST_CASE("reduce_ordered sums and takes maxima in ascending input order, bitwise", "[matching][collectives]") {
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f), e(-4.f, 4.f);
  for (int n : {1, 2, 3, 5})
    for (size_t count : {size_t(0), size_t(1), size_t(17), size_t(1000)}) {
      std::vector<std::vector<float>> in(n, std::vector<float>(count));
      std::vector<const float*> p(n);
      for (int r = 0; r < n; ++r) {
        for (auto& x : in[r]) x = u(g) * std::pow(10.f, e(g));
        p[r] = in[r].data();
      }
      std::vector<float> sum(count), mx(count), ref_sum(count), ref_max(count);
      reduce_ordered(sum.data(), p.data(), n, count, ReduceOp::sum);
      reduce_ordered(mx.data(), p.data(), n, count, ReduceOp::max);
      for (size_t i = 0; i < count; ++i) {
        float s = in[0][i], m = in[0][i];
        for (int r = 1; r < n; ++r) {
          s = s + in[r][i];
          m = in[r][i] > m ? in[r][i] : m;
        }
        ref_sum[i] = s;
        ref_max[i] = m;
      }
      CHECK(std::memcmp(sum.data(), ref_sum.data(), count * 4) == 0);
      CHECK(std::memcmp(mx.data(), ref_max.data(), count * 4) == 0);
      if (n > 1 && count > 0) {  // in place over the first input
        std::vector<float> first = in[0];
        p[0] = first.data();
        reduce_ordered(first.data(), p.data(), n, count, ReduceOp::sum);
        CHECK(std::memcmp(first.data(), ref_sum.data(), count * 4) == 0);
      }
    }
}
