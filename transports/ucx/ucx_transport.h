// SPDX-License-Identifier: Apache-2.0
// File: transports/ucx/ucx_transport.h
// The UCX transport: tagged messages through UCP (ucp_tag_send_nbx / ucp_tag_recv_nbx), one
// UCP worker per communicator rank, one endpoint per peer shared by its channels. README.md
// describes the design and the wire format; this header holds what the tests drive directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transports/registry.h"
#include "transports/transport.h"

namespace chorus::ucx {

// ---- Wire format (README.md) ----------------------------------------------------------------

// What a 64-bit UCP tag carries (always matched with a full mask):
//   bits 63..40  24-bit hash of the communicator's uid
//   bits 39..36  kind of message (Kind)
//   bits 35..28  channel
//   bits 27..0   rank of the sender
enum class Kind : uint8_t { kHeader = 0, kPayload = 1, kFarewell = 2, kHello = 3 };
inline constexpr int kMaxChannels = 256;
inline constexpr int kMaxRanks = 1 << 28;
uint32_t comm_hash(uint64_t comm_uid);
uint64_t make_tag(uint32_t comm_hash, Kind kind, int channel, int src_rank);

// Header of every message (kind kHeader), host byte order as in the TCP transport. A payload of
// at most kMaxInlineBytes follows the header in the same UCP message; a larger one follows as
// ceil(bytes / chunk_bytes) kPayload messages of chunk_bytes each (the last one shorter).
struct WireHeader {
  uint32_t magic;        // kMsgMagic, or kFarewellMagic
  uint32_t code;         // farewell: the Status code; else 0
  MsgTag tag;            // the sender's tag (zero in a farewell)
  uint64_t bytes;        // payload bytes; farewell: bytes of reason text that follow
  uint64_t chunk_bytes;  // 0: the payload is inline; else the size of its kPayload messages
};
static_assert(sizeof(WireHeader) == 48);
inline constexpr size_t kHeaderBytes = sizeof(WireHeader);
inline constexpr uint32_t kMsgMagic = 0x4348554d;       // "CHUM"
inline constexpr uint32_t kFarewellMagic = 0x43484657;  // "CHFW", as TCP's
// Largest header message (header + inline payload): UCX over TCP sends up to 8185 bytes as
// eager-short, so small messages need one UCP message and no rendezvous.
inline constexpr size_t kMaxHeaderMsgBytes = 8192;
inline constexpr size_t kMaxInlineBytes = kMaxHeaderMsgBytes - kHeaderBytes;
inline constexpr size_t kDefaultChunkBytes = size_t{4} << 20;
inline constexpr size_t kMinChunkBytes = 64;
inline constexpr size_t kMaxChunkBytes = size_t{1} << 30;

// The hello each side sends on every (peer, channel) once the endpoints exist (kind kHello),
// 64 bytes little-endian:
//   u32 magic 'CHUH' | u32 version 1 | u32 from | u32 to | u32 channel | u32 0 | u64 comm_uid |
//   mac[32] = HMAC-SHA256(secret, "chorus-ucx" || the 32 bytes before mac)
inline constexpr uint32_t kHelloMagic = 0x43485548;  // "CHUH"
inline constexpr size_t kHelloBytes = 64;
struct Hello {
  int from = -1;
  int to = -1;
  int channel = 0;
  uint64_t comm_uid = 0;
};
void encode_hello(const Hello& hello, const net::Secret& secret, uint8_t out[kHelloBytes]);
// Checks `in` (of `bytes` bytes) against `expected`: kRemoteError "... rejected: wrong secret"
// when the MAC does not prove `secret`, another kRemoteError when it is malformed or names
// other ranks, channel or communicator. `peer` names the sender in the message.
Status check_hello(const uint8_t* in, size_t bytes, const Hello& expected,
                   const net::Secret& secret, const std::string& peer);

// ---- Instances ------------------------------------------------------------------------------

// Settings of an instance. The registered transport uses the defaults; tests choose UCX's
// transports per instance here instead of through the environment.
struct UcxOptions {
  // UCX settings applied on top of the environment's UCX_* variables, named without the
  // "UCX_" prefix: {{"TLS", "tcp,self"}, {"NET_DEVICES", "lo"}}. Instances with equal settings
  // (in this process) share one UCP context.
  std::vector<std::pair<std::string, std::string>> config;
  // Size of the kPayload messages a large send is cut into (a multiple of 64, 64 .. 1 GiB).
  size_t chunk_bytes = kDefaultChunkBytes;
};

// Opens the UCX transport for one communicator rank: its UCP worker (and the process's UCP
// context, on first use). Errors: kInvalidArgument for bad options or context; kSystemError
// when UCX cannot be initialised.
Result<std::unique_ptr<TransportInstance>> open_instance(const TransportContext& ctx,
                                                         const UcxOptions& options);

// The UCX transports (lanes) an instance's endpoint to `peer` uses, as UCX prints them
// ("tcp/lo ..."), or an empty string when there is none. For logs and tests.
std::string describe_lanes(TransportInstance* instance, int peer);

// Registers the transport "ucx" (called by the generated transports/builtin.cc).
void register_transport();

}  // namespace chorus::ucx
