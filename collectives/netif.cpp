// collectives/netif.cpp — see netif.h.
#include "collectives/netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace troupe {

std::string interface_towards(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (host.empty() || ::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "";
  sockaddr_in dst{};
  std::memcpy(&dst, res->ai_addr, sizeof dst);
  ::freeaddrinfo(res);
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in src{};
  socklen_t len = sizeof src;
  const bool ok = ::connect(fd, (sockaddr*)&dst, sizeof dst) == 0 && ::getsockname(fd, (sockaddr*)&src, &len) == 0;
  ::close(fd);
  if (!ok) return "";
  std::string name;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  for (ifaddrs* i = ifs; i && name.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        ((sockaddr_in*)i->ifa_addr)->sin_addr.s_addr == src.sin_addr.s_addr)
      name = i->ifa_name;
  ::freeifaddrs(ifs);
  return name;
}

}  // namespace troupe
