// core/append_file.h — a file that grows by whole records (metrics.jsonl lines, TensorBoard
// events). A record that does not fit (a full disk) is cut off again, so the file stays
// readable up to its last whole record and later records can still follow it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe {

class AppendFile {
 public:
  AppendFile() = default;
  // Opens (creates) `path` for appending (O_APPEND, 0644). Returns 0, or the errno of the failure.
  int open(const std::string& path);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  bool is_open() const { return fd_ >= 0; }
  // Appends `record` (bytes) with write(2): it is in the kernel when this returns. Returns 0,
  // or the errno of a failed or short write (ENOSPC when the disk is full); the part that
  // reached the file is then truncated away (ftruncate to the last whole record).
  int append(std::string_view record);
  const std::string& path() const { return path_; }
  // Whether the open file has no name any more (removed, or its folder deleted, while open:
  // appends then reach no file anyone can read). Never throws.
  bool unlinked() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t good_bytes_ = 0;  // bytes of whole records: the file's size when opened, then grown
};

}  // namespace troupe
