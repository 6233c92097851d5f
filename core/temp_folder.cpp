// core/temp_folder.cpp — see temp_folder.h.
#include "core/temp_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>

namespace fs = std::filesystem;

namespace troupe {

LockedFolder make_locked_folder(const std::string& parent, const std::string& prefix) {
  LockedFolder f;
  std::string made = parent + "/." + prefix + "XXXXXX";
  if (::mkdtemp(made.data()) == nullptr) {
    f.error = errno;
    return f;
  }
  f.lock_fd = ::open(made.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (f.lock_fd >= 0 && ::flock(f.lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(f.lock_fd);  // (ENOLCK: `dead` decides for this folder)
    f.lock_fd = -1;
  }
  f.path = parent + "/" + prefix + made.substr(made.size() - 6);
  if (::renameat2(AT_FDCWD, made.c_str(), AT_FDCWD, f.path.c_str(), RENAME_NOREPLACE) != 0) f.path = made;
  return f;
}

void remove_locked_folder(LockedFolder& f) {
  std::error_code ec;
  if (!f.path.empty()) fs::remove_all(f.path, ec);
  if (f.lock_fd >= 0) ::close(f.lock_fd);
  f.path.clear();
  f.lock_fd = -1;
}

void remove_abandoned_folders(const std::string& parent, const std::string& prefix,
                              const std::function<bool(const std::string& path)>& dead) {
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string(), path = it->path().string();
    const bool unnamed = name.rfind("." + prefix, 0) == 0;
    struct stat st {};
    if ((name.rfind(prefix, 0) != 0 && !unnamed) || ::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::getuid() || (unnamed && ::time(nullptr) - st.st_mtime < 60))
      continue;
    // troupe puts only plain files there: a folder holding a folder, a link or a device is
    // someone else's that happens to share the prefix, and stays
    bool plain = true;
    std::error_code le;
    for (fs::directory_iterator jt(path, le), jend; plain && !le && jt != jend; jt.increment(le)) {
      struct stat js {};
      plain = ::lstat(jt->path().c_str(), &js) == 0 && S_ISREG(js.st_mode);
    }
    if (!plain || le) continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    bool gone = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (!gone && errno != EWOULDBLOCK && dead) gone = dead(path);
    if (gone) {
      std::error_code rm;
      fs::remove_all(path, rm);
    }
    ::close(fd);
  }
}

std::string pid_namespace_id() {
  std::error_code ec;
  std::string ns = fs::read_symlink("/proc/self/ns/pid", ec).string();  // "pid:[4026531836]"
  const size_t open = ns.find('[');
  if (ec || open == std::string::npos || ns.back() != ']') return "0";
  return ns.substr(open + 1, ns.size() - open - 2);
}

}  // namespace troupe
