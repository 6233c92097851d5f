// core/append_file.cpp — see append_file.h.
#include "core/append_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace troupe {

int AppendFile::open(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return errno;
  struct stat st {};
  good_bytes_ = ::fstat(fd_, &st) == 0 ? (uint64_t)st.st_size : 0;
  return 0;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

int AppendFile::append(std::string_view record) {
  size_t done = 0;
  errno = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t)n;
  }
  if (done == record.size()) {
    good_bytes_ += record.size();
    return 0;
  }
  const int err = errno != 0 ? errno : ENOSPC;  // write() returning 0: no room
  // best effort: a reader stops at a torn record, and would miss every record after it
  if (done > 0) (void)!::ftruncate(fd_, (off_t)good_bytes_);
  return err;
}

bool AppendFile::unlinked() const {
  struct stat st {};
  return fd_ >= 0 && ::fstat(fd_, &st) == 0 && st.st_nlink == 0;
}

}  // namespace troupe
