// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/root_server_fuzz.cc
// The bootstrap root server (src/bootstrap/root_server.cc, root_protocol.cc) fed by clients that
// know the secret but send anything after the handshake: what the root does with HELLO, FORWARD,
// ENTRY and unexpected frames (configure(), the group arithmetic of ncclCommInitRankScalable,
// the per-rank tables). A real RootServer runs on its own thread on a loopback listener; up to
// 3 clients connect, authenticate (unless told not to) and send their bytes, then close their
// sending side; the harness reads what the root answers until it closes, then stops it.
// Input, per client after u8 clients (1 + n % 3):
//   u8 flags (bit 0: skip the handshake, send raw bytes) | u16 length | bytes (frames)
// The root address of scalable HELLOs is pointed at this root itself, so that a group root's
// upstream link never leaves the machine. Invariants: the root answers only with well-formed
// frames, and it always stops.
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "bootstrap/root_server.h"
#include "net/socket.h"
#include "fuzz_common.h"

using namespace chorus;
using namespace chorus::bootstrap;
using chorus::fuzz::Input;

namespace {

constexpr uint64_t kUid = 0x1234abcd;

Secret fixed_secret() {
  Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = static_cast<uint8_t>(0x3c + i);
  return s;
}

// Points the root-0 address of every scalable HELLO at `self`.
std::string confine(std::string_view in, const net::SockAddr& self) {
  std::string out(in);
  size_t pos = 0;
  while (pos + wire::kHeaderBytes <= out.size()) {
    wire::FrameHeader h;
    if (!wire::parse_header(reinterpret_cast<const uint8_t*>(out.data() + pos), &h).ok()) break;
    size_t payload = pos + wire::kHeaderBytes;
    constexpr size_t kNrootsAt = 20, kAddrAt = 28;  // encode_hello's layout
    if (h.type == wire::FrameType::kHello && h.length >= kAddrAt + wire::kAddrBytes &&
        payload + kAddrAt + wire::kAddrBytes <= out.size() &&
        wire::get_u32(reinterpret_cast<const uint8_t*>(out.data() + payload + kNrootsAt)) > 1) {
      wire::Writer w;
      wire::put_addr(w, self);
      std::string addr = w.take();
      out.replace(payload + kAddrAt, addr.size(), addr);
    }
    pos = payload + h.length;
  }
  return out;
}

// Checks that `in` is a sequence of well-formed frames (the last one may be cut off).
void check_answer(std::string_view in) {
  while (in.size() >= wire::kHeaderBytes) {
    wire::FrameHeader h;
    FUZZ_CHECK(wire::parse_header(reinterpret_cast<const uint8_t*>(in.data()), &h).ok());
    FUZZ_CHECK(h.type != wire::FrameType::kHello && h.type != wire::FrameType::kForward);
    size_t n = std::min<size_t>(in.size(), wire::kHeaderBytes + h.length);
    in.remove_prefix(n);
  }
}

struct Client {
  UniqueFd fd;
  std::string send;
  std::string answer;
  bool authed = false;  // the answer is frames (else handshake bytes)
  bool eof = false;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  size_t nclients = 1 + input.u8() % 3;

  net::SockAddr self;
  auto listen = net::listen_socket(net::SockAddr::parse("127.0.0.1", 0).value(), &self);
  if (!listen.ok()) return 0;
  UniqueFd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  UniqueId id;
  id.root = self;
  id.secret = fixed_secret();
  id.comm_uid = kUid;
  detail::RootServer server(std::move(listen).value(), wake.get(), id, /*timeout_ms=*/10000);
  std::thread thread([&] { server.run(); });

  std::vector<Client> clients(nclients);
  Deadline deadline = Deadline::after_ms(2000);
  for (Client& c : clients) {
    uint8_t flags = input.u8();
    std::string_view bytes = input.bytes(input.u16());
    auto fd = net::connect_socket(self, deadline);
    if (!fd.ok()) continue;  // the root finished already
    c.fd = std::move(fd).value();
    if (!(flags & 1) &&
        !auth_initiator(c.fd.get(), id.secret, kBootstrapContext, deadline).ok()) {
      c.fd.reset();
      continue;
    }
    c.authed = !(flags & 1);
    c.send = c.authed ? confine(bytes, self) : std::string(bytes);
  }
  for (Client& c : clients) {
    if (!c.fd.valid()) continue;
    // The root drops what it cannot use; a broken pipe only means it already did.
    (void)net::send_all(c.fd.get(), c.send.data(), c.send.size(), Deadline::after_ms(1000));
    shutdown(c.fd.get(), SHUT_WR);
  }
  // Read every answer until the root closes the connection (bounded: a client that is still a
  // rank in good standing would wait for the table).
  Deadline reading = Deadline::after_ms(300);
  for (bool waiting = true; waiting && !reading.expired();) {
    waiting = false;
    for (Client& c : clients) {
      if (!c.fd.valid() || c.eof) continue;
      char buf[4096];
      ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) c.answer.append(buf, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) c.eof = true;
      waiting |= !c.eof;
    }
    if (waiting) poll(nullptr, 0, 1);
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake.get(), &one, sizeof(one));
  thread.join();
  for (const Client& c : clients)
    if (c.authed) check_answer(c.answer);
  return 0;
}
