// collectives/netif.h — which network interface the data plane uses (issue 14): the one
// this host reaches the job's coordinator through, so that UCX listens there and nowhere
// else (UCX's TCP transport otherwise listens on every interface).
#pragma once
#include <string>

namespace troupe {

// The name of the local network interface (e.g. "lo", "eth0") whose address this host
// uses as the source to reach `host` (an IPv4 address or a name), as the routing table
// chooses it; "" when `host` does not resolve or no interface holds that address.
// Sends nothing (a UDP socket is connected, not written to).
std::string interface_towards(const std::string& host);

}  // namespace troupe
