#include "cli/figures.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "core/error.h"
#include "core/paths.h"
#include "core/interrupt.h"
#include "core/temp_folder.h"
#include "core/text.h"

namespace fs = std::filesystem;

namespace troupe::cli {

std::string gp_quote(const std::string& text) {
  // single-quoted pieces (no backquote or macro substitution inside them), each ' between
  // them as the string "'" joined with gnuplot's . operator: gnuplot misread a doubled ''
  // at the start of a single-quoted string (the title "'best' run" failed)
  std::string out = "'";
  for (char ch : text) {
    if (ch == '\'') out += "'.\"'\".'";
    else out += ch;
  }
  return out + "'";
}

std::string png_tmp(const std::string& out) { return out + ".tmp-" + std::to_string(::getpid()); }

// Where `gnuplot` on PATH is, as command -v finds it (an empty entry is the current folder);
// "" when it is not there. (No shell: a SIGCHLD inherited as ignored made system()'s wait fail.)
static std::string gnuplot_on_path() {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "";
  for (size_t at = 0; at <= dirs.size();) {
    const size_t colon = std::min(dirs.find(':', at), dirs.size());
    const std::string dir = dirs.substr(at, colon - at);
    const std::string f = (dir.empty() ? std::string(".") : dir) + "/gnuplot";
    struct stat st {};
    if (::stat(f.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(f.c_str(), X_OK) == 0) return f;
    at = colon + 1;
  }
  return "";
}

void check_png_output(const std::string& out, const std::string& option) {
  // a name of another picture format would hold PNG bytes: viewers refuse such a file
  std::string ext = fs::path(out).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return (char)std::tolower(ch); });
  for (const char* other : {".svg", ".pdf", ".jpg", ".jpeg", ".gif", ".eps", ".ps", ".webp", ".bmp", ".tif", ".tiff"})
    TROUPE_USER_CHECK(ext != other) << option << " " << out << ": troupe draws PNG pictures only, and a " << ext
                                    << " name would hold PNG bytes; name the file .png";
  if (gnuplot_on_path().empty()) {
    const char* path = std::getenv("PATH");
    std::string where;  // installed, but not on this PATH?
    for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin", "/opt/homebrew/bin"})
      if (where.empty() && ::access((std::string(dir) + "/gnuplot").c_str(), X_OK) == 0) where = dir;
    const std::string searched = path && *path ? "PATH (" + std::string(path) + ")" : std::string("PATH (empty)");
    throw UserError(where.empty() ? "gnuplot was not found on " + searched +
                                        "; install it (scripts/setup.sh installs gnuplot-nox), or add its folder to PATH"
                                  : "gnuplot was not found on " + searched + ", but " + where +
                                        "/gnuplot exists: add " + where + " to PATH");
  }
  // a picture takes 50-300 KiB (a plot of a tiny run: 82 KiB): gnuplot's pngcairo exits 0
  // with a cut or empty file on a full disk, so the room is asked for first
  check_output_file(out, option, 512 << 10);
}

namespace {
// Whether `path` is a whole PNG: the signature first and the IEND chunk last. gnuplot's
// pngcairo exits 0 even when its writes fail (a disk that fills midway leaves a picture
// cut at some block boundary).
bool png_complete(const std::string& path) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
  std::ifstream in(path, std::ios::binary);
  char head[8], tail[12];
  if (!in.read(head, 8) || std::memcmp(head, sig, 8) != 0) return false;
  if (!in.seekg(-12, std::ios::end) || !in.read(tail, 12)) return false;
  return std::memcmp(tail, iend, 12) == 0;
}

// How long gnuplot may draw one figure, seconds: 300 (troupe's figures take seconds; a hung
// gnuplot is stopped), or TROUPE_GNUPLOT_TIMEOUT_S (1 to 86400; UserError otherwise).
double gnuplot_deadline_s() {
  const char* env = std::getenv("TROUPE_GNUPLOT_TIMEOUT_S");
  if (!env || !*env) return 300;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(env, &end);
  const bool decimal = std::string(env).find_first_not_of("0123456789.eE+-") == std::string::npos;  // (not hex)
  TROUPE_USER_CHECK(decimal && errno == 0 && end && *end == '\0' && v >= 1 && v <= 86400)
      << "TROUPE_GNUPLOT_TIMEOUT_S='" << printable(env, false, 64)
      << "' is not a number of seconds from 1 to 86400; unset it (300 s) or set e.g. 600";
  return v;
}

// How gnuplot ended.
struct GnuplotEnd {
  bool started = false;
  int status = -1;         // its exit status, -1 when a signal ended it
  int signal = 0;          // the signal that ended it
  bool timed_out = false;  // it ran past its deadline and was killed
};

constexpr size_t kGnuplotStderrCap = 64 << 10;  // bytes of gnuplot's stderr kept (the rest is read and dropped)

// gnuplot SCRIPT; its stderr (the first kGnuplotStderrCap bytes) into *err; its pid in *pid
// while it runs (for a signal's clean-up). Waits at most `deadline_s` seconds, then kills its
// process group. UserError when the pipe for its stderr cannot be made.
GnuplotEnd run_gnuplot(const std::string& script_path, std::string* err, std::atomic<pid_t>* pid, double deadline_s) {
  // fork + exec rather than posix_spawn: the child needs a process group of its own (so a
  // kill reaches what it starts), PR_SET_PDEATHSIG (it dies with troupe, even on SIGKILL),
  // and /dev/null for stdin and stdout (a child it leaves behind must not hold troupe's
  // stdout open, which keeps a pipe reader waiting); stderr is a pipe troupe reads, so that
  // a gnuplot that writes without end fills no disk. The argument strings are made before
  // the fork: the child only makes system calls.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    const int e = errno;
    throw UserError(std::string("cannot open a pipe for gnuplot's messages (") + std::strerror(e) + "): " +
                    path_error_fix(e));
  }
  const pid_t parent = ::getpid();
  const char* argv[] = {"gnuplot", script_path.c_str(), nullptr};
  const pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // troupe died before the line above
    const int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd < 0) ::_exit(127);
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);  // (dup2 clears close-on-exec on the copy)
    ::execvp("gnuplot", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(fds[1]);
  GnuplotEnd end;
  if (child < 0) {
    ::close(fds[0]);
    return end;
  }
  ::setpgid(child, child);  // (also here: a kill of the group must not come before the child's own call)
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  end.started = true;
  pid->store(child);
  auto drain = [&] {  // what gnuplot wrote so far, up to the cap
    char buf[8192];
    for (;;) {
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      if (err->size() < kGnuplotStderrCap) err->append(buf, std::min((size_t)n, kGnuplotStderrCap - err->size()));
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  int st = 0;
  for (;;) {
    drain();
    const pid_t r = ::waitpid(child, &st, WNOHANG);
    if (r == child || (r < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-child, SIGKILL);
      while (::waitpid(child, &st, 0) < 0 && errno == EINTR) {
      }
      end.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    ::poll(&p, 1, 20);
  }
  drain();  // (a child it left behind may hold the pipe: only what is there now)
  ::close(fds[0]);
  pid->store(0);
  end.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  end.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  return end;
}

}  // namespace

void render_png(const std::string& script, const std::string& out, const std::string& option,
                const std::string& smaller) {
  check_png_output(out, option);
  const double deadline_s = gnuplot_deadline_s();
  std::error_code ec;
  const std::string ns = pid_namespace_id();
  std::error_code te;
  const char* tmp_env = std::getenv("TMPDIR");
  const bool tmp_set = tmp_env && *tmp_env;  // (an empty TMPDIR means the default, as for mktemp(1))
  const std::string tmp_dir = tmp_set ? fs::temp_directory_path(te).string() : std::string("/tmp");
  TROUPE_USER_CHECK(!te) << "TMPDIR='" << printable(tmp_env ? tmp_env : "", false, 200)
                         << "' is not a usable folder for temporary files (" << te.message()
                         << "): set TMPDIR to a writable folder, or unset it (/tmp)";
  // earlier draws killed without clean-up (SIGKILL), in this or another pid namespace: their
  // folders' locks are free (core/temp_folder.h); where locks do not work, by the pid in the name
  const std::string own = "troupe-gnuplot-" + ns + "-";
  remove_abandoned_folders(tmp_dir, "troupe-gnuplot-", [&](const std::string& path) {
    const std::string name = fs::path(path).filename().string();
    const long pid = name.rfind(own, 0) == 0 ? std::atol(name.c_str() + own.size()) : 0;
    return pid > 0 && ::kill((pid_t)pid, 0) != 0 && errno == ESRCH;
  });
  struct FolderGone {  // the folder goes whatever ends this function, then its lock
    LockedFolder f;
    ~FolderGone() { remove_locked_folder(f); }
  } folder{make_locked_folder(tmp_dir, own + std::to_string(::getpid()) + "-")};
  TROUPE_USER_CHECK(!folder.f.path.empty())
      << "cannot create a temporary folder for gnuplot in " << tmp_dir << " (" << std::strerror(folder.f.error)
      << "); free space there, or set TMPDIR to another folder";
  const std::string dir = folder.f.path, script_path = dir + "/figure.gp";
  // a signal while drawing: stop gnuplot, remove its folder and the half-drawn picture, exit 2
  std::atomic<pid_t> gnuplot{0};
  InterruptGuard interrupt([&](int sig) {
    if (const pid_t g = gnuplot.load(); g > 0) {
      ::kill(-g, SIGKILL);  // (its process group)
      ::waitpid(g, nullptr, 0);
    }
    std::error_code rm;
    fs::remove_all(dir, rm);
    fs::remove(png_tmp(out), rm);
    return std::string("stopped by ") + stop_signal_label(sig) +
           " while drawing " + out + "; the half-drawn picture was removed";
  });
  bool script_ok = false;
  int script_err = 0;  // errno of a failed write: ENOSPC, EFBIG (ulimit -f), ...
  {
    const int fd = ::open(script_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t done = 0;
    while (fd >= 0 && done < script.size()) {
      const ssize_t n = ::write(fd, script.data() + done, script.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += (size_t)n;
    }
    script_ok = fd >= 0 && done == script.size();
    script_err = script_ok ? 0 : errno;
    if (fd >= 0 && ::close(fd) != 0 && script_ok) script_ok = false, script_err = errno;
  }
  std::string err_text;
  const GnuplotEnd end = script_ok ? run_gnuplot(script_path, &err_text, &gnuplot, deadline_s) : GnuplotEnd{};
  const int rc = end.status;
  // gnuplot's own message, reduced to one printable line (it is several lines with a caret)
  std::string reason;
  {
    std::istringstream ef(err_text);
    std::string line;
    // its error ("line 0: ...") rather than the echoed script line before it
    std::string first, error;
    while (error.empty() && std::getline(ef, line)) {
      std::string text;
      for (char ch : line)
        if ((unsigned char)ch >= 0x20 && (unsigned char)ch < 0x7f) text += ch;
      while (!text.empty() && (text.back() == ' ' || text.front() == ' '))
        text.erase(text.back() == ' ' ? text.size() - 1 : 0, 1);
      if (text.find_first_not_of("^ ") == std::string::npos) continue;
      if (first.empty()) first = text;
      if (text.rfind("line ", 0) == 0 || text.find(", line ") != std::string::npos) error = text;
    }
    reason = error.empty() ? first : error;
    // gnuplot names its script by the temporary path troupe made: that path helps nobody
    if (const size_t at = reason.find(script_path); at != std::string::npos)
      reason.replace(at == 0 ? 0 : at - 1, script_path.size() + (at == 0 ? 0 : 2), "troupe's gnuplot script");
    if (reason.size() > 160) reason = reason.substr(0, 157) + "...";
  }
  fs::remove_all(dir, ec);
  const std::string tmp = png_tmp(out);
  const bool empty = !fs::is_regular_file(tmp, ec) || fs::file_size(tmp, ec) == 0;
  if (!script_ok || rc != 0 || empty || !png_complete(tmp)) {
    const uintmax_t got = empty ? 0 : fs::file_size(tmp, ec);
    fs::remove(tmp, ec);
    // a file-size limit (ulimit -f) that gnuplot met: the picture stops at the limit, not at a full disk
    rlimit fsize{};
    if (script_ok && ::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY &&
        got > 0 && got + 4096 >= (uintmax_t)fsize.rlim_cur)
      throw UserError(fmt::format("gnuplot could not draw {}: the file-size limit (ulimit -f) of {} bytes stopped its "
                                  "picture at {} bytes; raise it (ulimit -f unlimited), or leave out {}",
                                  out, (unsigned long long)fsize.rlim_cur, (unsigned long long)got, option));
    if (script_ok && rc == 0 && !empty) reason.clear();  // its picture was cut short: the disk's doing
    if (end.timed_out)
      throw UserError(fmt::format("{} did not finish drawing {} within {:g} s and was stopped; check that it is "
                                  "gnuplot (scripts/setup.sh installs gnuplot-nox), or draw a smaller figure ({})",
                                  gnuplot_on_path(), out, deadline_s, smaller));
    if (script_ok && reason.empty() && (rc > 0 || end.signal > 0))  // it failed and said nothing
      throw UserError(fmt::format("{} {} without a word while drawing {}; check that it is gnuplot with the pngcairo "
                                  "terminal (scripts/setup.sh installs gnuplot-nox), or leave out {}",
                                  gnuplot_on_path(),
                                  rc > 0 ? "exited with status " + std::to_string(rc)
                                         : "was killed by signal " + std::string(strsignal(end.signal)),
                                  out, option));
    if (!script_ok)
      throw UserError("cannot write gnuplot's script in " + fs::path(dir).parent_path().string() + " (" +
                      std::string(std::strerror(script_err)) + "); " +
                      (script_err == EFBIG || script_err == ENOSPC || script_err == EDQUOT
                           ? std::string(path_error_fix(script_err))
                           : "free space there, or set TMPDIR to another folder") +
                      ", then draw " + out + " again");
    // blame the disk only when gnuplot did not say why, or said it could not write
    const bool io = reason.empty() || reason.find("annot open") != std::string::npos ||
                    reason.find("space") != std::string::npos || reason.find("ermission") != std::string::npos;
    if (io && reason.empty() && rc == 0 && empty)  // it said nothing, claimed success and drew nothing
      throw UserError(fmt::format("{} exited 0 but drew nothing into {}; check that it is gnuplot with the pngcairo "
                                  "terminal (scripts/setup.sh installs gnuplot-nox) and that the folder has free space, "
                                  "or pass another {} path",
                                  gnuplot_on_path(), out, option));
    if (io)
      throw UserError(fmt::format("gnuplot could not draw {} ({}); check that its folder has free space and is "
                                  "writable, or pass another {} path (scripts/setup.sh installs gnuplot-nox with pngcairo)",
                                  out,
                                  !reason.empty() ? "gnuplot: " + reason
                                  : empty         ? std::string("it wrote an empty picture")
                                                  : std::string("its picture was cut short, as when the disk fills"),
                                  option));
    // the size advice only when gnuplot's complaint is about size
    if (reason.find("memory") != std::string::npos || reason.find("too many") != std::string::npos ||
        reason.find("too large") != std::string::npos || reason.find("too big") != std::string::npos)
      throw UserError(fmt::format("gnuplot could not draw {} (gnuplot: {}); the figure is beyond what gnuplot draws here: "
                                  "draw a smaller one ({}), or leave out {}",
                                  out, reason, smaller, option));
    throw UserError(fmt::format("gnuplot could not draw {} (gnuplot: {}); troupe's gnuplot script failed on {}: "
                                "check that it is gnuplot 5 or later ({} --version); if it is, leave out {}, and "
                                "report the message",
                                out, reason, gnuplot_on_path(), gnuplot_on_path(), option));
  }
  if (const int err = fsync_path(tmp); err != 0)  // whole on disk before it replaces the old picture
    ec = std::error_code(err, std::generic_category());
  else
    fs::rename(tmp, out, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw UserError(fmt::format("cannot write {} ({}); pass a writable {} path", out, why, option));
  }
}

void draw_timeline(const std::vector<TimelineBar>& bars, int stages, const std::string& title, const std::string& unit,
                   const std::string& out, const std::string& option) {
  double t_end = 0;
  for (auto& b : bars) t_end = std::max(t_end, b.t1);
  const char* colour[3] = {"#4c72b0", "#dd8452", "#55a868"};  // F, B, W
  const uint32_t rgb[3] = {0x4c72b0, 0xdd8452, 0x55a868};
  // chunk c > 0 of an interleaved schedule: the kind's colour, lighter
  auto colour_of = [&](char k, int chunk) {
    const uint32_t c = rgb[k == 'F' ? 0 : k == 'B' ? 1 : 2];
    const double mix = chunk > 0 ? 0.4 : 0.0;
    uint32_t out = 0;
    for (int sh = 0; sh <= 16; sh += 8) {
      const double v = ((c >> sh) & 0xff) * (1 - mix) + 255 * mix;
      out |= (uint32_t)(v + 0.5) << sh;
    }
    return out;
  };
  std::string data;
  for (auto& b : bars) {
    const std::string text = b.chunk > 0 ? fmt::format("{}c{}", b.mb, b.chunk) : std::to_string(b.mb);
    const double px = 1000.0 * (b.t1 - b.t0) / std::max(t_end, 1e-30);  // the plot is about 1000 pixels wide
    const std::string label = px > 7.0 * text.size() + 4 ? text : std::string("\"\"");
    data += fmt::format("{} {} {} {} {:#08x} {}\n", 0.5 * (b.t0 + b.t1), b.stage, 0.5 * (b.t1 - b.t0), 0.38,
                        colour_of(b.kind, b.chunk), label);
  }
  // 55 pixels a stage, fewer past 290 stages: Cairo refuses a picture taller than 32767
  // pixels ("Cairo is unhappy"), so the picture stays under 16,000; stage names every
  // `every`-th row, at least 18 pixels apart
  const int row_px = std::max(4, std::min(55, (16000 - 170) / std::max(1, stages)));
  const int every = (18 + row_px - 1) / row_px;
  std::string ytics;
  for (int s = 0; s < stages; s += every) ytics += fmt::format("{}\"stage {}\" {}", s ? ", " : "", s, s);
  std::string gp;
  gp += fmt::format("set terminal pngcairo size 1100,{} font 'sans,10' noenhanced\n", 170 + row_px * stages);
  gp += "set output " + gp_quote(png_tmp(out)) + "\n";
  gp += "$bars << EOD\n" + data + "EOD\n";
  gp += "set title " + gp_quote(title) + "\n";
  gp += "set xlabel " + gp_quote(unit) + "\n";
  gp += fmt::format("set xrange [0:{}]\nset yrange [{}:-0.6]\n", t_end * 1.001, stages - 0.4);
  gp += "set ytics (" + ytics + ")\nset grid xtics lc rgb '#dddddd'\n";
  gp += "set key below horizontal\nset style fill solid 1.0 border rgb 'white'\n";
  gp += "plot $bars using 1:2:3:4:5 with boxxyerror lc rgb variable notitle";
  if (bars.size() <= 400) gp += ", $bars using 1:2:6 with labels tc rgb 'white' font 'sans,9' notitle";
  gp += fmt::format(", NaN with boxes lc rgb '{}' title 'F (forward)', NaN with boxes lc rgb '{}' title 'B (backward)'",
                    colour[0], colour[1]);
  if (std::any_of(bars.begin(), bars.end(), [](const TimelineBar& b) { return b.kind == 'W'; }))
    gp += fmt::format(", NaN with boxes lc rgb '{}' title 'W (weight grad)'", colour[2]);
  if (std::any_of(bars.begin(), bars.end(), [](const TimelineBar& b) { return b.chunk > 0; }))
    gp += fmt::format(", NaN with boxes lc rgb '{:#08x}' title 'lighter: chunk > 0'", colour_of('F', 1));
  gp += ", NaN with boxes fs empty lc rgb '#999999' title 'idle (the bubble)'\n";
  render_png(gp, out, option);
}

std::vector<TimelineBar> trace_step_bars(const std::string& trace_json, int64_t step, int64_t* which) {
  std::ifstream in(trace_json);
  TROUPE_USER_CHECK(in.good()) << "cannot read the trace " << trace_json << "; pass the file train --trace wrote";
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  TROUPE_USER_CHECK(!j.is_discarded() && j.contains("traceEvents"))
      << trace_json << " is not a Chrome trace; pass the file train --trace wrote";
  int64_t last = -1;
  for (auto& e : j["traceEvents"])
    if (e.value("ph", "") == "X" && e.contains("args")) last = std::max(last, e["args"].value("step", (int64_t)-1));
  if (step < 0) step = last;
  std::vector<TimelineBar> bars;
  double t0 = 1e300;
  for (auto& e : j["traceEvents"]) {
    const std::string cat = e.value("cat", "");
    if (e.value("ph", "") != "X" || (cat != "F" && cat != "B" && cat != "W") || !e.contains("args") ||
        e["args"].value("step", (int64_t)-1) != step)
      continue;
    const double ts = e.value("ts", 0.0) / 1e3, dur = e.value("dur", 0.0) / 1e3;
    bars.push_back({e.value("tid", 0), cat[0], e["args"].value("microbatch", 0), e["args"].value("chunk", 0), ts, ts + dur});
    t0 = std::min(t0, ts);
  }
  TROUPE_USER_CHECK(!bars.empty()) << trace_json << " holds no F/B/W spans of step " << step
                                   << "; pass a trace of a run that trained that step";
  for (auto& b : bars) {
    b.t0 -= t0;
    b.t1 -= t0;
  }
  if (which) *which = step;
  return bars;
}

void draw_trace_png(const std::string& trace_json, const std::string& out, const std::string& option) {
  int64_t step = -1;
  auto bars = trace_step_bars(trace_json, -1, &step);
  int stages = 0;
  double busy = 0, span = 0;
  for (auto& b : bars) {
    stages = std::max(stages, b.stage + 1);
    busy += b.t1 - b.t0;
    span = std::max(span, b.t1);
  }
  const double bubble = span > 0 ? 1.0 - busy / (stages * span) : 0;
  draw_timeline(bars, stages,
                fmt::format("measured step {} ({}): {:.1f} ms, bubble {:.1f}% (white: idle, waiting, sending)", step,
                            fs::path(trace_json).filename().string(), span, 100 * bubble),
                "ms since the step's first action", out, option);
  std::printf("wrote %s (measured timeline of step %lld)\n", out.c_str(), (long long)step);
}

}  // namespace troupe::cli
