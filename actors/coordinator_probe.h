// actors/coordinator_probe.h — is the thing at TROUPE_COORDINATOR a troupe coordinator?
//
// CAF 0.17's remote_actor() has no handshake timeout (actor-framework issue #504): pointed
// at a server that accepts and says nothing (an HTTP server waits for a request), it blocked
// the joining process forever, past fault.join_timeout_s. A troupe coordinator is a CAF
// node: on accepting a connection it sends the BASP server handshake at once. So before
// remote_actor(), a joining process opens its own TCP connection and reads the greeting.
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

}  // namespace troupe
