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

const int kStopSignals[kStopSignalCount] = {SIGINT,  SIGTERM,   SIGUSR1, SIGUSR2, SIGHUP,
                                            SIGALRM, SIGVTALRM, SIGQUIT, SIGPWR,  SIGXCPU};

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
    default: return "a signal";
  }
}

bool left_ignored(int sig) {
  if (sig != SIGHUP && sig != SIGALRM && sig != SIGUSR2 && sig != SIGVTALRM && sig != SIGQUIT && sig != SIGPWR)
    return false;
  struct sigaction cur {};
  return ::sigaction(sig, nullptr, &cur) == 0 && cur.sa_handler == SIG_IGN;
}

namespace {
// note_partial_dir's table: state 0 free, 1 being written, 2 holds a path
constexpr int kPartialSlots = 8;
struct PartialSlot {
  std::atomic<int> state{0};
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

void note_partial_dir(const std::string& path) {
  if (path.size() >= sizeof(PartialSlot::path)) return;
  for (auto& slot : g_partial) {
    int free = 0;
    if (!slot.state.compare_exchange_strong(free, 1)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.state.store(2);
    return;
  }
}

void forget_partial_dir(const std::string& path) {
  for (auto& slot : g_partial) {
    int held = 2;
    if (slot.state.load() == 2 && path == slot.path && slot.state.compare_exchange_strong(held, 1)) {
      slot.path[0] = 0;
      slot.state.store(0);
    }
  }
}

void remove_partial_dirs() noexcept {
  const int saved = errno;
  for (auto& slot : g_partial)
    if (slot.state.load() == 2)
      for (int attempt = 0; attempt < 3 && !remove_flat_dir(slot.path); ++attempt) {
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
    delete impl_;
    g_active = false;
    throw Error("InterruptGuard: pipe2 failed");
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
