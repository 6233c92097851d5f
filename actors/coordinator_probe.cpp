// actors/coordinator_probe.cpp — see coordinator_probe.h.
#include "actors/coordinator_probe.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/io/basp/header.hpp>
#include <caf/io/basp/version.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>

namespace troupe {
namespace {

int remaining_ms(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// A non-blocking connect bounded by `deadline`; -1 (errno-ish text in *why) if none.
int connect_by(const addrinfo* ai, std::chrono::steady_clock::time_point deadline, std::string* why) {
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *why = std::strerror(errno);
      ::close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
      *why = err ? std::strerror(err) : "connection timed out";
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

uint64_t big_endian(const unsigned char* b, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | b[i];
  return v;
}

}  // namespace

const int kBaspHeaderBytes = static_cast<int>(caf::io::basp::header_size);

long long own_connection_bytes(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  auto same_peer = [&](const sockaddr_storage& peer) {
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      if (ai->ai_family != peer.ss_family) continue;
      if (peer.ss_family == AF_INET) {
        const auto* a = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
        const auto* b = reinterpret_cast<const sockaddr_in*>(&peer);
        if (a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr) return true;
      } else if (peer.ss_family == AF_INET6) {
        const auto* a = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
        const auto* b = reinterpret_cast<const sockaddr_in6*>(&peer);
        if (a->sin6_port == b->sin6_port && std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0)
          return true;
      }
    }
    return false;
  };
  long long total = -1;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd == ::dirfd(d)) continue;
      struct stat st {};
      if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0 || !same_peer(peer))
        continue;
      tcp_info info{};
      socklen_t ilen = sizeof info;
      if (::getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_INFO, &info, &ilen) != 0) continue;
      total = std::max(total, 0LL) + static_cast<long long>(info.tcpi_bytes_received);
    }
    ::closedir(d);
  }
  ::freeaddrinfo(res);
  return total;
}

Probe probe_coordinator(const std::string& host, uint16_t port, double wait_s) {
  using Clock = std::chrono::steady_clock;
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
  Probe out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    out.detail = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return out;
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) fd = connect_by(ai, Clock::now() + wait, &why);
  ::freeaddrinfo(res);
  if (fd < 0) {
    out.detail = why;
    return out;
  }
  unsigned char buf[32];
  size_t got = 0;
  const auto deadline = Clock::now() + wait;
  while (got < sizeof buf) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    const ssize_t n = ::recv(fd, buf + got, sizeof buf - got, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got == 0) {
    out.result = ProbeResult::kSilent;
    // (what this process's own connection got is not known here: a server that greets each
    // connection once may have sent it bytes)
    out.detail = "it accepted the connection but gave no troupe greeting (a probe's connection got no bytes within " +
                 std::to_string(wait.count()) + " ms)";
    return out;
  }
  const bool basp = got == sizeof buf && buf[0] == 0 && buf[1] == 0 && buf[2] == 0 && big_endian(buf + 4, 4) <= 65536 &&
                    big_endian(buf + 8, 8) == caf::io::basp::version;
  if (basp) {
    out.result = ProbeResult::kCaf;
    return out;
  }
  out.result = ProbeResult::kForeign;
  std::string shown;
  for (size_t i = 0; i < got && i < 16; ++i) shown += (buf[i] >= 0x20 && buf[i] < 0x7f) ? static_cast<char>(buf[i]) : '.';
  out.detail = "it answered with " + std::to_string(got) + " byte(s) that are not a troupe greeting (\"" + shown + "\")";
  return out;
}

}  // namespace troupe
