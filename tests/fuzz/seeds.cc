// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/seeds.cc
// Writes the seed corpora (tests/fuzz/corpus/<target>/) with the library's own encoders: a few
// valid messages per target, in the input layout each target documents.
//   fuzz_seeds <corpus dir>        (the committed seeds were made this way)
#include <netinet/in.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <cstring>
#include <string>

#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "core/comm.h"
#include "fuzz_requests.h"
#include "transports/shm/shm_connection.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_transport.h"
#if CHORUS_SEEDS_VERBS  // the build has the verbs transport
#include "transports/verbs/verbs_wire.h"
#endif

using namespace chorus;
using fuzz::put_le;
namespace wire = bootstrap::wire;

namespace {

std::string g_root;

void write_seed(const std::string& target, const std::string& name, const std::string& bytes) {
  std::string dir = g_root + "/" + target;
  mkdir(g_root.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

net::SockAddr addr(const char* ip, uint16_t port) { return net::SockAddr::parse(ip, port).value(); }

net::Secret secret(uint8_t seed) {
  net::Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return s;
}

MsgTag tag(CollKind coll, uint32_t seq, uint64_t count, DataType dtype, int root = -1) {
  MsgTag t;
  t.seq = seq;
  t.coll = static_cast<uint8_t>(coll);
  t.dtype = static_cast<uint8_t>(dtype);
  t.count = count;
  t.root = root;
  return t;
}

std::string payload(size_t bytes, uint8_t seed) {
  std::string p(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<char>(seed + i * 13);
  return p;
}

void bootstrap_wire() {
  // What a root reads from a rank, and from a group root.
  wire::Hello hello;
  hello.rank = 2;
  hello.nranks = 4;
  hello.comm_uid = 0x1234abcd;
  std::string blob = payload(40, 1);
  hello.blob = blob;
  std::string s(1, '\x07');  // piece size byte
  wire::append_frame(&s, wire::FrameType::kHello, wire::encode_hello(hello));
  write_seed("bootstrap_wire", "hello", s);

  hello.nroots = 2;
  hello.group = 1;
  hello.root0 = addr("10.1.2.3", 4000);
  hello.root0_uid = 0x77;
  hello.root0_secret_wrapped = secret(3);
  s.assign(1, '\x03');
  wire::append_frame(&s, wire::FrameType::kHello, wire::encode_hello(hello));
  write_seed("bootstrap_wire", "hello_scalable", s);

  s.assign(1, '\x20');
  wire::Forward f{6, 2, 1, 0x1234abcd, 3};
  wire::append_frame(&s, wire::FrameType::kForward, wire::encode_forward(f));
  for (uint32_t r = 3; r < 6; ++r)
    wire::append_frame(&s, wire::FrameType::kEntry, wire::encode_entry(r, payload(r * 5, r)));
  write_seed("bootstrap_wire", "forward", s);

  // What a rank reads from its root.
  s.assign(1, '\x0c');
  wire::append_frame(&s, wire::FrameType::kProgress, wire::encode_pair(1, 3));
  std::string n3;
  put_le(&n3, 3, 4);
  wire::append_frame(&s, wire::FrameType::kTable, n3);
  for (uint32_t r = 0; r < 3; ++r)
    wire::append_frame(&s, wire::FrameType::kEntry, wire::encode_entry(r, payload(24, r)));
  write_seed("bootstrap_wire", "table", s);

  s.assign(1, '\x40');
  wire::append_frame(&s, wire::FrameType::kError, "rank 5 is out of range for 3 ranks");
  write_seed("bootstrap_wire", "error", s);
}

// root_server: u8 clients, then per client u8 flags, u16 length, bytes (uid 0x1234abcd).
void root_client(std::string* s, uint8_t flags, const std::string& bytes) {
  put_le(s, flags, 1);
  put_le(s, bytes.size(), 2);
  *s += bytes;
}

std::string hello_frame(int rank, int nranks, uint32_t nroots = 1, uint64_t root0_uid = 0) {
  wire::Hello h;
  h.rank = rank;
  h.nranks = nranks;
  h.nroots = nroots;
  h.group = wire::group_of(rank, nranks, nroots);
  h.comm_uid = 0x1234abcd;
  h.root0 = addr("127.0.0.1", 1);  // the harness points it at the root itself
  h.root0_uid = root0_uid;
  h.root0_secret_wrapped = secret(7);
  std::string blob = payload(16 + rank, static_cast<uint8_t>(rank));
  h.blob = blob;
  std::string f;
  wire::append_frame(&f, wire::FrameType::kHello, wire::encode_hello(h));
  return f;
}

void root_server() {
  std::string s;
  put_le(&s, 1, 1);  // 2 clients
  root_client(&s, 0, hello_frame(0, 2));
  root_client(&s, 0, hello_frame(1, 2));
  write_seed("root_server", "two_ranks", s);

  s.clear();
  put_le(&s, 0, 1);  // 1 client: a rank that joins and leaves
  root_client(&s, 0, hello_frame(1, 3));
  write_seed("root_server", "one_of_three", s);

  // Root 0 of a scalable communicator: rank 0 joins, the root of group 1 forwards ranks 2, 3.
  s.clear();
  put_le(&s, 1, 1);
  root_client(&s, 0, hello_frame(0, 4, 2, 0x1234abcd) + hello_frame(1, 4, 2, 0x1234abcd));
  std::string fwd;
  wire::append_frame(&fwd, wire::FrameType::kForward,
                     wire::encode_forward(wire::Forward{4, 2, 1, 0x1234abcd, 2}));
  for (uint32_t r = 2; r < 4; ++r)
    wire::append_frame(&fwd, wire::FrameType::kEntry, wire::encode_entry(r, payload(8, r)));
  root_client(&s, 0, fwd);
  write_seed("root_server", "forward_to_root0", s);

  // A group root: ranks 2 and 3 of 4 (group 1 of 2) join; it then links up to "root 0".
  s.clear();
  put_le(&s, 1, 1);
  root_client(&s, 0, hello_frame(2, 4, 2, 0x77));
  root_client(&s, 0, hello_frame(3, 4, 2, 0x77));
  write_seed("root_server", "group_root", s);

  // Not a Chorus peer at all.
  s.clear();
  put_le(&s, 0, 1);
  root_client(&s, 1, "GET / HTTP/1.0\r\n\r\n");
  write_seed("root_server", "unauthenticated", s);
}

void auth() {
  // Hostile responder input: a well-formed hello then a proof (that cannot verify).
  std::string s(1, '\x00');
  s.push_back('\x09');
  put_le(&s, 0x43484155, 4);  // 'CHAU'
  put_le(&s, 1, 4);
  s += payload(32, 9);
  put_le(&s, 0x43484155, 4);
  s += payload(32, 4);
  write_seed("auth", "responder_hostile", s);
  // Hostile initiator input: a challenge with a wrong proof.
  s.assign(1, '\x02');
  s.push_back('\x30');
  put_le(&s, 0x43484155, 4);
  put_le(&s, 1, 4);
  s += payload(64, 5);
  write_seed("auth", "initiator_hostile", s);
  // Man in the middle that changes nothing, and one that flips a proof bit.
  write_seed("auth", "relay_clean", std::string("\x01\x00\x00", 3));
  s = std::string("\x01", 1);
  s.push_back(static_cast<char>(41));
  s += std::string(40, '\0') + "\x01";
  s.push_back('\0');
  write_seed("auth", "relay_flip_proof", s);
}

void unique_id() {
  bootstrap::UniqueId id;
  id.root = addr("192.0.2.7", 41234);
  id.secret = secret(1);
  id.comm_uid = 0xfeedface12345678ull;
  char bytes[bootstrap::kUniqueIdBytes];
  bootstrap::encode_unique_id(id, bytes);
  write_seed("unique_id", "ipv4", std::string(bytes, sizeof(bytes)));
  id.root = addr("fe80::1", 5000);
  reinterpret_cast<sockaddr_in6*>(&id.root.storage)->sin6_scope_id = 2;
  bootstrap::encode_unique_id(id, bytes);
  write_seed("unique_id", "ipv6", std::string(bytes, sizeof(bytes)));
}

void peer_info() {
  PeerInfo p;
  p.rank = 1;
  p.nranks = 4;
  p.host_hash = 0x1122334455667788ull;
  p.hostname = "node7";
  p.pid = 4242;
  p.process_token = 99;
  p.rendezvous = addr("10.0.0.2", 40000);
  p.channels = 2;
  p.blobs = {{"direct", "direct"}, {"shm", std::string("\x09\0\0\0\x07\0\0\0", 8)},
             {"tcp", std::string(reinterpret_cast<const char*>(&p.rendezvous.storage),
                                 p.rendezvous.len)}};
  write_seed("peer_info", "ipv4", p.serialize());
  p.rendezvous = addr("fd00::2", 40001);
  p.blobs = {{"tcp", std::string(reinterpret_cast<const char*>(&p.rendezvous.storage),
                                 p.rendezvous.len)}};
  write_seed("peer_info", "ipv6_no_shm", p.serialize());
}

void tcp_ident() {
  uint8_t b[tcp::kIdentBytes];
  tcp::encode_ident(tcp::Ident{1, 0, 0xc0ffee}, b);
  write_seed("tcp_ident", "rank1_channel0", std::string(reinterpret_cast<char*>(b), sizeof(b)));
  tcp::encode_ident(tcp::Ident{6, 3, 0x123456789abcdefull}, b);
  write_seed("tcp_ident", "rank6_channel3", std::string(reinterpret_cast<char*>(b), sizeof(b)));
}

struct Msg {
  uint8_t flags;  // fuzz_requests.h: bit 0 reduce, bits 1-4 datatype, bits 5-6 op
  MsgTag tag;
  std::string payload;
};

std::vector<Msg> messages() {
  std::vector<Msg> m;
  m.push_back({0, tag(CollKind::kAllGather, 1, 100, DataType::kUint8), payload(100, 1)});
  m.push_back({0, tag(CollKind::kBroadcast, 2, 0, DataType::kInt8, 0), ""});
  // Reducing: float sum, int32 max, half prod.
  m.push_back({static_cast<uint8_t>(1 | (7 << 1)),
               tag(CollKind::kAllReduce, 3, 50, DataType::kFloat32), payload(200, 3)});
  m.push_back({static_cast<uint8_t>(1 | (2 << 1) | (2 << 5)),
               tag(CollKind::kReduceScatter, 4, 33, DataType::kInt32), payload(132, 4)});
  m.push_back({static_cast<uint8_t>(1 | (6 << 1) | (1 << 5)),
               tag(CollKind::kReduce, 5, 61, DataType::kFloat16, 1), payload(122, 5)});
  return m;
}

void tcp_stream() {
  for (int variant = 0; variant < 2; ++variant) {
    auto msgs = messages();
    std::string s;
    put_le(&s, msgs.size() - 1, 1);      // receives
    put_le(&s, variant ? 0 : 100, 2);    // bounce: 64 or 164 bytes
    put_le(&s, variant ? 250 : 7, 1);    // piece
    for (const Msg& m : msgs) fuzz::put_recv_spec(&s, m.flags, m.payload.size(), m.tag);
    for (const Msg& m : msgs) {
      tcp::WireHeader h{};
      h.magic = tcp::kWireMagic;
      h.tag = m.tag;
      h.bytes = m.payload.size();
      s.append(reinterpret_cast<const char*>(&h), sizeof(h));
      s += m.payload;
    }
    write_seed("tcp_stream", variant ? "five_messages_big_pieces" : "five_messages", s);
  }
}

// One message, then the peer gives up with a farewell (reason text) instead of the second.
void tcp_farewell() {
  auto msgs = messages();
  std::string s;
  put_le(&s, 1, 1);   // 2 receives
  put_le(&s, 0, 2);   // bounce: 64 bytes
  put_le(&s, 16, 1);  // piece: 17 bytes
  fuzz::put_recv_spec(&s, msgs[0].flags, msgs[0].payload.size(), msgs[0].tag);
  fuzz::put_recv_spec(&s, msgs[2].flags, msgs[2].payload.size(), msgs[2].tag);
  tcp::WireHeader h{};
  h.magic = tcp::kWireMagic;
  h.tag = msgs[0].tag;
  h.bytes = msgs[0].payload.size();
  s.append(reinterpret_cast<const char*>(&h), sizeof(h));
  s += msgs[0].payload;
  std::string reason = "rank 1 called AllGather #2 but rank 0 called AllReduce #2";
  h = tcp::WireHeader{};
  h.magic = tcp::kFarewellMagic;
  h.reserved = static_cast<uint32_t>(Code::kInvalidUsage);
  h.bytes = reason.size();
  s.append(reinterpret_cast<const char*>(&h), sizeof(h));
  s += reason;
  write_seed("tcp_stream", "farewell", s);
}

void shm_farewell() {
  auto msgs = messages();
  std::string s;
  put_le(&s, 1, 1);  // 2 receives
  put_le(&s, 3, 1);  // ring: 256 bytes
  put_le(&s, 1, 1);  // the producer closes at the end
  put_le(&s, 0, 8);
  fuzz::put_recv_spec(&s, msgs[0].flags, msgs[0].payload.size(), msgs[0].tag);
  fuzz::put_recv_spec(&s, msgs[2].flags, msgs[2].payload.size(), msgs[2].tag);
  shm::MsgHeader h{};
  h.magic = shm::kMsgMagic;
  h.index = 0;
  h.tag = msgs[0].tag;
  h.bytes = msgs[0].payload.size();
  s.append(reinterpret_cast<const char*>(&h), sizeof(h));
  s += msgs[0].payload;
  s.append((shm::kFifoAlign - msgs[0].payload.size() % shm::kFifoAlign) % shm::kFifoAlign, '\0');
  std::string reason = "rank 1 gave up: CHORUS_TIMEOUT_MS passed";
  h = shm::MsgHeader{};
  h.magic = shm::kMsgMagic;
  h.index = 1;
  h.flags = shm::kFarewell;
  h.bytes = reason.size();
  h.address = static_cast<uint64_t>(Code::kRemoteError);
  s.append(reinterpret_cast<const char*>(&h), sizeof(h));
  s += reason;
  write_seed("shm_fifo", "farewell", s);
}

// A shm_fifo input: one receive per message in `msgs`, the ring size code and mode bytes, then
// the messages as a producer writes them; with `inline_small`, payloads of at most kInlineBytes
// travel inside their headers (kInline).
std::string shm_stream(const std::vector<Msg>& msgs, uint8_t ring, uint8_t mode,
                       bool inline_small) {
  std::string s;
  put_le(&s, msgs.size() - 1, 1);  // receives
  put_le(&s, ring, 1);             // ring: 64 * (ring + 1) bytes
  put_le(&s, mode, 1);             // mode: bit 0, the producer closes at the end
  put_le(&s, 0, 8);                // raw head (unused)
  for (const Msg& m : msgs) fuzz::put_recv_spec(&s, m.flags, m.payload.size(), m.tag);
  uint32_t index = 0;
  for (const Msg& m : msgs) {
    shm::MsgHeader h{};
    h.magic = shm::kMsgMagic;
    h.index = index++;
    h.tag = m.tag;
    h.bytes = m.payload.size();
    const bool in_header = inline_small && m.payload.size() <= shm::kInlineBytes;
    if (in_header) {
      h.flags = shm::kInline;
      std::memcpy(h.inline_payload, m.payload.data(), m.payload.size());
    }
    s.append(reinterpret_cast<const char*>(&h), sizeof(h));
    if (in_header) continue;
    s += m.payload;
    s.append((shm::kFifoAlign - m.payload.size() % shm::kFifoAlign) % shm::kFifoAlign, '\0');
  }
  return s;
}

void shm_fifo() {
  write_seed("shm_fifo", "five_messages", shm_stream(messages(), 7, 0, false));  // 512 bytes
  write_seed("shm_fifo", "five_messages_small_ring_close",
             shm_stream(messages(), 1, 1, false));  // 128 bytes, then the producer closes
  // Small payloads inside their headers: an 8-byte float sum, 16 bytes copied, an empty one,
  // then an ordinary message; 256-byte ring.
  std::vector<Msg> msgs;
  msgs.push_back({static_cast<uint8_t>(1 | (7 << 1)),
                  tag(CollKind::kAllReduce, 0, 2, DataType::kFloat32), payload(8, 7)});
  msgs.push_back({0, tag(CollKind::kAllGather, 1, 16, DataType::kUint8), payload(16, 8)});
  msgs.push_back({0, tag(CollKind::kBroadcast, 2, 0, DataType::kInt8, 0), ""});
  msgs.push_back({0, tag(CollKind::kAllGather, 3, 100, DataType::kUint8), payload(100, 9)});
  write_seed("shm_fifo", "inline_payloads", shm_stream(msgs, 3, 0, true));
}

}  // namespace

#if CHORUS_SEEDS_VERBS
// verbs_blob: the reader's rank byte, then a blob (verbs_blob_fuzz.cc).
void verbs_blob() {
  for (uint32_t nranks : {2u, 3u}) {
    verbs::BlobInfo b;
    b.link_layer = 2;
    b.mtu = 3;
    b.port = 1;
    b.rank = 1;
    b.nranks = nranks;
    b.channels = nranks == 2 ? 1 : 2;
    b.slots = 16;
    b.slot_bytes = 65536;
    b.ring_base = 0x7f3a12340000;
    b.ring_rkey = 0x1f2e;
    b.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15};
    b.qps.resize(size_t{nranks} * b.channels);
    for (size_t i = 0; i < b.qps.size(); ++i)
      if (i / b.channels != b.rank) b.qps[i] = verbs::QpEntry{static_cast<uint32_t>(0x11 + i), 0x5a5a5u};
    write_seed("verbs_blob", nranks == 2 ? "two_ranks" : "three_ranks_two_channels",
               std::string(1, '\0') + verbs::encode_blob(b));
  }
}
#endif

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  bootstrap_wire();
  root_server();
  auth();
  unique_id();
  peer_info();
  tcp_ident();
  tcp_stream();
  tcp_farewell();
  shm_fifo();
  shm_farewell();
#if CHORUS_SEEDS_VERBS
  verbs_blob();
#endif
  return 0;
}
