// core/file_lock.h — one try at an exclusive flock(2), telling "held by another process"
// from "this filesystem cannot lock" (NFS without lockd: ENOLCK), which no wait would end.
#pragma once
#include <string>

namespace troupe {

// Tries flock(fd, LOCK_EX | LOCK_NB) (EINTR retried): true when this process holds the lock,
// false when another process does (EWOULDBLOCK). Throws UserError naming `path` (the lock
// file), the reason and the fix for any other failure: ENOLCK, ENOSYS, EOPNOTSUPP ("the
// filesystem of PATH does not support file locks (an NFS mount without lockd?): put FOLDER
// on a local disk or a filesystem with locking"); `folder_key` names the setting that
// chooses the folder (e.g. "data.cache_dir", "--run-dir").
bool try_lock_exclusive(int fd, const std::string& path, const std::string& folder_key);

}  // namespace troupe
