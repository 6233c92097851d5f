// core/temp_folder.h — temporary folders that a later process can tell are abandoned, in
// any pid namespace: the maker holds an flock on the folder for as long as it uses it.
//
// A process killed with SIGKILL removes nothing. Its folder's name can carry its pid, but a
// pid means something only in its own pid namespace: containers that share /tmp (or a
// TMPDIR) cannot check each other's. A lock can be checked from anywhere: the kernel drops
// it when the last descriptor holding it closes, however the process ended.
#pragma once
#include <functional>
#include <string>

namespace troupe {

// A folder this process made and holds locked; `path` is "" when it could not be made.
struct LockedFolder {
  std::string path;
  int lock_fd = -1;  // O_CLOEXEC: children do not hold it
  int error = 0;     // errno of the failed mkdtemp when path is ""
};

// Makes `parent`/`prefix`XXXXXX (mkdtemp's six characters), mode 0700. It is made as
// `parent`/.`prefix`XXXXXX, locked (flock LOCK_EX), then renamed (renameat2 RENAME_NOREPLACE):
// every folder under the plain name is locked while its maker lives. Where the rename fails
// (a filesystem without renameat2) it keeps the dotted name; where flock fails (ENOLCK: some
// network filesystems) it is unlocked, and remove_abandoned_folders falls back on `dead`.
// Never throws.
LockedFolder make_locked_folder(const std::string& parent, const std::string& prefix);

// Removes the folder (with what it holds), then closes its lock. Never throws.
void remove_locked_folder(LockedFolder& f);

// Removes the folders `parent`/`prefix`* of this user that no process holds locked, and
// `parent`/.`prefix`* (a maker killed between mkdtemp and the rename) unlocked for a minute.
// Where flock does not work on `parent`, a folder is removed when `dead(path)` says its
// maker is gone (by the pid in its name or a file in it; null: never). Another user's
// folders, links and files stay, and so does a folder holding anything but plain files
// (a subfolder, a link: not one troupe made). Never throws.
void remove_abandoned_folders(const std::string& parent, const std::string& prefix,
                              const std::function<bool(const std::string& path)>& dead = nullptr);

// The inode number of this process's pid namespace ("4026531836", from /proc/self/ns/pid's
// "pid:[4026531836]"), "0" when /proc cannot say. Never throws.
std::string pid_namespace_id();

}  // namespace troupe
