// actors/intruders.cpp — see intruders.h.
#include "actors/intruders.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string_view>

namespace troupe {

bool RateLimitedLog::warn(const std::string& line) {
  const auto now = std::chrono::steady_clock::now();
  ++total_;
  if (logged_ && std::chrono::duration<double>(now - last_).count() < period_) {
    ++since_;
    return false;
  }
  if (since_ > 0)
    spdlog::warn("control plane: {} (and {} more like it in the last {:.0f} s; {} in all)", line, since_,
                 std::chrono::duration<double>(now - last_).count(), total_);
  else
    spdlog::warn("control plane: {}", line);
  logged_ = true;
  last_ = now;
  since_ = 0;
  last_line_ = line;
  return true;
}

void RateLimitedLog::flush() noexcept {
  if (since_ == 0) return;
  // (a refusal counted inside the window, with no later one to carry its count: accept 14)
  try {
    spdlog::warn("control plane: {} more like \"{}\" in the last {:.0f} s ({} in all)", since_, last_line_,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count(), total_);
  } catch (...) {
  }
  since_ = 0;
}

namespace {
// host:port of a socket address as text ("::ffff:1.2.3.4" as "1.2.3.4").
bool peer_of(int fd, std::string* host, uint16_t* port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, (sockaddr*)&a, &len) != 0) return false;
  char buf[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo((sockaddr*)&a, len, buf, sizeof buf, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  std::string_view h(buf);
  if (h.rfind("::ffff:", 0) == 0) h.remove_prefix(7);
  *host = std::string(h);
  *port = (uint16_t)std::atoi(serv);
  return true;
}
}  // namespace

int shutdown_connections_to(const std::string& host, uint16_t port) {
  std::string want(host);
  if (want.rfind("::ffff:", 0) == 0) want.erase(0, 7);
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return 0;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == ::dirfd(d)) continue;
    struct stat st {};
    int type = 0;
    socklen_t tl = sizeof type;
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) continue;
    std::string h;
    uint16_t p = 0;
    if (peer_of(fd, &h, &p) && h == want && p == port && ::shutdown(fd, SHUT_RDWR) == 0) ++n;
  }
  ::closedir(d);
  return n;
}

}  // namespace troupe
