// actors/coordinator_probe.h — is the thing at TROUPE_COORDINATOR a troupe coordinator?
//
// CAF 0.17's remote_actor() has no handshake timeout (actor-framework issue #504): pointed
// at a server that accepts and says nothing (an HTTP server waits for a request), it blocked
// the joining process forever, past fault.join_timeout_s. A troupe coordinator is a CAF
// node: on accepting a connection it sends the BASP server handshake at once. So when a
// join overruns its deadline (actors/cluster_join.cpp), a joining process opens its own TCP
// connection and reads the greeting to say what answers there; and it watches what its
// CAF connection has received (ownConnectionBytes) to tell a server that greets with a few
// foreign bytes (an SSH banner, shorter than a BASP header) from a coordinator.
#pragma once
#include <cstdint>
#include <string>

namespace troupe {

enum class ProbeResult {
  kCaf,         // a CAF node's BASP server handshake arrived: remote_actor() may proceed
  kNoListener,  // nothing accepts at host:port (yet): process 0 may still be starting
  kSilent,      // a TCP server accepted but sent nothing within the wait
  kForeign,     // a TCP server answered with bytes that are not a BASP handshake
};

struct Probe {
  ProbeResult result = ProbeResult::kNoListener;
  std::string detail;  // for kNoListener/kSilent/kForeign: what happened, one clause
};

// Connects to host:port (name or address; IPv4/IPv6) with a connect deadline of
// `wait_s` seconds, then waits up to `wait_s` seconds for the first 32 bytes (one BASP
// header: operation 0 = server_handshake, zero padding, payload length <= 64 KiB, operation
// data = caf::io::basp::version) and closes the connection. Never throws; never blocks
// longer than about 2 x wait_s.
Probe probe_coordinator(const std::string& host, uint16_t port, double wait_s);

// The size of a BASP header (caf::io::basp::header_size), bytes: every troupe coordinator's
// greeting is at least this long and arrives in one write.
extern const int kBaspHeaderBytes;

// The payload bytes this process's own open TCP connections to host:port have received
// (Linux TCP_INFO tcpi_bytes_received, summed over every socket of this process whose peer
// is one of host's addresses at `port`), or -1 when no such connection is open. Reads
// /proc/self/fd; for the connection that CAF's remote_actor() made and cannot report on.
// Never throws.
long long own_connection_bytes(const std::string& host, uint16_t port);

}  // namespace troupe
