// core/read_file.h — reading a whole input file with a failed read named, never taken for
// the file's end (a /proc file such as /proc/self/mem fails its first read with EIO: an
// istream stops there as if the file were empty).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe {

// The bytes of file `path`, read to its end, at most `max_bytes` + 1 of them (so a caller
// that allows max_bytes can tell a larger file apart). Errors: UserError "cannot read LABEL
// 'PATH' (STRERROR); FIX" when open(2) fails, and "cannot read LABEL 'PATH': reading failed
// after N byte(s) (STRERROR): a file that cannot be read to its end (a device, a /proc or
// /sys file, a failing disk) cannot be one; FIX" when read(2) fails. `label` names what the
// file is for ("config file", "schedule file"), `fix` what to pass instead. The path is
// quoted printable (core/text.h). EINTR is retried.
std::string read_file_checked(const std::string& path, const std::string& label, const std::string& fix,
                              size_t max_bytes = SIZE_MAX - 1);

}  // namespace troupe
