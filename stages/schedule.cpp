#include "stages/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace troupe {

std::vector<Action> schedule_1f1b(int P, int s, int M) {
  TROUPE_CHECK(P >= 1 && s >= 0 && s < P && M >= 1);
  std::vector<Action> a;
  const int warmup = std::min(P - s - 1, M);
  int f = 0, b = 0;
  for (; f < warmup; ++f) a.push_back({Action::F, f});          // warmup
  for (; f < M; ++f, ++b) {                                       // steady 1F1B
    a.push_back({Action::F, f});
    a.push_back({Action::B, b});
  }
  for (; b < M; ++b) a.push_back({Action::B, b});                // cooldown
  return a;
}

std::vector<Action> schedule_forward_only(int M) {
  std::vector<Action> a;
  for (int m = 0; m < M; ++m) a.push_back({Action::F, m});
  return a;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (auto& a : actions) s += (s.empty() ? "" : " ") + std::string(1, (char)a.kind) + std::to_string(a.mb);
  return s;
}

}  // namespace troupe
