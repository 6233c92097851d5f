// tests/multiprocess_helpers.h — what the tests of jobs over several processes share
// (test_multiprocess.cpp, test_multiprocess_overlap.cpp): a scratch folder, a shell command
// under a deadline, the tiny 3-step job, its outcome (losses, validation loss, step-3
// snapshot shards) compared bitwise, and a check that no process outlives a test.
#pragma once
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_helpers.h"

namespace troupe::mptest {
namespace fs = std::filesystem;
inline const std::string kSrc = TROUPE_SOURCE_DIR;

using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("mp", name) {}
};

struct Run {
  int rc;
  std::string err;
  double seconds;
};

// Runs a shell command from the source dir under `timeout`, stderr to a file.
inline Run sh(const std::string& cmd, const Scratch& s, const std::string& tag, int timeout_s = 240) {
  const std::string err = s.path(tag + ".stderr");
  const std::string full = "cd '" + kSrc + "' && timeout -k 5 " + std::to_string(timeout_s) + " " + cmd + " > '" +
                           s.path(tag + ".stdout") + "' 2> '" + err + "'";
  auto t0 = std::chrono::steady_clock::now();
  int st = std::system(full.c_str());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(err), secs};
}

// The tiny job for 3 steps with a snapshot at step 3, the data cache shared by the test.
// A run's stderr with its "error:" and "launch:" lines first (a CI log keeps only the start
// of a long failure message), then the whole text.
inline std::string errors_first(const std::string& err) {
  std::istringstream in(err);
  std::string line, first;
  while (std::getline(in, line))
    if (line.find("error") != std::string::npos || line.rfind("launch:", 0) == 0) first += line + "\n";
  return first + "--- all of stderr:\n" + err;
}

inline std::string train_args(const Scratch& s, const std::string& run, const std::string& layout) {
  return "train --config configs/tiny.toml --run-dir '" + s.path(run) + "' --set data.cache_dir='" + s.path("cache") +
         "' --set train.steps=3 --set train.eval_interval=0 --set train.eval_batches=1 --set train.sample_tokens=0"
         " --set checkpoint.interval=3 --set fault.timeout_s=10 --set train.timeout_s=60 " +
         layout;
}

struct Outcome {
  std::vector<double> losses;
  double val = 0;
  std::map<std::string, std::string> shards;  // file name -> bytes
};

// The shard files of a snapshot folder: file name -> bytes.
inline std::map<std::string, std::string> shards_of(const std::string& snap) {
  std::map<std::string, std::string> out;
  if (fs::exists(snap))
    for (auto& e : fs::directory_iterator(snap))
      if (e.path().filename().string().rfind("shard-", 0) == 0) out[e.path().filename().string()] = slurp(e.path());
  return out;
}

// A run's training losses by step; the last record of each step wins (a restart repeats steps).
inline std::map<int, double> losses_by_step(const std::string& run) {
  std::map<int, double> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j["loss"].is_null()) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

inline Outcome read_run(const std::string& run) {
  Outcome o;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j["loss"].is_null()) o.losses.push_back(j["loss"].get<double>());
    if (j.contains("val_loss") && !j.contains("summary")) o.val = j["val_loss"].get<double>();
  }
  o.shards = shards_of(run + "/checkpoints/step-00000003");
  return o;
}

// A run's 3 losses, validation loss and snapshot shards are bitwise those of ref.
inline void check_same_run(const Outcome& got, const Outcome& ref) {
  REQUIRE(got.losses.size() == 3);
  for (int k = 0; k < 3; ++k) CHECK(got.losses[k] == ref.losses[k]);  // bitwise: same doubles
  CHECK(got.val == ref.val);
  REQUIRE(got.shards.size() == ref.shards.size());
  for (auto& [name, bytes] : ref.shards) {
    INFO("shard " << name);
    REQUIRE(got.shards.count(name));
    CHECK(got.shards.at(name) == bytes);
  }
}

// No process of this test's runs may outlive it (those still exiting get 15 s).
inline int survivors(const Scratch& s) {
  const std::string cmd = "pgrep -f -- '" + s.dir.string() + "' | grep -v $$ | wc -l";
  int n = 0;
  for (int i = 0; i < 30; ++i) {
    FILE* p = popen(cmd.c_str(), "r");
    n = 0;
    if (p) {
      if (fscanf(p, "%d", &n) != 1) n = 0;
      pclose(p);
    }
    if (n == 0) break;
    usleep(500 * 1000);
  }
  return n;
}
}  // namespace troupe::mptest
