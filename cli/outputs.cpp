// cli/outputs.cpp — the files a command writes (common.h): each output path checked before
// anything is written (a folder that takes new files, room for it, not a link, a device or
// another output's path), and written beside itself, then renamed.
#include <climits>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/disk.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_name.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/paths.h"
#include "core/text.h"
#include "core/toml_text.h"
#include "datasets/cache_folder.h"

namespace fs = std::filesystem;

namespace troupe::cli {

void refuse_same_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::error_code ec;
  for (size_t i = 0; i < outputs.size(); ++i)
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      const auto& [a, fa] = outputs[i];
      const auto& [b, fb] = outputs[j];
      if (a.empty() || b.empty() || a == "-" || b == "-") continue;
      TROUPE_USER_CHECK(resolved_path(a) != resolved_path(b))
          << fa << " and " << fb << " are the same path (" << a << "): one would overwrite the other; pass two paths";
    }
}

namespace {
// Whether the regular file at `path` is a troupe config: TOML (at most 1 MiB) with a [model],
// [train], [data], [parallel] or [checkpoint] table. Never throws.
bool troupe_config_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > (1u << 20) || ec) return false;
  try {
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    check_toml_nesting(text, "file");  // (deep nesting overflows toml++'s recursion)
    const toml::table t = toml::parse(text);
    for (const char* k : {"model", "train", "data", "parallel", "checkpoint"})
      if (t[k].is_table()) return true;
  } catch (...) {
  }
  return false;
}
}  // namespace

void refuse_overwriting(const std::string& out, const std::string& option, const std::vector<std::string>& files,
                        const std::vector<std::string>& dirs, const std::string& own_run) {
  if (out.empty() || out == "-") return;
  std::error_code ec;
  const fs::path o = resolved_path(out);
  for (const std::string& f : files)
    if (!f.empty() && resolved_path(f) == o)
      TROUPE_USER_FAIL() << option << " " << out << " is "
                         << (f == out ? std::string("a file this command reads or writes")
                                      : f + ", which this command reads or writes")
                         << ": writing it would destroy it; pass another path";
  for (const std::string& d : dirs) {
    if (d.empty()) continue;
    const std::string root = resolved_path(d).string();
    if (o.string() == root)  // (a data source that is a file: trial 64, F5)
      TROUPE_USER_FAIL() << option << " " << out << " is "
                         << (d == out ? std::string(fs::is_directory(o, ec) ? "a folder" : "a file")
                                      : d + (fs::is_directory(o, ec) ? ", a folder" : ", a file"))
                         << " this command reads or writes: writing it would destroy it; pass another path";
    if (o.string().rfind(root + "/", 0) == 0)
      TROUPE_USER_FAIL() << option << " " << out << " lies inside " << d
                         << ", which this command reads or writes: writing there would damage it; pass a path outside";
  }
  refuse_inside_snapshot(out, option);
  // a troupe run's records (its folder holds metrics.jsonl): plot, calibrate and --resume read them
  const std::string name = o.filename().string();
  // (trace.json: the measured trace plan --calibrate reads; trial 62, M6)
  if ((name == "config.toml" || name == "metrics.jsonl" || name == "train.log" || name == "trace.json") &&
      fs::exists(o.parent_path() / "metrics.jsonl", ec) && (own_run.empty() || resolved_path(own_run) != o.parent_path()))
    TROUPE_USER_FAIL() << option << " " << out << " is the " << name << " of the troupe run " << o.parent_path().string()
                       << ": writing it would destroy that run's record (plot, calibrate and --resume read it); pass "
                          "another path";
  // a lock file (a run's, its checkpoints folder's, a cache's): replaced, it no longer keeps a
  // second run out of the folder (trial 54)
  TROUPE_USER_CHECK(!(o.filename() == ".lock" && fs::exists(fs::symlink_status(o, ec))))
      << option << " " << out << " is a troupe lock file: replacing it would let a second run into the folder it "
      << "guards; pass another path";
  // a prepared data cache (hours of work for a large blend): no output lands inside one (trial 52)
  if (const std::string cache = prepared_cache_around(o.parent_path().string()); !cache.empty())
    TROUPE_USER_FAIL() << option << " " << out << " lies inside the data cache " << cache
                       << " (prepared token files that train reads): writing there would damage it; pass a path "
                          "outside";
  // a snapshot's name in a folder of snapshots (checkpoints/step-00000010): that run's
  // --resume latest would stop at it as "a file, not a snapshot folder" (trial 53, F2)
  const std::string leaf = o.filename().string();
  const fs::path folder = o.parent_path();
  auto holds_snapshots = [](const fs::path& f) {  // (a folder that cannot be listed: the write's own check says why)
    try {
      return !list_snapshots(f.string()).empty();
    } catch (const std::exception&) {
      return false;
    }
  };
  TROUPE_USER_CHECK(!((snapshot_name_step(leaf) >= 1 || set_aside_name(leaf)) &&
                      (folder.filename() == "checkpoints" || holds_snapshots(folder))))
      << option << " " << out << " takes a snapshot's name in the folder of snapshots " << folder.string()
      << ": the run that saves there would find it in its way; pass another name or folder";
  // a config (configs/tiny.toml): an output never replaces one (trial 50, M5)
  TROUPE_USER_CHECK(!troupe_config_file(o))
      << option << " " << out << " is a troupe config (it has a [model], [train] or [data] table): writing it would "
      << "destroy it; pass another path";
}

namespace {
// Removes `path`.tmp-<pid> files whose writer (process pid) is gone — a troupe command killed
// (SIGKILL) while it wrote `path` — naming each on standard error; a live writer's file stays.
void remove_dead_writers_files(const fs::path& abs) {
  std::error_code ec;
  const std::string stem = abs.filename().string() + ".tmp-";
  for (fs::directory_iterator it(abs.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= stem.size() || name.compare(0, stem.size(), stem) != 0) continue;
    const std::string pid = name.substr(stem.size());
    if (pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill((pid_t)std::stol(pid), 0) == 0 || errno != ESRCH || !it->is_regular_file(ec)) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm))
      std::fprintf(stderr, "note: removed %s, left by a troupe command (process %s) that was killed while it wrote %s\n",
                   it->path().c_str(), pid.c_str(), abs.c_str());
  }
}
// A file name to suggest inside a folder given where `option` wants a file: the kind of
// file the option writes (plot --out and the --png options draw PNG pictures).
std::string example_file_name(const std::string& option) {
  if (option == "--out" || option.find("png") != std::string::npos) return "out.png";
  if (option == "--trace" || option == "--logits-out" || option == "--report") return "out.json";
  if (option == "--dump") return "schedule.csv";
  if (option == "output") return "model.safetensors";
  return "out";
}

// The kind of file `option` writes, and whether `head` (an existing file's first bytes) is
// one: a PNG picture, a JSON document, a schedule (comment or action rows), a safetensors
// file (8-byte header length, then its JSON); "" for an option not listed.
std::string kind_written(const std::string& option, std::string_view head, bool* same) {
  const size_t first = head.find_first_not_of(" \t\r\n");
  const char c = first == std::string_view::npos ? '\0' : head[first];
  if (option == "--out" || option.find("png") != std::string::npos) {
    *same = head.rfind("\x89PNG", 0) == 0;
    return "PNG picture";
  }
  if (option == "--trace" || option == "--logits-out" || option == "--report") {
    // one JSON document, not JSON lines (trial 64, F1: a .jsonl corpus was replaced): a first
    // line that is a whole value with more lines after it is JSON lines
    const size_t nl = head.find('\n');
    const bool more = nl != std::string_view::npos && head.find_first_not_of(" \t\r\n", nl) != std::string_view::npos;
    const bool lines = more && nlohmann::json::accept(head.substr(0, nl));
    *same = (c == '{' || c == '[') && !lines;
    return lines ? "JSON file (it holds JSON lines)" : "JSON file";
  }
  if (option == "--dump") {  // a comment, or a row of actions: F0,B0,W0,F1c1 ...
    const std::string_view line = first == std::string_view::npos ? "" : head.substr(first, head.find('\n', first) - first);
    *same = c == '#' || ((c == 'F' || c == 'B' || c == 'W') && line.size() > 1 && std::isdigit((unsigned char)line[1]) &&
                         line.find_first_not_of("FBWc0123456789, \t\r") == std::string_view::npos);
    return "schedule file";
  }
  if (option == "output") {
    *same = head.size() > 8 && head[8] == '{';
    return "safetensors file";
  }
  return "";
}

// An existing file that is not of the kind `option` writes is not replaced: a corpus, a
// config or a source file under an output's name (fresh-user check 5: generate
// --logits-out over the training corpus, simulate --dump over data/sotu.txt, exit 0).
void refuse_other_kind(const fs::path& abs, const std::string& path, const std::string& option) {
  std::error_code ec;
  if (!fs::is_regular_file(abs, ec) || fs::file_size(abs, ec) == 0) return;
  std::string head(1 << 20, '\0');  // (a JSON file's first line, whole while under 1 MiB)
  {
    std::ifstream in(abs, std::ios::binary);
    if (!in) return;  // (unreadable: the write itself is checked below)
    in.read(head.data(), (std::streamsize)head.size());
    head.resize((size_t)std::max<std::streamsize>(0, in.gcount()));
  }
  bool same = true;
  const std::string kind = kind_written(option, head, &same);
  TROUPE_USER_CHECK(kind.empty() || same)
      << option << " " << path << " exists and is not a " << kind << " (it begins '"
      << printable(head.substr(0, 24), false) << "'): troupe replaces only a file of the kind it writes, so that no "
      << "other file is lost; pass another path, or remove that file first";
}
}  // namespace

void check_output_file(const std::string& path, const std::string& option, uint64_t bytes) {
  TROUPE_USER_CHECK(!path.empty()) << option << " is empty; pass a file path";
  // '-' means standard output only where an option says so (simulate --dump): elsewhere it
  // would be a file named '-' in the current folder, which nobody asking for '-' meant
  TROUPE_USER_CHECK(path != "-") << option << " - : this option writes a file, not standard output; pass a file path "
                                 << "(./- for a file named '-')";
  TROUPE_USER_CHECK(path.back() != '/') << option << " " << path << " ends with '/', so it names a folder; pass a file "
                                        << "path, e.g. " << path << example_file_name(option);
  check_cwd_exists(path, option);
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  // outputs are written to a temporary file renamed over the path: that would replace a
  // link (say /dev/stdout) instead of writing where it points
  if (fs::is_symlink(abs, ec)) {
    // the end of the chain, not the next link (/dev/stdout -> /proc/self/fd/1 -> /dev/pts/0)
    fs::path target = abs;  // followed hop by hop (a dangling link's target, a pipe's "pipe:[N]" included)
    // a process's open file (/dev/stdout -> /proc/self/fd/1): a stream, whatever it leads to
    // (trial 63, F1: "pipe:[N]" was called the link's missing target, with "rm /dev/stdout")
    const auto open_file_link = [](const fs::path& p) {
      const std::string t = p.lexically_normal().string();
      const auto digits_after = [&](const std::string& head) {
        return t.rfind(head, 0) == 0 && t.size() > head.size() &&
               t.find_first_not_of("0123456789", head.size()) == std::string::npos;
      };
      if (digits_after("/dev/fd/") || digits_after("/proc/self/fd/") || digits_after("/proc/thread-self/fd/")) return true;
      const size_t fd = t.find("/fd/");
      return t.rfind("/proc/", 0) == 0 && fd != std::string::npos &&
             t.find_first_not_of("0123456789", 6) == fd && digits_after(t.substr(0, fd + 4));
    };
    bool stream = open_file_link(abs);
    for (int hop = 0; hop < 40 && fs::is_symlink(target, ec); ++hop) {
      const fs::path next = fs::read_symlink(target, ec);
      if (ec) break;
      target = next.is_absolute() ? next : target.parent_path() / next;
      stream = stream || open_file_link(target);
    }
    TROUPE_USER_CHECK(!stream) << option << " " << path << " leads to a stream a process has open (standard output "
                               << "or error, or another open file), not to a file: troupe writes an output beside its "
                               << "path and renames it over the path; pass a file path"
                               << (option == "--dump" ? " (or --dump - to print the schedule)" : "");
    // a chain that never ends (a -> b -> a) is a loop: said as one, naming the link's own target
    TROUPE_USER_CHECK(!fs::is_symlink(target, ec))
        << option << " " << path << " is a symbolic link (to " << fs::read_symlink(abs, ec).string()
        << ") in a loop of links (Too many levels of symbolic links): it leads to no file; remove it (rm " << path
        << ") or pass another path";
    // a link to a folder: the file goes inside it (trial 63, F6: it was called a device)
    TROUPE_USER_CHECK(!fs::is_directory(target, ec))
        << option << " " << path << " is a symbolic link to the folder " << target.string() << "; pass a file path, "
        << "e.g. " << (target / example_file_name(option)).string();
    const bool regular = fs::is_regular_file(target, ec);
    const bool dangling = !fs::exists(fs::symlink_status(target, ec)) || !fs::exists(target, ec);
    // an output is written beside its path and renamed over it: that would replace the link,
    // not write where it points (trial 57, F4: a dangling link was told about devices)
    TROUPE_USER_FAIL() << option << " " << path << " is a symbolic link (to " << target.string() << "); "
                       << (regular || dangling
                               ? std::string("troupe writes an output beside its path and renames it over the path, "
                                             "which would replace the link: pass ") +
                                     (!dangling ? std::string("that path")
                                      : fs::is_directory(target.parent_path(), ec)
                                          ? std::string("the link's target (it does not exist yet)")
                                          // (its folder is missing too: trial 58, F5)
                                          : "the link's target once its folder exists (mkdir -p " +
                                                target.parent_path().string() + ")") +
                                     ", another file, or remove the link (rm " + path + ")"
                               : "troupe writes its outputs to files (written beside them, then renamed), not to "
                                 "terminals, pipes or devices: pass a file path");
  }
  TROUPE_USER_CHECK(!fs::is_directory(abs, ec)) << option << " " << path << " is a directory; pass a file path, e.g. "
                                                << (abs / example_file_name(option)).string();
  refuse_other_kind(abs, path, option);
  // file systems take names of at most 255 bytes, and the temporary file beside the output
  // adds ".tmp-<pid>" to its name
  const size_t name_bytes = abs.filename().string().size();
  TROUPE_USER_CHECK(name_bytes <= 235) << option << ": the file name of " << path.substr(0, 60) << "... is " << name_bytes
                                       << " bytes long; file systems take at most 255 and troupe writes NAME.tmp-<pid> "
                                       << "beside it first: use a name of at most 235 bytes";
  const fs::path dir = abs.parent_path();
  // (a folder past PATH_MAX exists but cannot be reached by its path: stat says ENAMETOOLONG)
  TROUPE_USER_CHECK(abs.string().size() + 16 < PATH_MAX)
      << "cannot write " << path.substr(0, 60) << "...: the path is " << abs.string().size()
      << " bytes long, too long for the system (File name too long: a path has at most " << PATH_MAX - 1
      << " bytes, and troupe writes NAME.tmp-<pid> beside it first); pass a shorter " << option << " path";
  TROUPE_USER_CHECK(fs::is_directory(dir, ec))
      << "cannot write " << path << ": " << dir.string() << " "
      << (fs::exists(dir, ec) ? "is a file, not a folder; pass an output path inside a folder (another "
                              : std::string(missing_reason(dir.string())) + " create that folder or pass another ")
      << option << " path" << (fs::exists(dir, ec) ? ")" : "");
  // really try (root passes access() everywhere): a probe file beside it, removed at once
  const std::string probe = (dir / (".troupe-probe-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const int err = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
  // (ENOENT in a folder that exists: /proc, /sys take no new files, and troupe writes a file beside the output first)
  TROUPE_USER_CHECK(fd >= 0 || err == EEXIST)
      << "cannot write " << path << ": the folder " << dir.string() << " takes no new file ("
      << (err == ENOENT ? "a virtual filesystem such as /proc or /sys" : std::strerror(err))
      << "; troupe writes the output beside it first, then renames it); pass a writable " << option << " path";
  TROUPE_USER_CHECK(!fs::exists(abs, ec) || fs::is_regular_file(abs, ec))
      << option << " " << path << " exists and is not a regular file; pass another path";
  remove_dead_writers_files(abs);  // (before the free space is counted: they hold some)
  const uint64_t free = free_space(dir.string());
  TROUPE_USER_CHECK(free >= bytes) << "cannot write " << path << ": it needs about " << size_text(bytes)
                                   << " but its filesystem has " << size_text(free)
                                   << " free; free space there or pass another " << option << " path";
}

void write_output_file(const std::string& path, const std::string& text, const std::string& option) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  note_partial_file(tmp);  // a stop signal meanwhile removes it (core/interrupt.h)
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ok = out.good() && (out << text).good() && (out.close(), out.good());
  }
  int err = errno;
  if (ok) err = fsync_path(tmp), ok = err == 0;  // whole on disk before it replaces the old file
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  forget_partial_file(tmp);
  if (!ok) {
    std::error_code ec;
    fs::remove(tmp, ec);
    const int code = err ? err : errno;
    throw UserError(fmt::format("cannot write {} ({}); {} (the option {})", path, std::strerror(code),
                                path_error_fix(code), option));
  }
}

}  // namespace troupe::cli
