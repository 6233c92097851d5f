// checkpoint/disk.h — the disk under a checkpoint directory: free space, the size of one
// snapshot, and the leftovers of snapshot writers that were killed.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace troupe {

// Bytes free to an unprivileged user (statvfs f_bavail) on the filesystem holding `path`,
// or its nearest existing parent; UINT64_MAX when that cannot be read.
uint64_t free_space(const std::string& path);
// Files (inodes) that can still be created on the filesystem holding `path` (or its nearest
// existing ancestor): statvfs f_favail; UINT64_MAX when unknown or unlimited (f_files = 0).
// A filesystem can have bytes free and no inode left (many small files): every new file fails.
uint64_t free_inodes(const std::string& path);

// About how many bytes one snapshot of this config takes on disk (a little more than it
// does): every shard file as write_shard_file lays it out (each pipeline, TP and DP rank's:
// record headers, the fp32 values, both AdamW moments and in mixed precision the fp32
// master weights, 12 or 16 bytes a parameter; the tied head's copy on the last stage is not
// written), the trained tokenizer's copy (data.tokenizer's size), and 1 MiB for the
// manifest and the folder. The tiny config (0.87 M parameters, PP 2, fp32): 10.4 MB
// written, 11.5 MB estimated.
uint64_t snapshot_bytes(const Config& c);

// Which save first lacks room when `saves` snapshots of `need` bytes each are written one
// after another into a folder whose filesystem has `total` bytes for snapshots (its free
// bytes plus those of the complete snapshots already there, `old`, oldest first, in bytes),
// retention keeping the newest `keep_last` (>= 1) complete ones after each save: a new
// snapshot is written whole before the older ones go (checkpointer.h), so keep_last + 1
// must fit at once, and the old ones go oldest first. Returns the 1-based index of the first
// save that would not fit, 0 when all fit.
int64_t first_failing_save(uint64_t total, uint64_t need, const std::vector<uint64_t>& old, int keep_last,
                           int64_t saves);

// Bytes of the regular files in a snapshot folder (0 for a folder that is a symbolic link:
// retention leaves it, and its bytes live elsewhere).
uint64_t snapshot_folder_bytes(const std::string& dir);

// The bytes of the largest single file of one snapshot of this config: the shard file of
// the pipeline rank whose worker holds the most parameters (its TP part; DP rank 0 writes
// the values and its ZeRO-1 share of the optimizer state), record headers included. What
// a file-size limit (ulimit -f) must allow. Not the tokenizer copy (its own size).
uint64_t largest_snapshot_file_bytes(const Config& c);

// The first entry of folder `dir` that no snapshot writer makes (anything but shard-*,
// manifest.capnp and tokenizer.model files and their temporaries: a user's file, a
// subfolder), or "" when it holds only those (or cannot be read).
std::string non_snapshot_file(const std::string& dir);

// The step-<k> folders in ckpt_dir without a manifest that hold only snapshot files: a
// snapshot half-deleted by retention or a replacement when its process was killed (the
// manifest goes first, so it is never taken for a snapshot). Removed; their paths returned.
// One that holds anything else stays (a run refuses it at the start, naming the file).
std::vector<std::string> remove_half_deleted_snapshots(const std::string& ckpt_dir);

// The unfinished snapshot folders (step-<k>.tmp-<pid>) in ckpt_dir that were last changed
// before `before` (unix seconds) by a writer that no longer runs on this host: they are
// removed and their names returned. One that holds a manifest.capnp is not touched (a
// snapshot finished but not renamed: snapshot_recover.h's promote_finished_snapshots). Only the files a snapshot writer makes go (shard-*,
// manifest.capnp, tokenizer.model and their temporaries): a folder that also holds anything
// else keeps it and stays, in `emptied` as {folder, the first such file}. Those of a live
// process stay, named in `kept`. Errors: none (a folder that cannot be removed is in `kept`).
// `locked`: this process holds ckpt_dir's lock, and a snapshot writer runs only in the
// process that does, so every other pid's writer is gone whatever runs under that pid now
// (a reused pid, or pid 1 of a container).
std::vector<std::string> remove_unfinished_snapshots(
    const std::string& ckpt_dir, double before, std::vector<std::string>* kept,
    std::vector<std::pair<std::string, std::string>>* emptied = nullptr, bool locked = false);

// A folder followed by what it is, not by its path: a run directory renamed during the run
// (mv runs/a runs/b) takes its checkpoints folder along, and snapshots written by the old path
// would make a second, split folder. Opened on a folder that exists (O_PATH); never throws.
class FolderAnchor {
 public:
  FolderAnchor() = default;
  explicit FolderAnchor(const std::string& path) { anchor(path); }
  ~FolderAnchor();
  FolderAnchor(const FolderAnchor&) = delete;
  FolderAnchor& operator=(const FolderAnchor&) = delete;
  // Holds the folder now at `path` (none held when it does not exist).
  void anchor(const std::string& path);
  enum class Where { same, moved, removed, unknown };
  // Where the held folder is now against `path`: `same` (path still names it), `moved` (it
  // now has another path: *now, read from /proc/self/fd), `removed` (deleted), `unknown`
  // (none held, or /proc not mounted).
  Where check(const std::string& path, std::string* now) const;

 private:
  int fd_ = -1;
  unsigned long long dev_ = 0, ino_ = 0;
};

// What to do about a snapshot that failed with errno `code` (SystemError::code, 0 when not
// known) while writing under ckpt_dir, as a clause naming the cause and its fix: a full disk
// (bytes, or inodes: `df -i`), a quota, the file-size limit (ulimit -f, with its value), the
// open-files limit (ulimit -n), a read-only filesystem, permissions or attributes, a path too
// long; otherwise path_error_fix's. Never throws.
std::string snapshot_failure_fix(int code, const std::string& ckpt_dir);

// How the user goes on after snapshots failed, as a clause: "then continue with --resume
// latest (the newest snapshot on disk is DIR, step K)" when ckpt_dir holds a snapshot, else
// "then run again: no snapshot of this run is on disk, so training starts again from step 1".
// Reads ckpt_dir (list_snapshots). Never throws.
std::string after_snapshot_failure(const std::string& ckpt_dir);

}  // namespace troupe
