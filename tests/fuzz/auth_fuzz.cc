// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/auth_fuzz.cc
// The authentication handshake (src/net/auth.h), the first bytes every bootstrap and TCP
// connection reads. Input byte 0 picks the mode:
//   bit 0 = 0  a hostile peer: one real Handshake (initiator or responder, bit 1) reads the
//              rest of the input as everything the peer sends, split into pieces of
//              1 + (byte 1 % 80) bytes;
//   bit 0 = 1  a man in the middle: a real initiator and a real responder with the same secret
//              talk through a relay that XORs the stream in each direction with a mask from
//              the input (u8 length + mask bytes per direction).
// Invariants: the hostile peer never authenticates (it cannot know the secret); through the
// relay both ends succeed with the same session key when the masks are all zero, and an end
// that succeeds always agrees with the other end on the key.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>

#include "net/auth.h"
#include "fuzz_common.h"

using chorus::net::Handshake;
using chorus::net::Secret;
using chorus::fuzz::Input;

namespace {

Secret fixed_secret() {
  Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = static_cast<uint8_t>(0xa5 ^ i);
  return s;
}

struct Pair {
  int fd[2] = {-1, -1};
  bool open() { return socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fd) == 0; }
  ~Pair() {
    if (fd[0] >= 0) close(fd[0]);
    if (fd[1] >= 0) close(fd[1]);
  }
};

void hostile_peer(Input& input, bool initiator) {
  size_t step = 1 + input.u8() % 80;
  std::string_view peer_bytes = input.rest();
  Pair p;
  if (!p.open()) return;
  Handshake hs(initiator ? Handshake::Role::kInitiator : Handshake::Role::kResponder,
               fixed_secret(), "fuzz", "fuzz-peer");
  size_t off = 0;
  bool shut = false;
  for (int iter = 0; iter < 10000; ++iter) {
    if (off < peer_bytes.size())
      off += chorus::fuzz::write_some(p.fd[1], peer_bytes.substr(off, step));
    if (off == peer_bytes.size() && !shut) {
      shutdown(p.fd[1], SHUT_WR);
      shut = true;
    }
    auto r = hs.advance(p.fd[0]);
    chorus::fuzz::drain(p.fd[1]);
    if (!r.ok()) return;
    // Without the secret the peer cannot produce a proof that verifies.
    FUZZ_CHECK(*r != 0);
    FUZZ_CHECK(!hs.done());
  }
}

// Relays what `from` wrote to `to`, XORing stream byte i with mask[i % mask.size()].
void relay(int from, int to, std::string_view mask, size_t* pos) {
  char buf[256];
  ssize_t n = ::recv(from, buf, sizeof(buf), MSG_DONTWAIT);
  if (n <= 0) return;
  for (ssize_t i = 0; i < n; ++i, ++*pos) {
    if (!mask.empty()) buf[i] = static_cast<char>(buf[i] ^ mask[*pos % mask.size()]);
  }
  // Handshake messages are small: the socket buffer always takes them whole.
  FUZZ_CHECK(chorus::fuzz::write_some(to, std::string_view(buf, static_cast<size_t>(n))) ==
             static_cast<size_t>(n));
}

void man_in_the_middle(Input& input) {
  std::string_view mask_ir = input.bytes(input.u8());  // initiator -> responder
  std::string_view mask_ri = input.bytes(input.u8());  // responder -> initiator
  bool clean = std::all_of(mask_ir.begin(), mask_ir.end(), [](char c) { return c == 0; }) &&
               std::all_of(mask_ri.begin(), mask_ri.end(), [](char c) { return c == 0; });
  Pair a, b;  // initiator on a.fd[0], responder on b.fd[0]; the relay holds a.fd[1], b.fd[1]
  if (!a.open() || !b.open()) return;
  Handshake ini(Handshake::Role::kInitiator, fixed_secret(), "fuzz", "responder");
  Handshake res(Handshake::Role::kResponder, fixed_secret(), "fuzz", "initiator");
  bool ini_failed = false, res_failed = false;
  size_t pos_ir = 0, pos_ri = 0;
  for (int iter = 0; iter < 200; ++iter) {
    if (!ini_failed && !ini.done()) ini_failed = !ini.advance(a.fd[0]).ok();
    if (!res_failed && !res.done()) res_failed = !res.advance(b.fd[0]).ok();
    if (ini_failed) shutdown(a.fd[0], SHUT_RDWR);
    if (res_failed) shutdown(b.fd[0], SHUT_RDWR);
    relay(a.fd[1], b.fd[1], mask_ir, &pos_ir);
    relay(b.fd[1], a.fd[1], mask_ri, &pos_ri);
    bool ini_over = ini_failed || ini.done(), res_over = res_failed || res.done();
    if (ini_over && res_over) break;
    // One side waits for bytes the other, having failed, will never send.
    if ((ini_failed && !res_over) || (res_failed && !ini_over)) {
      shutdown(a.fd[1], SHUT_RDWR);
      shutdown(b.fd[1], SHUT_RDWR);
    }
  }
  if (clean) FUZZ_CHECK(ini.done() && res.done());
  // Neither end can be made to accept a tampered nonce or proof: ends that both succeed saw
  // the same nonces and so derived the same key.
  if (ini.done() && res.done()) FUZZ_CHECK(ini.session_key() == res.session_key());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  uint8_t mode = input.u8();
  if (mode & 1)
    man_in_the_middle(input);
  else
    hostile_peer(input, (mode & 2) != 0);
  return 0;
}
