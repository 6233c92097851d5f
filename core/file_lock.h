// core/file_lock.h — one try at an exclusive flock(2), telling "held by another process"
// from "this filesystem cannot lock" (NFS without lockd: ENOLCK), which no wait would end.
#pragma once
#include <string>
#include <vector>

namespace troupe {

// Tries flock(fd, LOCK_EX | LOCK_NB) (EINTR retried): true when this process holds the lock,
// false when another process does (EWOULDBLOCK). Throws UserError naming `path` (the lock
// file), the reason and the fix for any other failure: ENOLCK, ENOSYS, EOPNOTSUPP ("the
// filesystem of PATH does not support file locks (an NFS mount without lockd?): put FOLDER
// on a local disk or a filesystem with locking"); `folder_key` names the setting that
// chooses the folder (e.g. "data.cache_dir", "--run-dir").
bool try_lock_exclusive(int fd, const std::string& path, const std::string& folder_key);

// The pid of a process holding a flock(2) on the file open at `fd`, from /proc/locks (the
// line whose device and inode are the file's) when that process lives; when it has exited
// (a child that inherited the descriptor holds the lock now, as under flock(1)), the first
// other process with the file open (/proc/*/fd). 0 when none is found or /proc is not
// mounted. The pids are those of /proc's pid namespace. Never throws.
long flock_holder_pid(int fd);

// The processes other than this one that have the file open at `fd` open (/proc/*/fd), at
// most `max`, in /proc's order: every holder of a lock a command's children inherited (flock
// PATH CMD: flock and CMD). Empty when none is found or /proc is not mounted. Never throws.
std::vector<long> processes_with_file_open(int fd, size_t max = 8);

// The command name of process `pid` (/proc/PID/comm, control bytes escaped, at most 64
// bytes), "?" when it cannot be read. Never throws.
std::string process_command(long pid);

// The holders of a flock on the file at `fd` that troupe did not take (it wrote no pid in
// it): "process A (flock), process B (sleep)", the holder /proc/locks names first, then every
// other process with the file open (at most 8). `pids` (when given) receives " A B", for a
// kill hint. "" when no holder is found. Never throws.
std::string foreign_lock_holders(int fd, std::string* pids = nullptr);

}  // namespace troupe
