// SPDX-License-Identifier: Apache-2.0
// File: src/net/auth.h
// Shared secrets and the mutual challenge-response handshake that every bootstrap and TCP
// connection runs first. Both ends prove they know the secret without sending it.
//
// Wire format (all integers little-endian):
//   initiator -> responder  hello      u32 magic 'CHAU', u32 version, nonce_i[32]
//   responder -> initiator  challenge  u32 magic, u32 version, nonce_r[32], proof_r[32]
//   initiator -> responder  proof      u32 magic, proof_i[32]
//   responder -> initiator  verdict    u32 magic, u32 0 (accepted) | 1 (rejected)
// proof_X = HMAC-SHA256(secret, X || u32 len(context) || context || nonce_i || nonce_r) where X
// is 'R' or 'I', so one side's proof can never be replayed as the other's; the initiator
// checks the responder before it reveals its own proof. `context` separates domains (the
// bootstrap root, the TCP transport of one communicator ...). Both ends then share a fresh
// session key, HMAC-SHA256(secret, 'K' || ... same input).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"

namespace chorus::net {

struct Secret {
  std::array<uint8_t, 32> bytes{};

  // 32 bytes from the kernel's random source.
  static Secret random();
  // HMAC-SHA256(bytes, label): an independent key for another purpose.
  Secret derive(std::string_view label) const;
  bool operator==(const Secret& other) const;  // constant time
};

// A non-blocking handshake over one socket, driven by the caller's poll loop.
// Not thread-safe; one instance per connection.
class Handshake {
 public:
  enum class Role : uint8_t { kInitiator, kResponder };

  // `peer` names the other end in error messages (e.g. "192.0.2.3:4000").
  Handshake(Role role, const Secret& secret, std::string_view context, std::string peer);

  // Moves the handshake on with non-blocking IO on `fd`. Returns the poll events it now waits
  // for (POLLIN or POLLOUT), or 0 once both ends are authenticated. Errors: kRemoteError
  // "authentication failed ..." when either end does not prove the secret or the peer does not
  // speak this protocol; kRemoteError when the peer closes; kSystemError on socket errors.
  // After an error the connection must be dropped.
  Result<short> advance(int fd);
  bool done() const { return phase_ == Phase::kDone; }
  // A key known only to the two ends, fresh for this connection. Valid once done().
  const Secret& session_key() const { return session_key_; }
  // True once advance() failed because a proof, verdict or protocol field was wrong (retrying
  // cannot help), as opposed to the connection breaking.
  bool auth_failed() const { return auth_failed_; }

 private:
  enum class Phase : uint8_t {
    // Initiator.
    kSendHello,
    kRecvChallenge,
    kSendProof,
    kRecvVerdict,
    // Responder.
    kRecvHello,
    kSendChallenge,
    kRecvProof,
    kSendVerdict,
    kDone,
  };
  static constexpr size_t kBufBytes = 72;

  // The step that follows the completed IO of the current phase.
  Status on_io_complete();
  Status on_challenge();
  Status on_proof();
  // Enters `next`, which moves `bytes` of buf_ (direction implied by the phase).
  void start(Phase next, size_t bytes);
  Secret mac(char label) const;

  Role role_;
  Phase phase_;
  Secret secret_;
  std::string context_;
  std::string peer_;
  std::array<uint8_t, 32> nonce_i_{};
  std::array<uint8_t, 32> nonce_r_{};
  Secret session_key_;
  std::array<uint8_t, kBufBytes> buf_{};
  size_t want_ = 0;      // bytes of buf_ to move in this phase
  size_t moved_ = 0;     // bytes moved so far
  bool reject_ = false;  // responder: the initiator's proof was wrong
  bool auth_failed_ = false;
};

// Blocking forms of the handshake (poll until `deadline`). Failure to prove -> kRemoteError
// "authentication failed with <peer> ..."; deadline -> kRemoteError naming the peer.
// `session_key`, if given, receives the session key.
Status auth_initiator(int fd, const Secret& secret, std::string_view context, Deadline deadline,
                      Secret* session_key = nullptr);
Status auth_responder(int fd, const Secret& secret, std::string_view context, Deadline deadline,
                      Secret* session_key = nullptr);

}  // namespace chorus::net
