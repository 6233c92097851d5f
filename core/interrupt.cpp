// core/interrupt.cpp — see interrupt.h. The handler only write()s the signal number into a
// pipe (async-signal-safe); the watcher thread reads it and does the work.
#include "core/interrupt.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "core/job_error.h"

namespace troupe {

// (the real-time signals by number: SIGRTMIN is glibc's run-time value, __SIGRTMIN + 2, as
// the two below it are its own; this table is read from the .preinit_array, before any
// dynamic initialisation)
const int kStopSignals[kStopSignalCount] = {
    SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP, SIGALRM, SIGVTALRM, SIGQUIT, SIGPWR, SIGXCPU, SIGPROF, SIGIO, SIGSYS,
    SIGSTKFLT,
    __SIGRTMIN + 2, __SIGRTMIN + 3, __SIGRTMIN + 4, __SIGRTMIN + 5, __SIGRTMIN + 6, __SIGRTMIN + 7, __SIGRTMIN + 8,
    __SIGRTMIN + 9, __SIGRTMIN + 10, __SIGRTMIN + 11, __SIGRTMIN + 12, __SIGRTMIN + 13, __SIGRTMIN + 14, __SIGRTMIN + 15,
    __SIGRTMIN + 16, __SIGRTMIN + 17, __SIGRTMIN + 18, __SIGRTMIN + 19, __SIGRTMIN + 20, __SIGRTMIN + 21, __SIGRTMIN + 22,
    __SIGRTMIN + 23, __SIGRTMIN + 24, __SIGRTMIN + 25, __SIGRTMIN + 26, __SIGRTMIN + 27, __SIGRTMIN + 28, __SIGRTMIN + 29,
    __SIGRTMIN + 30, __SIGRTMIN + 31, __SIGRTMIN + 32};
static_assert(__SIGRTMAX - __SIGRTMIN - 2 + 1 == 31, "the real-time signals of kStopSignals");

namespace {
const char* const kRealTimeLabels[31] = {
    "SIGRTMIN+0", "SIGRTMIN+1", "SIGRTMIN+2", "SIGRTMIN+3", "SIGRTMIN+4", "SIGRTMIN+5", "SIGRTMIN+6", "SIGRTMIN+7",
    "SIGRTMIN+8", "SIGRTMIN+9", "SIGRTMIN+10", "SIGRTMIN+11", "SIGRTMIN+12", "SIGRTMIN+13", "SIGRTMIN+14", "SIGRTMIN+15",
    "SIGRTMIN+16", "SIGRTMIN+17", "SIGRTMIN+18", "SIGRTMIN+19", "SIGRTMIN+20", "SIGRTMIN+21", "SIGRTMIN+22", "SIGRTMIN+23",
    "SIGRTMIN+24", "SIGRTMIN+25", "SIGRTMIN+26", "SIGRTMIN+27", "SIGRTMIN+28", "SIGRTMIN+29", "SIGRTMIN+30"};
}  // namespace

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

const char* stop_signal_label(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT (Ctrl-C)";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP (the terminal closed; nohup keeps a run going)";
    case SIGALRM: return "SIGALRM";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGQUIT: return "SIGQUIT (Ctrl-\\)";
    case SIGPWR: return "SIGPWR (a power failure: the UPS daemon asks for a clean shutdown)";
    case SIGXCPU: return "SIGXCPU (the CPU-time limit, ulimit -t, was reached: raise it)";
    case SIGPROF: return "SIGPROF";
    case SIGIO: return "SIGIO";
    case SIGSYS: return "SIGSYS";
    case SIGSTKFLT: return "SIGSTKFLT";
    default:
      if (sig >= __SIGRTMIN + 2 && sig <= __SIGRTMAX) return kRealTimeLabels[sig - __SIGRTMIN - 2];
      return "a signal";
  }
}

bool left_ignored(int sig) {
  if (sig == SIGINT || sig == SIGTERM || sig == SIGUSR1 || sig == SIGXCPU) return false;
  struct sigaction cur {};
  return ::sigaction(sig, nullptr, &cur) == 0 && cur.sa_handler == SIG_IGN;
}

namespace {
// note_partial_dir's table: state 0 free, 1 being written, 2 holds a path, 3 claimed by its
// writer for the rename (not removed), 4 being removed
constexpr int kPartialSlots = 8;
struct PartialSlot {
  std::atomic<int> state{0};
  bool file = false;  // a temporary file (note_partial_file), else a flat folder
  char path[4096] = {};
};
PartialSlot g_partial[kPartialSlots];

// Removes the files of the flat folder `path`, then the folder. Async-signal-safe.
bool remove_flat_dir(const char* path) noexcept {
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      struct Dirent {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* d = reinterpret_cast<const Dirent*>(buf + off);
      const char* name = buf + off + offsetof(Dirent, name);
      if (!(name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))) (void)::unlinkat(fd, name, 0);
      off += d->reclen;
    }
  }
  ::close(fd);
  return ::rmdir(path) == 0 || errno == ENOENT;
}
}  // namespace

namespace {
void note_partial(const std::string& path, bool file) {
  if (path.size() >= sizeof(PartialSlot::path)) return;
  for (auto& slot : g_partial) {
    int free = 0;
    if (!slot.state.compare_exchange_strong(free, 1)) continue;
    slot.file = file;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.state.store(2);
    return;
  }
}
}  // namespace

void note_partial_dir(const std::string& path) { note_partial(path, false); }
void note_partial_file(const std::string& path) { note_partial(path, true); }
void forget_partial_file(const std::string& path) { forget_partial_dir(path); }

void forget_partial_dir(const std::string& path) {
  for (auto& slot : g_partial) {
    for (int held : {2, 3, 4}) {  // (4: a cleanup that ran; the process was ending)
      if (slot.state.load() == held && path == slot.path && slot.state.compare_exchange_strong(held, 1)) {
        slot.path[0] = 0;
        slot.state.store(0);
      }
    }
  }
}

bool claim_partial_dir(const std::string& path) {
  for (auto& slot : g_partial) {
    const int st = slot.state.load();
    if ((st != 2 && st != 4) || path != slot.path) continue;
    int held = 2;
    return slot.state.compare_exchange_strong(held, 3);  // fails only against a remover (4)
  }
  return true;
}

bool partial_dirs_noted() noexcept {
  for (auto& slot : g_partial)
    if (slot.state.load() != 0) return true;
  return false;
}

void remove_partial_dirs() noexcept {
  const int saved = errno;
  for (auto& slot : g_partial) {
    int held = 2;  // (a folder its writer claimed for the rename is left to it: 3)
    if (slot.state.compare_exchange_strong(held, 4))
      for (int attempt = 0; attempt < 3 && !(slot.file ? ::unlink(slot.path) == 0 || errno == ENOENT
                                                        : remove_flat_dir(slot.path));
           ++attempt) {
      }
  }
  errno = saved;
}

namespace {
std::atomic<int> g_pipe_write{-1};
std::atomic<bool> g_active{false};

extern "C" void on_interrupt(int sig) {
  const int saved = errno;
  note_stop_signal(sig);
  const int fd = g_pipe_write.load();
  const unsigned char b = static_cast<unsigned char>(sig);
  if (fd >= 0) (void)!::write(fd, &b, 1);
  errno = saved;
}
}  // namespace

struct InterruptGuard::Impl {
  std::function<std::string(int)> on_stop;
  int fds[2] = {-1, -1};
  struct sigaction old[kStopSignalCount] {};
  bool taken[kStopSignalCount] = {};
  std::thread watcher;

  void watch() {
    for (;;) {
      unsigned char b = 0;
      const ssize_t n = ::read(fds[0], &b, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || b == 0) return;  // the guard ends (0) or the pipe closed
      std::string sentence;
      try {
        sentence = on_stop(b);
      } catch (const std::exception& e) {
        sentence = std::string("stopped by a signal; cleaning up failed: ") + e.what();
      }
      std::fflush(stderr);
      write_error_line("error: " + std::string(job_error_prefix()) + sentence + "\n");  // once per job (core/job_error.h)
      ::_exit(2);
    }
  }
};

InterruptGuard::InterruptGuard(std::function<std::string(int)> on_stop) : impl_(new Impl) {
  if (g_active.exchange(true)) {
    delete impl_;
    throw Error("InterruptGuard: another guard is active (guards do not nest)");
  }
  impl_->on_stop = std::move(on_stop);
  if (::pipe2(impl_->fds, O_CLOEXEC) != 0) {
    const int err = errno;
    delete impl_;
    g_active = false;
    const std::string what = std::string("cannot open the pipe that takes the stop signals (") + std::strerror(err) + ")";
    if (err == EMFILE || err == ENFILE) throw UserError(what + ": " + path_error_fix(err));
    throw SystemError(what, err);
  }
  g_pipe_write = impl_->fds[1];
  impl_->watcher = std::thread([this] { impl_->watch(); });
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < kStopSignalCount; ++i) {
    const int sig = kStopSignals[i];
    if (left_ignored(sig)) continue;  // nohup's SIGHUP stays ignored
    impl_->taken[i] = ::sigaction(sig, &sa, &impl_->old[i]) == 0;
  }
}

InterruptGuard::~InterruptGuard() {
  for (int i = 0; i < kStopSignalCount; ++i)
    if (impl_->taken[i]) ::sigaction(kStopSignals[i], &impl_->old[i], nullptr);
  const unsigned char quit = 0;
  (void)!::write(impl_->fds[1], &quit, 1);
  impl_->watcher.join();  // (if a signal came first, the watcher ends the process instead)
  g_pipe_write = -1;
  ::close(impl_->fds[0]);
  ::close(impl_->fds[1]);
  delete impl_;
  g_active = false;
}

}  // namespace troupe
