// datasets/cache_folder.cpp — see cache_folder.h.
#include "datasets/cache_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>
#include <utility>
#include <cerrno>

#include <fmt/format.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/file_lock.h"
#include "core/text.h"

namespace troupe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMade = "/.made";

fs::path absolute_normal(const fs::path& p) {
  std::error_code ec;
  const fs::path a = fs::absolute(p, ec);
  return (ec ? p : a).lexically_normal();
}

// Whether `root` is `p` or a folder above it (both absolute and normal).
bool at_or_above(const fs::path& root, const fs::path& p) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end() && !r->empty(); ++r, ++q)
    if (q == p.end() || *r != *q) return false;
  return true;
}

// Removes `from` and the folders above it, up to `root`, while each is empty (rmdir(2) only
// removes an empty folder). Nothing when `root` is not `from` or above it.
void rmdir_up(const fs::path& from, const fs::path& root) {
  if (root.empty() || !at_or_above(root, from)) return;
  for (fs::path q = from;; q = q.parent_path()) {
    if (::rmdir(q.c_str()) != 0 && errno != ENOENT) return;  // not empty: in use, or it holds more
    if (q == root || q == q.parent_path()) return;
  }
}

// The folders recorded in <dir>/.made (absolute).
std::vector<fs::path> read_made(const std::string& dir) {
  std::vector<fs::path> roots;
  std::ifstream in(dir + kMade);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '/') roots.push_back(fs::path(line).lexically_normal());
  return roots;
}

// "; it is stopped (...)" when process `pid` is suspended (Ctrl-Z, SIGSTOP), else "".
std::string stopped_note(long pid) {
  if (pid <= 0) return "";
  const std::string p = std::to_string(pid);
  std::ifstream stat("/proc/" + p + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  const bool stopped = close != std::string::npos && close + 2 < text.size() &&
                       (text[close + 2] == 'T' || text[close + 2] == 't');
  return stopped ? "; it is stopped (Ctrl-Z or SIGSTOP): resume it (fg, or kill -CONT " + p + ") or end it" : "";
}

// Who holds a cache folder's .lock (troupe writes its pid there), for "waiting for <who>
// preparing DIR<state>": {"pid P", "; it is stopped (...)" when it is suspended, else ""};
// a holder that wrote no pid is not troupe: every process holding it, by its command
// (core/file_lock.h foreign_lock_holders), "process A (flock), process B (sleep), not
// troupe,"; {"another process", ""} when none is found.
std::pair<std::string, std::string> lock_holder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
  if (pid > 0) return {"pid " + std::to_string(pid), stopped_note(pid)};
  const std::string named = foreign_lock_holders(fd);
  if (named.empty()) return {"another process", ""};
  return {named + ", not troupe,", stopped_note(flock_holder_pid(fd))};
}

}  // namespace

bool is_prepared_cache(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::exists(d / cache_files::kMeta, ec)) return false;
  for (const std::string& f : {std::string(cache_files::kTokenizer), std::string("corpus") + cache_files::kTrainBin,
                              std::string("corpus") + cache_files::kTrainIdx})
    if (fs::exists(d / f, ec)) return true;
  return false;
}

std::string prepared_cache_around(const std::string& path) {
  for (fs::path q(path); !q.empty(); q = q.parent_path()) {
    if (is_prepared_cache(q.string())) return q.string();
    if (q == q.parent_path()) break;
  }
  return "";
}

std::string link_in_cache(const std::string& path) {
  std::error_code ec;
  const std::string target = fs::read_symlink(path, ec).string();
  return "'" + path + "' is a symbolic link" + (ec ? std::string() : " (to '" + target + "')") +
         ": troupe writes its own files in the data cache and does not write through a link; remove it (rm '" + path +
         "') and run again (data.cache_dir)";
}

std::string make_cache_folder(const std::string& dir) {
  const fs::path want = absolute_normal(dir);
  std::error_code ec;
  fs::path made;  // the outermost folder that is missing
  for (fs::path q = want; !q.empty() && !fs::exists(fs::symlink_status(q, ec)) && q != q.parent_path();
       q = q.parent_path())
    made = q;
  const std::string link = broken_link_on(dir);
  TROUPE_USER_CHECK(link.empty()) << "cannot create the data cache folder '" << dir << "': " << link
                                  << " try again, or set data.cache_dir to another folder";
  fs::create_directories(want, ec);
  TROUPE_USER_CHECK(!ec && fs::is_directory(want))
      << "cannot create the data cache folder '" << dir << "': " << ec.message() << "; " << path_error_fix(ec.value())
      << " (data.cache_dir)";
  if (!made.empty()) {  // for whichever process builds: it removes this folder too if the build is stopped
    const std::string line = made.string() + "\n";
    const int fd = ::open((want.string() + kMade).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) {
      (void)!::write(fd, line.data(), line.size());
      ::close(fd);
    }
  }
  return made.string();
}

CacheLock::CacheLock(const std::string& dir, const DataLogFn& log, double timeout_s) : path_(dir + "/.lock") {
  const auto start = std::chrono::steady_clock::now();
  auto next_note = start + std::chrono::minutes(1);
  for (bool said = false;;) {
    fd_ = ::open(path_.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0644);  // its pid goes in: not through a link
    const int err = errno;
    TROUPE_USER_CHECK(fd_ >= 0 || err != ELOOP) << link_in_cache(path_);
    // (make_cache_folder made the folder: only another process removes it)
    if (fd_ < 0 && err == ENOENT)
      throw CacheFolderRemoved("the data cache folder " + dir + " was removed while this process waited to prepare "
                               "it: the process preparing it ended without finishing it (its own output says why: a "
                               "refusal, a failure or a stop); run the command again to prepare it, after fixing what "
                               "that process reported");
    TROUPE_USER_CHECK(fd_ >= 0) << "cannot create '" << path_ << "': " << std::strerror(err) << "; "
                                << path_error_fix(err) << " (data.cache_dir)";
    bool locked = false;
    try {
      locked = try_lock_exclusive(fd_, path_, "data.cache_dir");
    } catch (...) {  // a filesystem without locks (ENOLCK): nobody can hold this .lock, so it goes
      ::close(fd_);
      ::unlink(path_.c_str());
      throw;
    }
    if (!locked) {
      if (log && !said) {
        const auto [who, state] = lock_holder(fd_);
        log("waiting for " + who + " preparing " + dir + state);
      }
      said = true;
      // a long deadline (data.lock_timeout_s, a day by default): preparing tens of GB takes
      // hours; a stop signal ends the wait at once, changing nothing
      const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(timeout_s));
      while (!try_lock_exclusive(fd_, path_, "data.cache_dir")) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (std::chrono::steady_clock::now() >= deadline) {
          const auto [who, state] = lock_holder(fd_);
          ::close(fd_);
          fd_ = -1;
          throw UserError("waited " + fmt::format("{}", timeout_s) + " s (data.lock_timeout_s) for " + who +
                          " preparing the data cache " + dir + state + ", and it still holds " + path_ +
                          "; check that process (it may be stuck, or not troupe), or raise data.lock_timeout_s");
        }
        if (const auto now = std::chrono::steady_clock::now(); log && now >= next_note) {
          const auto minutes = std::chrono::duration_cast<std::chrono::minutes>(now - start).count();
          const auto [who, state] = lock_holder(fd_);
          log("still waiting (" + std::to_string(minutes) + " min) for " + who + " preparing " + dir + state);
          next_note += std::chrono::minutes(1);
        }
      }
    }
    struct stat held {}, now {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";  // for the next waiter's message
      if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
      return;
    }
    ::close(fd_);  // the holder before removed it: lock the file that is there now
    fd_ = -1;
  }
}

CacheLock::~CacheLock() {
  ::unlink(path_.c_str());
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

namespace {
// Whether `name` is a file a preparation writes in its folder (datasets/prepare.cpp): its
// records, a source's token files and scratch, and their temporaries (NAME.tmp...).
bool preparation_file(const std::string& name) {
  const size_t tmp = name.find(".tmp");
  const std::string base = name.substr(0, tmp);
  const auto ends_with = [&](const char* ext) {
    return base.size() > std::strlen(ext) && base.compare(base.size() - std::strlen(ext), std::string::npos, ext) == 0;
  };
  for (const char* f : cache_files::kFolderFiles)
    if (base == f) return true;
  for (const char* ext : cache_files::kSourceSuffixes)
    if (ends_with(ext)) return true;
  if (tmp != std::string::npos)  // a temporary of a record or token file (older layouts' names too)
    for (const char* ext : {".bin", ".idx", ".json", ".jsonl", ".model", ".scratch"})
      if (ends_with(ext)) return true;
  return false;
}
}  // namespace

void remove_litter(const std::string& dir, const DataLogFn& log) {
  std::error_code ec;
  fs::remove(dir + "/" + cache_files::kMeta, ec);  // uncommit first: a crash below leaves no valid cache
  std::vector<fs::path> old;
  std::string kept;  // what a preparation never writes (a user's files, a run put here): not ours to delete
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == ".lock" || name == ".made") continue;
    if (preparation_file(name) && !it->is_directory(ec)) old.push_back(it->path());
    else kept += (kept.empty() ? "" : ", ") + name;
  }
  std::string left;
  for (const auto& f : old)
    if (std::error_code rm; fs::remove(f, rm) && !rm) left += (left.empty() ? "" : ", ") + f.filename().string();
  if (!left.empty() && log) log("data: removed " + left + " (left by an interrupted or outdated preparation) in " + dir);
  if (!kept.empty() && log) log("data: kept " + kept + " in " + dir + " (not a preparation's files; move them out of the data cache)");
}

bool remove_stopped(const std::string& dir_text, const std::string& made_here) {
  const fs::path dir = absolute_normal(dir_text);
  std::vector<fs::path> roots = read_made(dir.string());  // before the folder goes
  if (!made_here.empty()) roots.push_back(fs::path(made_here));
  std::error_code ec;
  // a folder holding files a preparation never writes (put there by hand) is not removed
  // whole: only the preparation's own files go, and the rest stays where it is
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == ".lock" || name == ".made" || (preparation_file(name) && !it->is_directory(ec))) continue;
    bool left = false;  // a preparation's file still there (one the preparing thread made meanwhile)
    for (int round = 0; round < 3; ++round) {
      std::vector<fs::path> ours;
      for (fs::directory_iterator jt(dir, ec); !ec && jt != end; jt.increment(ec)) {
        const std::string n2 = jt->path().filename().string();
        if (n2 == ".made" || (preparation_file(n2) && !jt->is_directory(ec))) ours.push_back(jt->path());
      }
      for (const auto& f : ours) fs::remove(f, ec);
      left = !ours.empty();
      if (!left) break;
    }
    return !left;
  }
  ec.clear();
  bool clean = false;
  const fs::path trash = dir.parent_path() / (".troupe-stopped-" + std::to_string(::getpid()) + "-" +
                                              dir.filename().string());
  if (fs::rename(dir, trash, ec); !ec) {
    fs::remove_all(trash, ec);
    clean = !fs::exists(fs::symlink_status(trash, ec)) && !fs::exists(fs::symlink_status(dir, ec));
  } else {
    for (int round = 0; round < 3; ++round) {  // a file the writer created meanwhile: another round
      std::vector<fs::path> made;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) made.push_back(it->path());
      for (const auto& f : made) fs::remove_all(f, ec);
      if (made.empty()) break;
    }
    clean = fs::is_empty(dir, ec) || ec;
    ::rmdir(dir.c_str());
  }
  // the folders above, made for this preparation by this process or one waiting for it: the
  // outermost last (the longest path first), each only when empty
  std::sort(roots.begin(), roots.end(), [](const fs::path& a, const fs::path& b) { return a.string().size() > b.string().size(); });
  for (const fs::path& root : roots) rmdir_up(dir.parent_path(), root);
  return clean;
}

void remove_made_if_empty(const std::string& dir_text, const std::string& made_here) {
  if (made_here.empty()) return;
  const fs::path dir = absolute_normal(dir_text);
  // holding only .made (no .lock: nobody prepares or waits here any more): this process's
  // line in it is what keeps the folder from being empty
  std::error_code ec;
  bool only_made = true, any = false;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    any = true, only_made = only_made && it->path().filename() == ".made";
  if (!ec && any && only_made) fs::remove(dir / ".made", ec);
  rmdir_up(dir, fs::path(made_here));
}

void forget_made(const std::string& dir) {
  std::error_code ec;
  fs::remove(dir + kMade, ec);
}

}  // namespace troupe
