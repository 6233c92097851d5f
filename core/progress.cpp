// core/progress.cpp — see progress.h.
#include "core/progress.h"

#include <cmath>
#include <cstdio>

namespace troupe {

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const long t = std::lround(s);
  if (t < 60) std::snprintf(buf, sizeof buf, "%lds", t);
  else if (t < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  return buf;
}

std::string progress_text(double elapsed, int64_t done, int64_t left) {
  const double per_step = done > 0 ? elapsed / (double)done : NAN;
  return "elapsed " + human_duration(elapsed) + " | ETA " + human_duration(per_step * (double)(left < 0 ? 0 : left));
}

}  // namespace troupe
