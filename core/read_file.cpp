// core/read_file.cpp — see read_file.h.
#include "core/read_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/text.h"

namespace troupe {

std::string read_file_checked(const std::string& path, const std::string& label, const std::string& fix,
                              size_t max_bytes) {
  const std::string shown = printable(path, false, 400);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw UserError("cannot read " + label + " '" + shown + "' (" + std::strerror(err) + "); " + fix);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw UserError("cannot read " + label + " '" + shown + "': reading failed after " + std::to_string(out.size()) +
                      " byte(s) (" + std::strerror(err) +
                      "): a file that cannot be read to its end (a device, a /proc or /sys file, a failing disk) "
                      "cannot be one; " + fix);
    }
    if (n == 0) break;
    out.append(buf, (size_t)n);
    if (out.size() > max_bytes) break;
  }
  ::close(fd);
  return out;
}

}  // namespace troupe
