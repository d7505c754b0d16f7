// SPDX-License-Identifier: Apache-2.0
// File: src/net/auth.cc
// HMAC-SHA256 challenge-response (see auth.h for the wire format).
#include "net/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "net/socket.h"
#include "common/bytes.h"
#include "common/fork_safe_mutex.h"
#include "common/log.h"
#include "common/process.h"

namespace chorus::net {

namespace {

constexpr uint32_t kAuthMagic = 0x43484155;  // "CHAU"
constexpr uint32_t kAuthVersion = 1;
constexpr size_t kHelloBytes = 40;
constexpr size_t kChallengeBytes = 72;
constexpr size_t kProofBytes = 36;
constexpr size_t kVerdictBytes = 8;
constexpr uint32_t kAccepted = 0;
constexpr uint32_t kRejected = 1;

// Every OpenSSL call of ours runs under this lock, which fork() waits for: OpenSSL's own locks
// (its algorithm store, taken by HMAC) have no fork handlers, and a rank forked while the
// bootstrap root thread authenticated another would otherwise hang in its first HMAC.
ForkSafeMutex g_openssl_mutex;

// OpenSSL frees its global state from an atexit handler by default. The bootstrap root is a
// background thread that may still be authenticating a rank while the process exits, and would
// then take a lock OpenSSL has just destroyed (TSan caught it): keep the state for the process.
void init_openssl() {
  static const bool done = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  (void)done;
}

Secret hmac(const Secret& key, const void* data, size_t bytes) {
  Secret out;
  unsigned int len = 0;
  std::lock_guard<ForkSafeMutex> lock(g_openssl_mutex);
  init_openssl();
  HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()),
       static_cast<const unsigned char*>(data), bytes, out.bytes.data(), &len);
  return out;
}

void fill_random(uint8_t* out, size_t bytes) {
  if (random_bytes(out, bytes)) return;
  {
    std::lock_guard<ForkSafeMutex> lock(g_openssl_mutex);
    init_openssl();
    if (RAND_bytes(out, static_cast<int>(bytes)) == 1) return;
  }
  // A predictable secret or nonce would silently defeat authentication: refuse to go on.
  CHORUS_WARN(kBootstrap, "no source of random bytes (getrandom and RAND_bytes failed); aborting");
  std::abort();
}

}  // namespace

Secret Secret::random() {
  Secret s;
  fill_random(s.bytes.data(), s.bytes.size());
  return s;
}

Secret Secret::derive(std::string_view label) const {
  return hmac(*this, label.data(), label.size());
}

bool Secret::operator==(const Secret& other) const {
  return CRYPTO_memcmp(bytes.data(), other.bytes.data(), bytes.size()) == 0;
}

// ---- Handshake ------------------------------------------------------------------------------

Handshake::Handshake(Role role, const Secret& secret, std::string_view context, std::string peer)
    : role_(role), secret_(secret), context_(context), peer_(std::move(peer)) {
  if (role_ == Role::kInitiator) {
    fill_random(nonce_i_.data(), nonce_i_.size());
    le::put_u32(&buf_[0], kAuthMagic);
    le::put_u32(&buf_[4], kAuthVersion);
    std::memcpy(&buf_[8], nonce_i_.data(), 32);
    phase_ = Phase::kSendHello;
    want_ = kHelloBytes;
  } else {
    phase_ = Phase::kRecvHello;
    want_ = kHelloBytes;
  }
}

Secret Handshake::mac(char label) const {
  std::string input;
  input.reserve(1 + 4 + context_.size() + 64);
  input.push_back(label);
  uint8_t len[4];
  le::put_u32(len, static_cast<uint32_t>(context_.size()));
  input.append(reinterpret_cast<const char*>(len), 4);
  input.append(context_);
  input.append(reinterpret_cast<const char*>(nonce_i_.data()), nonce_i_.size());
  input.append(reinterpret_cast<const char*>(nonce_r_.data()), nonce_r_.size());
  return hmac(secret_, input.data(), input.size());
}

void Handshake::start(Phase next, size_t bytes) {
  phase_ = next;
  want_ = bytes;
  moved_ = 0;
}

Result<short> Handshake::advance(int fd) {
  while (phase_ != Phase::kDone) {
    bool writing = phase_ == Phase::kSendHello || phase_ == Phase::kSendChallenge ||
                   phase_ == Phase::kSendProof || phase_ == Phase::kSendVerdict;
    Result<size_t> n = writing ? net::send_some(fd, buf_.data() + moved_, want_ - moved_)
                               : net::recv_some(fd, buf_.data() + moved_, want_ - moved_);
    if (!n.ok()) {
      Status status = n.take_status();
      if (reject_) break;  // the rejected peer hung up first: report the rejection below
      return status.with_context(fmt::format("authentication with {}", peer_));
    }
    moved_ += *n;
    if (moved_ < want_) return static_cast<short>(writing ? POLLOUT : POLLIN);
    Status status = on_io_complete();
    if (!status.ok()) {
      auth_failed_ = true;
      return status;
    }
  }
  if (reject_) {
    auth_failed_ = true;
    return remote_error(
        "authentication failed: {} did not prove knowledge of the secret "
        "(a wrong ncclUniqueId, another communicator, or not a Chorus peer)",
        peer_);
  }
  return short{0};
}

Status Handshake::on_io_complete() {
  switch (phase_) {
    case Phase::kSendHello:
      start(Phase::kRecvChallenge, kChallengeBytes);
      return ok_status();
    case Phase::kRecvChallenge:
      return on_challenge();
    case Phase::kSendProof:
      start(Phase::kRecvVerdict, kVerdictBytes);
      return ok_status();
    case Phase::kRecvVerdict:
      if (le::get_u32(&buf_[0]) != kAuthMagic || le::get_u32(&buf_[4]) != kAccepted) {
        return remote_error(
            "authentication failed: {} rejected our proof of the secret "
            "(the ranks hold different ncclUniqueIds or secrets?)",
            peer_);
      }
      phase_ = Phase::kDone;
      return ok_status();
    case Phase::kRecvHello: {
      if (le::get_u32(&buf_[0]) != kAuthMagic || le::get_u32(&buf_[4]) != kAuthVersion) {
        return remote_error(
            "authentication failed: {} does not speak the Chorus handshake "
            "(magic 0x{:08x}, version {})",
            peer_, le::get_u32(&buf_[0]), le::get_u32(&buf_[4]));
      }
      std::memcpy(nonce_i_.data(), &buf_[8], 32);
      fill_random(nonce_r_.data(), nonce_r_.size());
      Secret proof_r = mac('R');
      le::put_u32(&buf_[0], kAuthMagic);
      le::put_u32(&buf_[4], kAuthVersion);
      std::memcpy(&buf_[8], nonce_r_.data(), 32);
      std::memcpy(&buf_[40], proof_r.bytes.data(), 32);
      start(Phase::kSendChallenge, kChallengeBytes);
      return ok_status();
    }
    case Phase::kSendChallenge:
      start(Phase::kRecvProof, kProofBytes);
      return ok_status();
    case Phase::kRecvProof:
      return on_proof();
    case Phase::kSendVerdict:
      phase_ = Phase::kDone;
      return ok_status();
    case Phase::kDone:
      break;
  }
  return ok_status();
}

Status Handshake::on_challenge() {
  if (le::get_u32(&buf_[0]) != kAuthMagic || le::get_u32(&buf_[4]) != kAuthVersion) {
    return remote_error(
        "authentication failed: {} does not speak the Chorus handshake "
        "(magic 0x{:08x}, version {})",
        peer_, le::get_u32(&buf_[0]), le::get_u32(&buf_[4]));
  }
  std::memcpy(nonce_r_.data(), &buf_[8], 32);
  Secret claimed;
  std::memcpy(claimed.bytes.data(), &buf_[40], 32);
  if (!(claimed == mac('R'))) {
    return remote_error(
        "authentication failed: {} does not know the secret (a wrong "
        "ncclUniqueId, or another communicator's endpoint)",
        peer_);
  }
  Secret proof_i = mac('I');
  session_key_ = mac('K');
  le::put_u32(&buf_[0], kAuthMagic);
  std::memcpy(&buf_[4], proof_i.bytes.data(), 32);
  start(Phase::kSendProof, kProofBytes);
  return ok_status();
}

Status Handshake::on_proof() {
  Secret claimed;
  std::memcpy(claimed.bytes.data(), &buf_[4], 32);
  reject_ = le::get_u32(&buf_[0]) != kAuthMagic || !(claimed == mac('I'));
  if (!reject_) session_key_ = mac('K');
  le::put_u32(&buf_[0], kAuthMagic);
  le::put_u32(&buf_[4], reject_ ? kRejected : kAccepted);
  start(Phase::kSendVerdict, kVerdictBytes);
  return ok_status();
}

// ---- Blocking forms -------------------------------------------------------------------------

namespace {

Status run_handshake(Handshake::Role role, int fd, const Secret& secret, std::string_view context,
                     Deadline deadline, Secret* session_key) {
  std::string peer = net::peer_name(fd);
  Handshake hs(role, secret, context, peer);
  int64_t start_ns = now_ns();
  for (;;) {
    CHORUS_ASSIGN_OR_RETURN(short events, hs.advance(fd));
    if (events == 0) break;
    if (deadline.expired()) {
      return remote_error("authentication with {} timed out after {} ms", peer,
                          (now_ns() - start_ns) / 1000000);
    }
    CHORUS_ASSIGN_OR_RETURN(short revents, net::poll_one(fd, events, deadline.remaining_ms(1000)));
    (void)revents;
  }
  if (session_key != nullptr) *session_key = hs.session_key();
  return ok_status();
}

}  // namespace

Status auth_initiator(int fd, const Secret& secret, std::string_view context, Deadline deadline,
                      Secret* session_key) {
  return run_handshake(Handshake::Role::kInitiator, fd, secret, context, deadline, session_key);
}

Status auth_responder(int fd, const Secret& secret, std::string_view context, Deadline deadline,
                      Secret* session_key) {
  return run_handshake(Handshake::Role::kResponder, fd, secret, context, deadline, session_key);
}

}  // namespace chorus::net
