// core/error.h — the one check-macro family of troupe.
//
//   TROUPE_CHECK(cond) << "context";   // internal invariant: throws troupe::Error
//   TROUPE_USER_CHECK(cond) << "what is wrong; how to fix it";  // bad input: UserError
//
// Both capture the expression text, function and file:line. Only `main` turns an
// error into an exit code: UserError → 2, any other exception → 1 (see cli/main.cpp).
#pragma once
#include <sstream>
#include <type_traits>
#include <stdexcept>
#include <filesystem>
#include <string>
#include <vector>

namespace troupe {

// Any failure that is not the user's fault (exit code 1).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A user mistake: wrong config, missing/corrupt input, impossible layout (exit code 2).
// what() is one sentence naming the problem and the fix.
class UserError : public Error {
 public:
  using Error::Error;
};

// A failed system call on a path: what() names the path and strerror, code() is the errno.
// Callers that name a fix by the cause (a failed snapshot: ENOSPC, EFBIG, EMFILE, EROFS, ...)
// read the code; everyone else treats it as an Error (exit 1).
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// A failure this process cannot recover from in place: a library's state in it is damaged
// (UCX after a failed accept() cannot create its worker again: its async handler table keeps
// a stale entry). Under fault.policy = restart troupe train exits with the launcher's "start
// me again" status, so a fresh process takes its place; otherwise it is an Error (exit 1).
class FreshProcessError : public Error {
 public:
  using Error::Error;
};

// A sentence for any exception that reaches an actor's or main's last catch: troupe's own
// errors as they are; std::bad_alloc as "out of memory" with the fixes; another library's
// exception (oneDNN's dnnl::error, the standard library's) with its type, so the user
// sees what failed. Defined in core/error.cpp.
std::string describe_exception(const std::exception& e);

// What a command says after "out of memory" (set once by the CLI for the command it runs,
// e.g. generate's fixes instead of training's); empty: training's fixes. Not thread-safe to
// set while another thread reads it: set it before any worker starts.
void set_out_of_memory_fixes(std::string fixes);
// Sets the fixes for one phase of a command (e.g. train's data step) and puts the command's
// back when the phase ends without an exception (an exception's sentence keeps the phase's).
class OutOfMemoryFixesScope {
 public:
  explicit OutOfMemoryFixesScope(std::string fixes);
  ~OutOfMemoryFixesScope();
  OutOfMemoryFixesScope(const OutOfMemoryFixesScope&) = delete;
  OutOfMemoryFixesScope& operator=(const OutOfMemoryFixesScope&) = delete;

 private:
  std::string previous_;
  int exceptions_;
};
// Whether `sentence` (describe_exception's, perhaps after an actor's "optimizer: " prefix)
// reports an allocation that failed: a resource limit the user sets, so exit 2, not a fault.
bool is_out_of_memory_sentence(const std::string& sentence);

// A finite limit of this process on the memory malloc can map (setrlimit(2)): the
// address-space limit (RLIMIT_AS, `ulimit -v`) and the data-segment limit (RLIMIT_DATA,
// `ulimit -d`, which counts every private writable mapping since Linux 4.7, thread stacks
// included). flag is the ulimit option ("-v", "-d"), name its words ("address-space",
// "data-segment"), bytes the soft limit.
struct MemoryLimit {
  const char* flag;
  const char* name;
  unsigned long long bytes;
};
// The finite ones, address space first. Never throws.
std::vector<MemoryLimit> memory_limits();

// A std::filesystem::filesystem_error as one sentence naming the path(s), the reason and
// the fix for the reason (a name too long, a loop of symbolic links, permissions, a full
// disk, a read-only filesystem, a busy mount point). For main's last catch: such an error
// comes from the user's paths, so troupe exits 2 with it.
std::string describe_filesystem_error(const std::filesystem::filesystem_error& e);

// The fix for a failed file operation's errno, as a clause: ENOSPC "free space there, or
// choose another path", EBUSY "it is in use (a mount point?): choose another path", EMFILE
// "... raise the open-files limit (ulimit -n 65536)", ...;
// "check the path" for a code without a specific fix.
const char* path_error_fix(int err);

// The fix for a file in folder `dir` that could not be written (an append or write(2) that
// failed with errno `err`), as a sentence starting with a capital: ENOSPC "Free space on that
// disk (df -h DIR; df -i DIR for inodes)", EDQUOT the quota, EACCES/EPERM the file's
// permissions and attributes (chattr -i), EFBIG the file-size limit, EROFS a read-only
// remount, EIO the disk; 0 (unknown) "Check the file and its folder (ls -l, df -h DIR)".
std::string write_error_fix(int err, const std::string& dir);

// Why `path` cannot be found, as a clause to put after the quoted path and before the
// caller's fix: "does not exist;", "is a loop of symbolic links (...); fix or remove the link,
// and", "is a symbolic link to nothing (it points to 'T', ...); fix or remove the link, and";
// "cannot be reached by this user: it may not enter the folder 'F' (Permission denied; ...);
// if that is not it," when a folder on the way denies search permission (EACCES);
// "exists" when stat() succeeds. For messages that would otherwise call a link loop or a
// dangling link missing though `ls` shows it. Never throws.
std::string missing_reason(const std::string& path);

// The first symbolic link to nothing (or loop of links) on `path` or one of its parent
// folders, as "'L' is a symbolic link to nothing (it points to 'T', ...); fix or remove the
// link, and" (missing_reason's clause after the quoted link); "" when there is none. For a
// folder about to be created: mkdir through such a link fails with EEXIST ("File exists"),
// which names neither the link nor the fix. Never throws.
std::string broken_link_on(const std::string& path);

namespace detail {
// A number as a user types it, for a message: the shortest text that reads back as `v`, in
// plain digits when that takes at most 12 characters (31536001, 0.0000001, 1000000: not the
// stream's 3.1536e+07, which looks equal to a bound of 31536000: trials 59 and 60), else with
// a plain exponent when that takes at most 8 (2e18, 1.5e300, 2.5e-20), else in plain digits
// up to 20 characters (9007199254740992, 604800.0000000001), else with an exponent and every
// digit it needs: never rounded, so a value past a bound never prints as the bound (trial 61).
// inf, -inf and nan as such.
std::string number_text(double v);

// Collects the streamed context, throws on destruction (the macro's temporary ends at
// the end of the full expression). Destructor is noexcept(false) on purpose.
template <class E>
class CheckFailure {
 public:
  CheckFailure(const char* expr, const char* func, const char* file, int line, bool user)
      : user_(user) {
    if (!user) os_ << "check failed: " << expr << " (" << func << " at " << file << ":" << line << ") ";
  }
  template <class T>
  CheckFailure& operator<<(const T& v) {
    if constexpr (std::is_floating_point_v<T>) {
      os_ << number_text((double)v);
    } else {
      os_ << v;
    }
    return *this;
  }
  ~CheckFailure() noexcept(false) { throw E(os_.str()); }

 private:
  std::ostringstream os_;
  bool user_;
};
}  // namespace detail
}  // namespace troupe

#define TROUPE_CHECK(cond)                                                                   \
  if (__builtin_expect(!!(cond), 1)) {                                                        \
  } else                                                                                      \
    ::troupe::detail::CheckFailure<::troupe::Error>(#cond, __func__, __FILE__, __LINE__, false)

#define TROUPE_USER_CHECK(cond)                                                              \
  if (__builtin_expect(!!(cond), 1)) {                                                        \
  } else                                                                                      \
    ::troupe::detail::CheckFailure<::troupe::UserError>(#cond, __func__, __FILE__, __LINE__, true)

#define TROUPE_FAIL() ::troupe::detail::CheckFailure<::troupe::Error>("fail", __func__, __FILE__, __LINE__, false)
#define TROUPE_USER_FAIL() ::troupe::detail::CheckFailure<::troupe::UserError>("", __func__, __FILE__, __LINE__, true)
