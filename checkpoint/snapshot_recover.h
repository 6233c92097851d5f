// checkpoint/snapshot_recover.h — snapshots a killed writer finished but did not put in place.
// A snapshot is written into step-<k>.tmp-<pid>/, its manifest last, and the folder is then
// renamed step-<k> (snapshot_write.cpp's commit_snapshot). A writer killed between the two
// leaves a complete snapshot under the temporary name: it is checked and put in place, never
// deleted as unfinished (trial 50, M3).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

// Checks the snapshot in folder `dir` without a run's config: its manifest (trailer and
// crc32, format) parses, and every file it lists is in `dir` with the recorded size in bytes
// and crc32, each a regular file and none a symbolic link (a writer makes plain files).
// Returns the step the manifest records (>= 1). Throws UserError naming the file and what is
// wrong (missing, a link, another size, a failed checksum, a damaged manifest). With
// read_checksums = false the files' crc32 is not computed (no file is read past the
// manifest: a check of metadata only, for a refusal's advice).
int64_t check_snapshot_files(const std::string& dir, bool read_checksums = true);

// The step the manifest in folder `dir` records (its trailer and crc32 checked; the shard
// files are not read), or -1 when `dir` holds no readable, intact manifest. Never throws.
int64_t manifest_step(const std::string& dir);

// What promote_finished_snapshots did.
struct Promoted {
  std::vector<std::pair<std::string, std::string>> moved;  // {step-<k>.tmp-<pid>, step-<k>}
  std::vector<std::pair<std::string, std::string>> left;   // {folder, why it stays: a sentence with the fix}
};

// The step-<k>.tmp-<pid> folders of ckpt_dir (pid not this process's; folders, not links)
// that hold a manifest: {k, path}, in listing order. Their files are not checked. Never throws
// (an unlistable folder has none).
std::vector<std::pair<int64_t, std::string>> finished_tmp_snapshots(const std::string& ckpt_dir);

// Puts in place each step-<k>.tmp-<pid> folder of ckpt_dir (pid not this process's) that
// holds a complete snapshot of step k (check_snapshot_files): renamed to step-<k> (without
// replacing anything: renameat2 RENAME_NOREPLACE), ckpt_dir fsynced. A step-<k> there that
// is half-deleted (no manifest, snapshot files only) is removed first; one that is anything
// else stays, and so does the temporary folder, named in `left` with the fix (compare them,
// keep one). A folder whose manifest is there but whose files fail their checks stays too,
// named as damaged. Folders without a manifest are not touched (remove_unfinished_snapshots).
// The caller guarantees that no snapshot writer of ckpt_dir runs (it holds the folder's lock,
// or no live process does). Errors: none thrown (each failure is in `left`).
Promoted promote_finished_snapshots(const std::string& ckpt_dir);

}  // namespace troupe
