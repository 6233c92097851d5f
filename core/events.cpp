#include "core/events.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

namespace troupe {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {
// Whether `path` may take events: a new or empty file, or a regular file whose first line
// is an event. TROUPE_EVENT_LOG left pointing at another file (a config, a log) would
// otherwise get JSON appended to it; such a path is ignored, with one warning.
bool event_log_usable(const char* path) {
  // a run's own records (metrics.jsonl, train.log, config.toml, .lock), or a file inside a
  // snapshot (a folder holding manifest.capnp) or a prepared data cache (meta.json beside
  // tokenizer.model: datasets/cache_folder.h is_prepared_cache): events
  // would be mixed into them, or change what a snapshot's or a cache's checks read (trial 55)
  std::error_code ec;  // (never throws: a removed working folder leaves the path as given)
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) p = path;
  std::string inside;
  for (const char* record : {"metrics.jsonl", "train.log", "config.toml", ".lock"})
    if (p.filename() == record) inside = "a run's own record";
  for (std::filesystem::path q = p.parent_path(); inside.empty() && !q.empty(); q = q.parent_path()) {
    if (std::filesystem::exists(q / "manifest.capnp", ec)) inside = "inside the snapshot " + q.string();
    if (std::filesystem::exists(q / "meta.json", ec) &&
        (std::filesystem::exists(q / "tokenizer.model", ec) || std::filesystem::exists(q / "corpus.train.bin", ec)))
      inside = "inside the data cache " + q.string();
    if (q == q.parent_path()) break;
  }
  if (!inside.empty()) {
    std::fprintf(stderr,
                 "warning: TROUPE_EVENT_LOG=%s is %s; no events are written (point TROUPE_EVENT_LOG at a new file "
                 "outside runs' folders)\n",
                 path, inside.c_str());
    return false;
  }
  struct stat st {};
  if (::stat(path, &st) != 0) return true;  // (not there yet: created on the first event)
  if (!S_ISREG(st.st_mode)) {                // a folder, /dev/full, a FIFO: ignored, said once
    std::fprintf(stderr,
                 "warning: TROUPE_EVENT_LOG=%s is not a regular file (a folder, a device or a FIFO); no events are "
                 "written (point TROUPE_EVENT_LOG at a new file)\n",
                 path);
    return false;
  }
  if (st.st_size == 0) return true;
  std::FILE* f = std::fopen(path, "rb");
  if (!f) return false;
  char buf[4096];
  const size_t n = std::fread(buf, 1, sizeof buf, f);
  std::fclose(f);
  std::string first(buf, n);
  first = first.substr(0, first.find('\n'));
  const nlohmann::json j = nlohmann::json::parse(first, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("event")) return true;
  std::fprintf(stderr,
               "warning: TROUPE_EVENT_LOG=%s is a file that does not hold troupe events; no events are written to "
               "it (point TROUPE_EVENT_LOG at a new file)\n",
               path);
  return false;
}
}  // namespace

namespace {
// Whether the TROUPE_EVENT_LOG `path` takes events: event_log_usable, once per process.
bool usable_once(const char* path) {
  static std::once_flag checked;
  static bool usable = false;
  std::call_once(checked, [&] { usable = event_log_usable(path); });
  return usable;
}
}  // namespace

bool event_log_refused() {
  const char* path = std::getenv("TROUPE_EVENT_LOG");
  return path && *path && !usable_once(path);
}

void log_event(const std::string& name, nlohmann::json fields) {
  const char* path = std::getenv("TROUPE_EVENT_LOG");
  if (!path || !*path) return;
  if (!usable_once(path)) return;
  fields["event"] = name;
  fields["t"] = unix_seconds();
  fields["pid"] = (int)::getpid();
  const std::string line = fields.dump() + "\n";
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {  // a benchmark aid: never a reason to fail the job, but said once
    static std::once_flag said;
    const int err = errno;
    std::call_once(said, [&] {
      std::fprintf(stderr, "warning: cannot open TROUPE_EVENT_LOG=%s (%s); no events are written\n", path,
                   std::strerror(err));
    });
    return;
  }
  const ssize_t w = ::write(fd, line.data(), line.size());
  const int err = errno;
  ::close(fd);
  if (w != (ssize_t)line.size()) {  // a full disk, a file-size limit: said once, the job goes on
    static std::once_flag said;
    std::call_once(said, [&] {
      std::fprintf(stderr, "warning: cannot write to TROUPE_EVENT_LOG=%s (%s); events from here on are lost\n", path,
                   w < 0 ? std::strerror(err) : "a short write: its filesystem is full");
    });
  }
}

}  // namespace troupe
