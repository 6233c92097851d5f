// core/interrupt.cpp — see interrupt.h. The handler only write()s the signal number into a
// pipe (async-signal-safe); the watcher thread reads it and does the work.
#include "core/interrupt.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>

#include "core/error.h"

namespace troupe {
namespace {
std::atomic<int> g_pipe_write{-1};
std::atomic<bool> g_active{false};

extern "C" void on_interrupt(int sig) {
  const int saved = errno;
  const int fd = g_pipe_write.load();
  const unsigned char b = static_cast<unsigned char>(sig);
  if (fd >= 0) (void)!::write(fd, &b, 1);
  errno = saved;
}
}  // namespace

struct InterruptGuard::Impl {
  std::function<std::string(int)> on_stop;
  int fds[2] = {-1, -1};
  struct sigaction old_int {}, old_term {}, old_usr1 {}, old_xcpu {};
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
      std::fprintf(stderr, "error: %s\n", sentence.c_str());
      std::fflush(stderr);
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
  sigaction(SIGINT, &sa, &impl_->old_int);
  sigaction(SIGTERM, &sa, &impl_->old_term);
  sigaction(SIGUSR1, &sa, &impl_->old_usr1);
  sigaction(SIGXCPU, &sa, &impl_->old_xcpu);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &impl_->old_int, nullptr);
  sigaction(SIGTERM, &impl_->old_term, nullptr);
  sigaction(SIGUSR1, &impl_->old_usr1, nullptr);
  sigaction(SIGXCPU, &impl_->old_xcpu, nullptr);
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
