// checkpoint/disk.cpp — see disk.h.
#include "checkpoint/disk.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "model/gpt.h"

namespace fs = std::filesystem;

namespace troupe {

uint64_t free_space(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  struct statvfs v {};
  if (p.empty() || ::statvfs(p.c_str(), &v) != 0) return UINT64_MAX;
  return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
}

uint64_t snapshot_bytes(const Config& c) {
  const GPTConfig g = GPTConfig::from(c.model);
  const bool split = c.parallel.pp * c.parallel.chunks > 1;
  const double params = (double)g.n_params() + (split ? (double)g.V * g.C : 0.0);
  const double per_param = c.train.precision == "fp32" ? 12.0 : 16.0;  // mixed precision adds the master
  return (uint64_t)(per_param * params) + (1u << 20);
}

std::vector<std::string> remove_unfinished_snapshots(const std::string& ckpt_dir, double before,
                                                     std::vector<std::string>* kept) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.find(".tmp-");
    if (name.rfind("step-", 0) != 0 || at == std::string::npos || !it->is_directory(ec)) continue;
    const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    struct stat st {};
    if (pid <= 0 || ::stat(it->path().c_str(), &st) != 0) continue;
    const bool writer_gone = ::kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    if (!writer_gone || (double)st.st_mtime >= before) {
      if (kept) kept->push_back(it->path().string());
      continue;
    }
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (rm) {
      if (kept) kept->push_back(it->path().string());
    } else {
      removed.push_back(it->path().string());
    }
  }
  return removed;
}

}  // namespace troupe
