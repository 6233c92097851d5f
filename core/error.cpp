// core/error.cpp — see error.h.
#include "core/error.h"

#include <cxxabi.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <memory>
#include <new>
#include <tuple>
#include <typeinfo>
#include <utility>

namespace troupe {

namespace {
std::string g_oom_fixes;  // set_out_of_memory_fixes

// A finite RLIMIT_DATA or RLIMIT_AS may be what refused an allocation: {" under the
// data-segment limit (ulimit -d = 195 MiB)", "raise that limit (ulimit -d unlimited), or "};
// two empty strings when neither is set.
std::pair<std::string, std::string> memory_limit_clause() {
  const std::vector<MemoryLimit> limits = memory_limits();
  if (limits.empty()) return {};
  const MemoryLimit& l = limits.back();  // the data segment's when both are set: it is hit first
  return {std::string(" under the ") + l.name + " limit (ulimit " + l.flag + " = " + std::to_string(l.bytes >> 20) +
              " MiB)",
          std::string("raise that limit (ulimit ") + l.flag + " unlimited), or "};
}
}  // namespace

std::vector<MemoryLimit> memory_limits() {
  std::vector<MemoryLimit> out;
  for (const auto& [res, flag, name] : {std::tuple{RLIMIT_AS, "-v", "address-space"},
                                        std::tuple{RLIMIT_DATA, "-d", "data-segment"}}) {
    rlimit r{};
    if (::getrlimit(res, &r) == 0 && r.rlim_cur != RLIM_INFINITY) out.push_back({flag, name, (unsigned long long)r.rlim_cur});
  }
  return out;
}

void set_out_of_memory_fixes(std::string fixes) { g_oom_fixes = std::move(fixes); }

OutOfMemoryFixesScope::OutOfMemoryFixesScope(std::string fixes)
    : previous_(std::exchange(g_oom_fixes, std::move(fixes))), exceptions_(std::uncaught_exceptions()) {}

OutOfMemoryFixesScope::~OutOfMemoryFixesScope() {
  if (std::uncaught_exceptions() == exceptions_) g_oom_fixes = std::move(previous_);
}

bool is_out_of_memory_sentence(const std::string& sentence) {
  for (const char* head : {"out of memory (", "optimizer: out of memory ("})
    if (sentence.rfind(head, 0) == 0) return true;
  return false;
}

const char* path_error_fix(int code) {
  return code == ENAMETOOLONG ? "shorten it (a file name has at most 255 bytes, a path 4095)"
         : code == ELOOP      ? "a symbolic link on it points back into itself: fix or remove that link"
         : code == EACCES   ? "check the permissions of its folders, or choose another path"
         : code == EPERM    ? "check the permissions of its folders, and whether the file or its folder is immutable "
                              "or append-only (lsattr; chattr -i or -a), or choose another path"
         : code == ENOSPC || code == EDQUOT ? "free space there (or inodes, see df -i), or choose another path"
         : code == EROFS    ? "the filesystem is read-only: choose a writable path"
         : code == EBUSY    ? "it is in use (a mount point?): choose another path"
         : code == ENOTDIR  ? "a part of it that should be a folder is a file: fix the path"
         : code == EISDIR   ? "it is a folder: name a file"
         : code == EEXIST || code == ENOTEMPTY ? "something is in the way there: move it or choose another path"
         : code == EXDEV    ? "it crosses filesystems: keep it on one filesystem"
         : code == EIO      ? "the device reported an I/O error: check the disk"
         : code == EMFILE   ? "this process may open no more files: raise the open-files limit (ulimit -n 65536)"
         : code == ENFILE   ? "the system's table of open files is full: close files elsewhere, or raise fs.file-max "
                              "(sysctl)"
         : code == ENOMEM   ? "the kernel ran out of memory for it: free memory (other programs, ulimit -v) and try "
                              "again"
         : code == EFBIG    ? "the file-size limit (ulimit -f) or the filesystem's largest file is too small: raise "
                              "ulimit -f, or choose another path"
                            : "check the path";
}

std::string write_error_fix(int code, const std::string& dir) {
  switch (code) {
    case ENOSPC:
      return "Free space on that disk (df -h " + dir + "; df -i " + dir + " for inodes)";
    case EDQUOT:
      return "This user's disk quota there is used up (quota -s): free space or raise the quota";
    case EACCES:
    case EPERM:
      return "This user may not write the file: check its permissions and attributes (ls -l, lsattr in " + dir +
             "; chattr -i removes the immutable flag)";
    case EFBIG:
      return "The file reached the file-size limit (ulimit -f): raise it before the next run";
    case EROFS:
      return "The filesystem of " + dir + " became read-only: remount it writable";
    case EIO:
      return "The device reported an I/O error: check the disk (dmesg)";
    case 0:
      return "Check the file and its folder (ls -l " + dir + ", df -h " + dir + ")";
    default: {
      std::string fix = path_error_fix(code);
      fix[0] = (char)std::toupper((unsigned char)fix[0]);
      return fix + " (" + dir + ")";
    }
  }
}

std::string missing_reason(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return "exists";
  if (errno == EACCES) {  // a folder on the way this user may not enter: the path may well exist
    std::string blocked = path;
    for (std::string p = path; !p.empty();) {
      const size_t slash = p.find_last_of('/');
      if (slash == std::string::npos) break;
      p.resize(slash == 0 ? 1 : slash);
      if (::access(p.c_str(), X_OK) != 0 && errno == EACCES) blocked = p;
      if (p == "/") break;
    }
    std::string out = "cannot be reached by this user: it may not enter the folder '";  // (piece by piece: GCC 12's
    out += blocked;                                                                    // -Wrestrict misfires)
    out += "' (Permission denied; give it search permission, chmod a+x '";
    out += blocked;
    out += "', or run troupe as a user who may); if that is not it,";
    return out;
  }
  if (errno == ENAMETOOLONG)
    return "cannot be used: the path is " + std::to_string(path.size()) +
           " bytes, too long for the system (File name too long; a path has at most 4095 bytes, a name 255): "
           "shorten it;";
  if (errno == ELOOP) return "is a loop of symbolic links (one points back to another); fix or remove the link, and";
  if (errno == ENOTDIR) {  // the file it goes through is named: "create that folder" could not work (trial 60, F4)
    std::string file;
    for (size_t slash = path.find('/', 1); slash != std::string::npos && file.empty(); slash = path.find('/', slash + 1)) {
      const std::string part = path.substr(0, slash);
      if (::stat(part.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) file = part;
    }
    if (!file.empty())
      return "does not exist: the path goes through the file '" + file + "' as if it were a folder (a file cannot "
             "hold one); move that file out of the way, or";
    return "does not exist: the path goes through a file as if it were a folder;";
  }
  if (errno == ENOENT && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char target[512];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
    return "is a symbolic link to nothing (it points to '" + std::string(target, n > 0 ? (size_t)n : 0) +
           "', which does not exist); fix or remove the link, and";
  }
  if (errno == ENOENT && !path.empty() && path[0] != '/') {  // relative to a current folder deleted under it
    char cwd[64];
    if (::getcwd(cwd, sizeof cwd) == nullptr && errno == ENOENT)
      return "does not exist here: it is relative, and the current folder was deleted (cd to an existing folder, or "
             "give an absolute path);";
  }
  return "does not exist;";
}

std::string broken_link_on(const std::string& path) {
  if (path.empty()) return "";
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  for (;;) {
    struct stat st;
    if (::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && ::stat(p.c_str(), &st) != 0 &&
        (errno == ENOENT || errno == ELOOP))
    {
      std::string out = "'";  // (piece by piece: GCC 12's -Wrestrict misfires on "'" + string)
      out += p;
      out += "' ";
      out += missing_reason(p);
      return out;
    }
    const size_t slash = p.find_last_of('/');
    if (slash == std::string::npos || slash == 0) return "";
    p.resize(slash);
    while (p.size() > 1 && p.back() == '/') p.pop_back();
  }
}

std::string describe_filesystem_error(const std::filesystem::filesystem_error& e) {
  std::string paths = "'";  // (appended piece by piece: GCC 12's -Wrestrict misfires on "'" + string)
  paths += e.path1().string();
  paths += "'";
  if (!e.path2().empty()) paths += " and '" + e.path2().string() + "'";
  if (paths.size() > 600) paths = paths.substr(0, 280) + " ... " + paths.substr(paths.size() - 280);
  const int code = e.code().value();
  const char* fix = path_error_fix(code);
  return "cannot use the path " + paths + " (" + e.code().message() + "); " + fix;
}

std::string describe_exception(const std::exception& e) {
  if (dynamic_cast<const Error*>(&e)) return e.what();
  if (auto* fe = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) return describe_filesystem_error(*fe);
  if (dynamic_cast<const std::bad_alloc*>(&e)) {
    const auto [limit, raise] = memory_limit_clause();
    return "out of memory (a buffer could not be allocated" + limit + "); " + raise +
           (g_oom_fixes.empty() ? "lower train.batch_size or train.seq_len, raise parallel.microbatches, set "
                                  "train.recompute = \"full\", or spread the model over more parallel.pp / tp"
                                : g_oom_fixes);
  }
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status),
                                              std::free);
  return std::string(status == 0 && name ? name.get() : typeid(e).name()) + ": " + e.what();
}

}  // namespace troupe

namespace troupe::detail {

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[400];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  const std::string fixed = r.ec == std::errc() ? std::string(buf, r.ptr) : std::string();
  if (!fixed.empty() && fixed.size() <= 12) return fixed;
  r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci;
  if (r.ec == std::errc()) {  // 1.5e+300 -> 1.5e300, 2.5e-07 -> 2.5e-7
    const std::string t(buf, r.ptr);
    const size_t e = t.find('e');
    std::string exp = t.substr(e + 1);
    const bool minus = exp[0] == '-';
    exp = exp.substr(exp[0] == '-' || exp[0] == '+' ? 1 : 0);
    exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
    sci = t.substr(0, e) + "e" + (minus ? "-" : "") + exp;
  }
  if (!sci.empty() && sci.size() <= 8) return sci;   // 2e18, 3.5e38
  if (!fixed.empty() && fixed.size() <= 20) return fixed;  // 9007199254740992, 604800.0000000001 (trial 61)
  if (!sci.empty()) return sci;                       // every digit: rounding could make it equal a bound
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace troupe::detail
