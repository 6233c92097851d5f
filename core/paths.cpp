#include "core/paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace fs = std::filesystem;

namespace troupe {

fs::path resolved_path(const std::string& path) {
  if (path.empty()) return {};
  std::error_code ec;
  fs::path a = fs::absolute(path, ec);
  if (ec) a = fs::path(path);
  fs::path c = fs::weakly_canonical(a, ec);
  return ec || c.empty() ? a.lexically_normal() : c;
}

int fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  return rc == 0 ? 0 : err;
}

bool path_within(const std::string& path, const std::string& dir) {
  if (path.empty() || dir.empty()) return false;
  const std::string p = resolved_path(path).string(), d = resolved_path(dir).string();
  return p == d || p.rfind(d.back() == '/' ? d : d + "/", 0) == 0;
}

}  // namespace troupe
