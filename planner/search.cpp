#include "planner/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "stages/schedule.h"

namespace troupe::plan {
namespace {

struct Leaf {
  Config c;
  std::vector<std::pair<std::string, std::string>> choice;
  Plan plan;  // memory + min_iteration
};

std::vector<int> divisors(int n, int cap) {
  std::vector<int> out;
  for (int d = 1; d <= std::min(n, cap); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The values a searched key takes; a fixed key keeps the config's.
std::vector<std::string> candidates(const std::string& key, const Config& c, const Cluster& cl) {
  const bool cpu = cl.dev.name == "cpu";
  const int devs = cpu ? 8 : cl.devices();
  std::vector<std::string> out;
  auto ints = [&](const std::vector<int>& v) {
    for (int x : v) out.push_back(std::to_string(x));
  };
  if (key == "parallel.tp") ints(divisors(c.model.n_head, devs));
  if (key == "parallel.pp") {
    for (int p = 1; p <= std::min(c.model.n_layer, devs); ++p)
      if (cpu || devs % p == 0) out.push_back(std::to_string(p));
  }
  if (key == "parallel.dp") ints(cpu ? divisors(c.train.batch_size, 4) : divisors(devs, devs));
  if (key == "parallel.microbatches") ints(divisors(c.train.batch_size, c.train.batch_size));
  if (key == "parallel.chunks") {
    for (int v = 1; v <= std::min(8, c.model.n_layer); ++v) out.push_back(std::to_string(v));
  }
  if (key == "parallel.schedule") out = {"\"gpipe\"", "\"1f1b\"", "\"interleaved\"", "\"zb-h1\""};
  if (key == "train.recompute") out = {"\"none\"", "\"selective\"", "\"full\""};
  if (key == "parallel.sequence_parallel") out = {"false", "true"};
  return out;
}

}  // namespace

// The message up to the first ';' or ':' with the numbers that stand alone replaced by N,
// so equal rules count together; digits inside a word or a path (s48.csv, /tmp/r18/,
// a100) stay as they are.
std::string rejection_reason(const std::string& msg) {
  std::string r = msg.substr(0, std::min(msg.find(';'), msg.find(':')));
  auto word = [](char ch) { return std::isalnum((unsigned char)ch) || ch == '/' || ch == '_' || ch == '.'; };
  std::string out;
  for (size_t i = 0; i < r.size();) {
    if (std::isdigit((unsigned char)r[i]) && (i == 0 || !word(r[i - 1]))) {
      size_t j = i;
      while (j < r.size() && (std::isdigit((unsigned char)r[j]) ||
                              (r[j] == '.' && j + 1 < r.size() && std::isdigit((unsigned char)r[j + 1]))))
        ++j;
      if (j == r.size() || !word(r[j]) || (r[j] == '.' && (j + 1 == r.size() || !word(r[j + 1])))) {
        out += 'N';
        i = j;
        continue;
      }
      out.append(r, i, j - i);  // part of a word or path: kept
      i = j;
      continue;
    }
    out += r[i++];
  }
  return out;
}

namespace {

// The second pass: builds each fitting layout's schedule and simulates it, most promising
// first (lower bound: no bubble, no p2p), on 2 threads, until no bound can beat the
// top_n-th layout found; adds the entries and rejections to r.
void simulate_best(std::vector<Leaf>& fit, const Cluster& cl, const PlanOptions& o, int top_n, SearchResult& r) {
  std::sort(fit.begin(), fit.end(), [](const Leaf& a, const Leaf& b) { return a.plan.min_iteration < b.plan.min_iteration; });
  std::mutex mu;
  size_t next = 0;
  long slower = 0;
  std::map<std::tuple<std::string, int, int, int>, std::shared_ptr<const Schedule>> schedules;
  auto schedule_for = [&](const ParallelConfig& p) {
    auto key = std::make_tuple(p.schedule, p.pp, p.microbatches, p.chunks);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = schedules.find(key); it != schedules.end()) return it->second;
    }
    auto sc = std::make_shared<Schedule>(make_schedule(p.schedule, p.pp, p.microbatches, p.chunks));
    validate_schedule(*sc);
    std::lock_guard<std::mutex> lock(mu);
    return schedules.emplace(key, std::move(sc)).first->second;
  };
  auto worker = [&] {
    for (;;) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= fit.size()) return;
        i = next++;
        if ((int)r.top.size() >= top_n && fit[i].plan.min_iteration >= r.top.back().plan.time.iteration) {
          slower += (long)(fit.size() - i);
          next = fit.size();
          return;
        }
      }
      std::string why;
      Plan pl;
      try {
        pl = plan_layout(fit[i].c, cl, o, schedule_for(fit[i].c.parallel).get());
        if (!pl.fits) why = "does not fit in device memory";
      } catch (const UserError& e) {
        why = rejection_reason(e.what());
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!why.empty()) {
        r.rejected[why] += 1;
        continue;
      }
      r.top.push_back({std::move(pl), fit[i].choice});
      std::sort(r.top.begin(), r.top.end(),
                [](const SearchEntry& a, const SearchEntry& b) { return a.plan.time.iteration < b.plan.time.iteration; });
      if ((int)r.top.size() > top_n) r.top.pop_back(), ++slower;
    }
  };
  std::thread t1;
  try {
    t1 = std::thread(worker);
  } catch (const std::system_error&) {  // no thread left: this one does all the work
  }
  worker();
  if (t1.joinable()) t1.join();
  r.considered += (long)fit.size();
  if (slower > 0) r.rejected[fmt::format("slower than the {} shown (simulated, or by a lower bound)", top_n)] += slower;
}

}  // namespace

const std::vector<std::string>& searchable_keys() {
  static const std::vector<std::string> k = {"parallel.tp",       "parallel.pp",     "parallel.dp",
                                             "parallel.microbatches", "parallel.schedule", "parallel.chunks",
                                             "train.recompute",   "parallel.sequence_parallel"};
  return k;
}

std::vector<std::string> parse_search_keys(const std::string& spec) {
  if (spec == "all") return searchable_keys();
  std::vector<std::string> out;
  std::stringstream ss(spec);
  std::string k;
  std::string known;
  for (auto& s : searchable_keys()) known += (known.empty() ? "" : ", ") + s;
  while (std::getline(ss, k, ',')) {
    if (k.empty()) continue;
    TROUPE_USER_CHECK(std::find(searchable_keys().begin(), searchable_keys().end(), k) != searchable_keys().end())
        << "--search key '" << k << "' cannot be searched; use 'all' or a comma list of: " << known;
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);  // a key named twice is searched once
  }
  TROUPE_USER_CHECK(!out.empty()) << "--search needs keys; use 'all' or a comma list of: " << known;
  return out;
}

SearchResult search_layouts(const Config& base, const Cluster& cl, const std::vector<std::string>& keys,
                            const PlanOptions& o, int top_n) {
  const auto& order = searchable_keys();
  std::vector<std::vector<std::string>> vals;
  for (auto& k : order) {
    const bool searched = std::find(keys.begin(), keys.end(), k) != keys.end();
    vals.push_back(searched ? candidates(k, base, cl) : std::vector<std::string>{});
  }
  SearchResult r;
  std::vector<Leaf> fit;
  auto reject = [&](const std::string& why, long n) { r.rejected[why] += n, r.considered += n; };
  // remaining[i]: combinations below level i
  std::vector<long> remaining(order.size() + 1, 1);
  for (int i = (int)order.size() - 1; i >= 0; --i) remaining[i] = remaining[i + 1] * std::max<size_t>(1, vals[i].size());
  std::function<void(size_t, Config&, std::vector<std::pair<std::string, std::string>>&)> walk =
      [&](size_t i, Config& c, std::vector<std::pair<std::string, std::string>>& choice) {
        const auto& p = c.parallel;
        // cheap rules as soon as their keys are set (levels: tp, pp, dp | microbatches | chunks)
        if (i == 3 && cl.dev.name != "cpu" && p.tp * p.pp * p.dp != cl.devices())
          return reject(fmt::format("parallel.tp x parallel.pp x parallel.dp != the cluster's {} devices", cl.devices()),
                        remaining[i]);
        if (i == 4 && c.train.batch_size % (p.dp * p.microbatches) != 0)
          return reject("train.batch_size not divisible by parallel.dp x parallel.microbatches", remaining[i]);
        if (i == 6 && p.chunks > 1 && p.schedule != "interleaved")
          return reject("parallel.chunks > 1 needs the interleaved schedule", remaining[i]);
        if (i == 6 && p.schedule == "interleaved" && p.microbatches % p.pp != 0)
          return reject("interleaved needs parallel.microbatches to be a multiple of parallel.pp", remaining[i]);
        if (i == order.size()) {
          if (p.sequence_parallel && p.tp == 1 && !vals.back().empty())
            return reject("parallel.sequence_parallel without TP (the same layout as off)", 1);
          // Equivalent layouts, when the one they equal is searched too: each is listed once.
          const bool schedules = !vals[4].empty(), chunks = !vals[5].empty();
          if (schedules && p.schedule == "interleaved" && p.chunks == 1)
            return reject("interleaved with parallel.chunks 1 (the same schedule as 1f1b)", 1);
          if (p.pp == 1 && schedules && p.schedule != "1f1b" && (p.chunks == 1 || chunks)) {
            if (p.schedule == "interleaved")
              return reject("parallel.pp 1 with interleaved (1f1b's run cut into chunks: no bubble to shrink)", 1);
            if (p.schedule == "gpipe" || p.schedule == "zb-h1")
              return reject("parallel.pp 1 with gpipe or zb-h1 (1f1b's time, as much memory or more)", 1);
          }
          if (p.pp == 1 && chunks && p.chunks > 1)
            return reject("parallel.pp 1 with parallel.chunks > 1 (chunks 1's run cut into chunks: no bubble to shrink)", 1);
          try {
            c.validate(kMaxPlanDevices);
            Plan pl = plan_layout(c, cl, o, nullptr);  // memory with one microbatch stashed: a lower bound
            if (!pl.fits) return reject("does not fit in device memory", 1);
            fit.push_back({c, choice, std::move(pl)});
          } catch (const UserError& e) {
            reject(rejection_reason(e.what()), 1);
          }
          return;
        }
        if (vals[i].empty()) return walk(i + 1, c, choice);
        for (auto& v : vals[i]) {
          Config next = c;
          next.set(order[i] + "=" + v);
          choice.emplace_back(order[i], v);
          walk(i + 1, next, choice);
          choice.pop_back();
        }
      };
  Config c0 = base;
  std::vector<std::pair<std::string, std::string>> choice;
  walk(0, c0, choice);
  simulate_best(fit, cl, o, top_n, r);
  return r;
}

std::string format_search(const SearchResult& r, const std::vector<std::string>& keys) {
  std::ostringstream os;
  os << (r.top.empty() ? fmt::format("{} layouts considered; none fits and runs\n", r.considered)
                       : fmt::format("{} layouts considered; the {} fastest that fit:\n", r.considered, r.top.size()));
  os << fmt::format("{:>4}", "#");
  for (auto& k : keys) os << fmt::format(" {:>12}", k.substr(k.find('.') + 1).substr(0, 12));
  os << fmt::format(" {:>11} {:>9} {:>7} {:>12} {:>9}\n", "iteration_s", "TFLOP/s", "MFU", "tokens/s", "mem GiB");
  for (size_t i = 0; i < r.top.size(); ++i) {
    const auto& e = r.top[i];
    os << fmt::format("{:>4}", i + 1);
    for (auto& k : keys) {
      std::string v;
      for (auto& [ck, cv] : e.choice)
        if (ck == k) v = cv;
      v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
      os << fmt::format(" {:>12}", v);
    }
    os << fmt::format(" {:>11.4g} {:>9.1f} {:>6.1f}% {:>12.0f} {:>9.2f}\n", e.plan.time.iteration, e.plan.tflops_per_gpu,
                      100 * e.plan.mfu, e.plan.tokens_per_s, e.plan.worst().total() / (1024.0 * 1024 * 1024));
  }
  os << "rejected, by reason:\n";
  std::vector<std::pair<long, std::string>> rs;
  for (auto& [why, n] : r.rejected) rs.emplace_back(n, why);
  std::sort(rs.rbegin(), rs.rend());
  for (auto& [n, why] : rs) os << fmt::format("  {:>10}  {}\n", n, why);
  return os.str();
}

}  // namespace troupe::plan
