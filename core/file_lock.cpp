// core/file_lock.cpp — see file_lock.h.
#include "core/file_lock.h"

#include <sys/file.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/text.h"

namespace troupe {

bool try_lock_exclusive(int fd, const std::string& path, const std::string& folder_key) {
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EWOULDBLOCK) return false;
    const std::string shown = printable(path, false, 400);
    if (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP)
      throw UserError("cannot lock '" + shown + "' (" + std::strerror(err) + "): the filesystem it lies on does "
                      "not support file locks (an NFS mount without lockd?), so processes sharing the folder could "
                      "not take turns; put " + folder_key + " on a local disk or a filesystem with locking");
    throw UserError("cannot lock '" + shown + "' (" + std::strerror(err) + "); " + path_error_fix(err) + " (" +
                    folder_key + ")");
  }
}

}  // namespace troupe
