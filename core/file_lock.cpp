// core/file_lock.cpp — see file_lock.h.
#include "core/file_lock.h"

#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/text.h"

namespace troupe {

bool try_lock_exclusive(int fd, const std::string& path, const std::string& folder_key) {
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EWOULDBLOCK) return false;
    const std::string shown = printable(path, false, 400);
    if (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP)
      throw UserError("cannot lock '" + shown + "' (" + std::strerror(err) + "): the filesystem it lies on does "
                      "not support file locks (an NFS mount without lockd?), so processes sharing the folder could "
                      "not take turns; put " + folder_key + " on a local disk or a filesystem with locking");
    throw UserError("cannot lock '" + shown + "' (" + std::strerror(err) + "); " + path_error_fix(err) + " (" +
                    folder_key + ")");
  }
}

long flock_holder_pid(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  std::FILE* f = std::fopen("/proc/locks", "re");
  if (!f) return 0;
  // "1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF" (device as hex major:minor); a
  // waiter's line starts "1: -> FLOCK ..." and is skipped
  char line[512];
  long found = 0;
  while (found == 0 && std::fgets(line, sizeof line, f)) {
    char type[16] = {}, mode[16] = {}, access[16] = {};
    long pid = 0;
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    if (std::sscanf(line, "%*d: %15s %15s %15s %ld %x:%x:%llu", type, mode, access, &pid, &maj, &min, &ino) != 7)
      continue;
    if (std::strcmp(type, "FLOCK") == 0 && ino == (unsigned long long)st.st_ino && maj == major(st.st_dev) &&
        min == minor(st.st_dev) && pid > 0)
      found = pid;
  }
  std::fclose(f);
  // /proc/locks names the process that took the lock; after it exits, a child that inherited
  // the descriptor holds it (flock(1) running a command): the first other process with the
  // file open is named instead
  if (found > 0 && ::access(("/proc/" + std::to_string(found)).c_str(), F_OK) == 0) return found;
  const auto openers = processes_with_file_open(fd, 1);
  return openers.empty() ? found : openers[0];
}

std::vector<long> processes_with_file_open(int fd, size_t max) {
  std::vector<long> out;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return out;
  const long self = (long)::getpid();
  DIR* procs = ::opendir("/proc");
  if (!procs) return out;
  while (out.size() < max) {
    const dirent* p = ::readdir(procs);
    if (!p) break;
    char* end = nullptr;
    const long pid = std::strtol(p->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == self) continue;
    const std::string fds = std::string("/proc/") + p->d_name + "/fd";
    DIR* d = ::opendir(fds.c_str());
    if (!d) continue;
    while (const dirent* e = ::readdir(d)) {
      struct stat fst {};
      if (e->d_name[0] != '.' && ::stat((fds + "/" + e->d_name).c_str(), &fst) == 0 && fst.st_ino == st.st_ino &&
          fst.st_dev == st.st_dev) {
        out.push_back(pid);
        break;
      }
    }
    ::closedir(d);
  }
  ::closedir(procs);
  return out;
}

std::string process_command(long pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/comm").c_str(), "re");
  if (!f) return "?";
  char buf[80] = {};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string c = ok ? buf : "";
  while (!c.empty() && c.back() == '\n') c.pop_back();
  return c.empty() ? "?" : printable(c, false, 64);
}

std::string foreign_lock_holders(int fd, std::string* pids) {
  const long first = flock_holder_pid(fd);
  if (first <= 0) return "";
  // every process with the file open: flock(1) and the command it runs both hold the lock
  std::vector<long> holders = processes_with_file_open(fd);
  if (std::find(holders.begin(), holders.end(), first) == holders.end()) holders.insert(holders.begin(), first);
  std::string named;
  for (long h : holders) {
    named += (named.empty() ? "" : ", ") + ("process " + std::to_string(h) + " (" + process_command(h) + ")");
    if (pids) *pids += " " + std::to_string(h);
  }
  return named;
}

}  // namespace troupe
