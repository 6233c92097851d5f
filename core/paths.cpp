#include "core/paths.h"

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

}  // namespace troupe
