// SPDX-License-Identifier: Apache-2.0
// File: transports/registry.h
// Transports as plug-ins. Core never names a transport: it asks the registry which ones exist,
// lets each open its per-communicator resources (the probe), publishes the blob each one wants
// its peers to see, picks one transport per peer by cost, and hands each transport the peers it
// won. A transport is one folder under transports/ plus one line in transports/CMakeLists.txt
// (`chorus_add_transport(...)`), which generates the call to its registration function.
//
// Choosing is symmetric: both ends of a pair evaluate reaches() and the cost on the same two
// EndpointInfos (lower rank first), so they always agree on the transport between them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "net/auth.h"
#include "transports/registration_key.h"
#include "transports/transport.h"

namespace chorus {

// Largest connect blob a transport may publish (PeerInfo checks it on both ends).
inline constexpr size_t kMaxTransportBlob = 4096;
// At most this many transports are registered.
inline constexpr size_t kMaxTransports = 16;

struct TransportCaps {
  enum class Reach : uint8_t { kSameProcess, kSameHost, kAnyHost };
  Reach reach = Reach::kAnyHost;
  bool one_sided_put = false;      // can write into registered remote memory
  bool registration = false;       // registers memory (ncclCommRegister, ncclMemAlloc)
  bool reduce_on_receive = false;  // RecvRequest::reduce is honoured by the mechanism itself
  // Opened only when CHORUS_TRANSPORT names it: a transport whose resources cost something in
  // every process (threads, file descriptors, a library's global state) and that the cost
  // policy would not choose by itself.
  bool opt_in = false;
};

// One rank as the transports see it: its identity, and what this transport published for it.
struct EndpointInfo {
  int rank = -1;
  uint64_t host_hash = 0;
  std::string hostname;
  int pid = 0;
  uint64_t process_token = 0;
  bool open = false;      // the rank opened this transport (else blob is empty)
  std::string_view blob;  // what it published

  bool same_host(const EndpointInfo& o) const { return host_hash == o.host_hash; }
  bool same_process(const EndpointInfo& o) const {
    return same_host(o) && pid == o.pid && process_token == o.process_token;
  }
  // "rank 3 (host node7, pid 1234)".
  std::string describe() const;
};

// What a transport learns about the communicator it serves.
struct TransportContext {
  int rank = 0;
  int nranks = 1;
  uint64_t comm_uid = 0;
  net::Secret secret;  // the communicator's; connections must prove it
  int channels = 1;          // connections per peer, equal on every rank
  std::string comm_label;    // "comm 0x1234 rank 2/4", for messages
};

using ConnectionTable = std::vector<std::vector<std::unique_ptr<Connection>>>;  // [i][channel]

// One transport's resources for one communicator (sockets, segments, worker, registrations).
// Destroyed when the communicator shuts down, after its connections.
class TransportInstance {
 public:
  virtual ~TransportInstance() = default;
  // What this rank publishes to every peer (at most kMaxTransportBlob bytes).
  virtual std::string blob() const = 0;
  // Connects to `peers` (ranks that chose this transport for this rank: the same choice is
  // made on their side). `all` holds every rank of the communicator, indexed by rank, with
  // this transport's blobs. Returns connections [i][channel] for peers[i]. Called on every
  // rank that opened the transport as soon as any pair of the communicator uses it (`peers`
  // may then be empty), so a transport may lay out shared state among all its ranks. Bounded
  // by `deadline`; an error names the peers still missing.
  virtual Result<ConnectionTable> connect(const std::vector<EndpointInfo>& all,
                                          const std::vector<int>& peers, Deadline deadline) = 0;
  // The factory of this transport's keys for registered memory (registration_key.h), or an
  // empty function when it uses none. Asked once, after open(); core adds it to the
  // communicator's registration cache and removes it, destroying every key it made, after the
  // connections are closed and before this instance is destroyed. The factory runs on the
  // thread driving the communicator; keys may be destroyed on another (one deregistering).
  virtual KeyFactory key_factory() { return {}; }
};

// Link figures used to choose among transports that reach a peer (microseconds, GB/s). A
// tuner file (CHORUS_TUNER_FILE, written by `chorus-info --tune` from measurements) overrides
// a transport's declared defaults.
struct LinkCost {
  double alpha_us = 10;
  double beta_gbps = 1;
  double time_us(size_t bytes) const { return alpha_us + static_cast<double>(bytes) / (beta_gbps * 1e3); }
};

struct TransportDesc {
  const char* name = "";  // lower case; CHORUS_TRANSPORT=<NAME> forces it (any case)
  const char* summary = "";
  TransportCaps caps;
  LinkCost cost;           // declared typical figures; replaced by measured ones when known
  // Is the transport usable in this process for this communicator? Opens its resources.
  // A null instance (or an error, logged as a warning) means "not here": peers then choose
  // another transport to this rank.
  Result<std::unique_ptr<TransportInstance>> (*open)(const TransportContext& ctx) = nullptr;
  // Whether `a` can reach `b` over this transport, from their published infos (both blobs
  // non-empty; the caps' reach is checked before). Must be symmetric. Null: always.
  bool (*reaches)(const EndpointInfo& a, const EndpointInfo& b) = nullptr;
};

// Registers a transport (called by the generated transports/builtin.cc at first use).
void register_transport(const TransportDesc* desc);
// Every registered transport, in registration order.
const std::vector<const TransportDesc*>& transports();
// The transport named `name` (any case), or null.
const TransportDesc* find_transport(std::string_view name);

}  // namespace chorus
