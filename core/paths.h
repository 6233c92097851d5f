// core/paths.h — one answer to "which file is this path", for comparing paths a user gave.
#pragma once
#include <filesystem>
#include <string>

namespace troupe {

// `path` made absolute (against the current directory) with its symbolic links resolved as
// far as they exist (std::filesystem::weakly_canonical). Where that fails — a loop of links,
// a folder this user cannot enter, the current directory deleted — the absolute path with
// "." and ".." folded (lexically_normal), never an empty path: compared with another path's
// resolution, an empty one would seem to lie inside every folder. "" gives "". Never throws
// (an allocation failure aside).
std::filesystem::path resolved_path(const std::string& path);

// True when `path` is the folder `dir` or lies inside it, both resolved (resolved_path).
// False when either is empty. Never throws.
bool path_within(const std::string& path, const std::string& dir);

// Flushes the file at `path` to its disk (fsync(2) through a new read-only descriptor), so a
// temporary file renamed over an output is whole after a power loss, not empty. Returns 0, or
// the errno of the open or the fsync. Never throws.
int fsync_path(const std::string& path);

}  // namespace troupe
