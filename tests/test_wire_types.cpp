// Control-plane serialization (actors/wire_types.h): every message type crosses processes
// bit-exact, infinities, NaNs, subnormals and -0 included (CAF's own float encoding loops
// on inf and garbles NaN and subnormals), and a Tensor whose data disagrees with its shape
// is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "actors/messages.h"

using namespace troupe;

namespace {
template <class T>
T round_trip(caf::actor_system& sys, const T& x) {
  std::vector<char> buf;
  caf::binary_serializer sink(sys, buf);
  auto msg = caf::make_message(x);
  REQUIRE(!sink(msg));
  caf::message out;
  caf::binary_deserializer src(sys, buf);
  REQUIRE(!src(out));
  REQUIRE(out.match_elements<T>());
  return out.get_as<T>(0);
}
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  static_assert(sizeof(A) == sizeof(B));
  return std::memcmp(&a, &b, sizeof(A)) == 0;
}
}  // namespace

TEST_CASE("control messages keep every float bit-exact, specials included", "[wire]") {
  caf::actor_system_config cfg;
  register_wire_types(cfg);
  caf::actor_system sys{cfg};
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-40f, -0.0f, 3.25f,
                            std::numeric_limits<float>::denorm_min()};
  Tensor t({7});
  std::memcpy(t.data(), specials, sizeof specials);
  Tensor t2 = round_trip(sys, t);
  REQUIRE(t2.shape() == t.shape());
  CHECK(std::memcmp(t2.data(), t.data(), t.nbytes()) == 0);

  StepReport r;
  r.stage = 1;
  r.loss_sum = std::numeric_limits<double>::quiet_NaN();
  r.loss_scale = std::numeric_limits<double>::infinity();
  r.compute_s = 4.9e-324;  // the smallest subnormal double
  r.tokens = 77;
  r.spans.push_back({'F', 2, 0, -0.0, 1.5});
  StepReport r2 = round_trip(sys, r);
  CHECK(r2.stage == 1);
  CHECK(r2.tokens == 77);
  CHECK(same_bits(r2.loss_sum, r.loss_sum));
  CHECK(same_bits(r2.loss_scale, r.loss_scale));
  CHECK(same_bits(r2.compute_s, r.compute_s));
  REQUIRE(r2.spans.size() == 1);
  CHECK(same_bits(r2.spans[0].t0, r.spans[0].t0));

  NormReport n;
  n.stage = 2;
  n.sumsq = {{3, std::numeric_limits<double>::infinity()}, {5, 1e-310}};
  n.found_inf = true;
  NormReport n2 = round_trip(sys, n);
  REQUIRE(n2.sumsq.size() == 2);
  CHECK(n2.sumsq[0].first == 3);
  CHECK(same_bits(n2.sumsq[0].second, n.sumsq[0].second));
  CHECK(same_bits(n2.sumsq[1].second, n.sumsq[1].second));
  CHECK(n2.found_inf);

  ShardData sd{1, 0, 1, {ShardRecord{"wte", StateField::adam_v, 1, 4, 8, {1e-40f, 0.0f, -1.0f}}}};
  ShardData sd2 = round_trip(sys, sd);
  REQUIRE(sd2.records.size() == 1);
  CHECK(sd2.records[0].name == "wte");
  CHECK(sd2.records[0].field == StateField::adam_v);
  CHECK(std::memcmp(sd2.records[0].data.data(), sd.records[0].data.data(), 12) == 0);

  TokenBlock tb{std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{1, 2, 3, 4}), 2, 2, 1e-40f};
  TokenBlock tb2 = round_trip(sys, tb);
  CHECK(*tb2.ids == *tb.ids);
  CHECK(same_bits(tb2.dloss, tb.dloss));
}
