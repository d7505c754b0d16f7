// SPDX-License-Identifier: Apache-2.0
// File: transports/ucx/ucx_transport.cc
// The UCX transport as a plug-in: the per-communicator instance (a UCP worker whose address is
// the published blob), connect() with its authenticated hellos, and the registration.
#include "transports/ucx/ucx_transport.h"

#include <strings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "transports/ucx/ucx_connection.h"
#include "transports/ucx/ucx_worker.h"

namespace chorus::ucx {

namespace {

constexpr uint32_t kHelloVersion = 1;
constexpr size_t kHelloFieldBytes = 32;  // the part the MAC covers

net::Secret hello_mac(const net::Secret& secret, const uint8_t* fields) {
  std::string msg = "chorus-ucx";
  msg.append(reinterpret_cast<const char*>(fields), kHelloFieldBytes);
  return secret.derive(msg);
}

// The lanes UCX chose for `ep` ("lane[0]: 1:tcp/lo.0 md[1] -> ... am am_bw#0 keepalive wireup").
std::string ep_lanes(ucp_ep_h ep) {
  if (ep == nullptr) return "";
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "";
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::string out;
  std::string_view all(text, size);
  for (size_t pos = 0; pos < all.size();) {
    size_t end = all.find('\n', pos);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(pos, end - pos);
    if (size_t at = line.find("lane["); at != std::string_view::npos) {
      line.remove_prefix(at);
      while (!line.empty() && line.back() == ' ') line.remove_suffix(1);
      if (!out.empty()) out += "; ";
      out += line;
    }
    pos = end + 1;
  }
  std::free(text);
  return out;
}

// One hello exchange of connect(): ours to the peer and the peer's to us, on one channel.
struct HelloLink {
  size_t peer_idx = 0;
  int channel = 0;
  std::vector<uint8_t> tx;
  std::vector<uint8_t> rx;
  void* send_req = nullptr;
  void* recv_req = nullptr;
  bool verified = false;
};

class UcxInstance final : public TransportInstance {
 public:
  UcxInstance(const TransportContext& ctx, const UcxOptions& options,
              std::shared_ptr<Worker> worker)
      : ctx_(ctx), chunk_bytes_(options.chunk_bytes), worker_(std::move(worker)) {}

  std::string blob() const override { return worker_->address(); }

  Result<ConnectionTable> connect(const std::vector<EndpointInfo>& all,
                                  const std::vector<int>& peers, Deadline deadline) override;

  // A registered range's UCP memory handle (MemoryKey). The factory and its keys hold the
  // worker; core releases them before this instance.
  KeyFactory key_factory() override {
    return [worker = worker_](const RegisteredRange& range)
               -> Result<std::unique_ptr<RegistrationKey>> {
      CHORUS_ASSIGN_OR_RETURN(ucp_mem_h memh, worker->map(range.base, range.bytes));
      return std::unique_ptr<RegistrationKey>(new MemoryKey(worker, memh));
    };
  }

  std::string lanes(int peer) const {
    for (const auto& p : worker_->peers())
      if (p->rank == peer) return ep_lanes(p->ep);
    return "";
  }

 private:
  Result<std::vector<std::shared_ptr<Peer>>> create_endpoints(const std::vector<EndpointInfo>& all,
                                                              const std::vector<int>& peers);
  Status exchange_hellos(const std::vector<std::shared_ptr<Peer>>& eps, Deadline deadline);

  TransportContext ctx_;
  size_t chunk_bytes_;
  std::shared_ptr<Worker> worker_;
};

Result<std::vector<std::shared_ptr<Peer>>> UcxInstance::create_endpoints(
    const std::vector<EndpointInfo>& all, const std::vector<int>& peers) {
  std::vector<std::shared_ptr<Peer>> eps;
  for (int r : peers) {
    if (r < 0 || r >= static_cast<int>(all.size()) || r == ctx_.rank) {
      return invalid_argument("ucx: rank {} given peer rank {} (out of range or itself)",
                              ctx_.rank, r);
    }
    const EndpointInfo& info = all[r];
    if (!info.open || info.blob.empty())
      return remote_error("ucx: {} published no UCX worker address", info.describe());
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Peer> peer,
                            worker_->add_peer(r, info.describe(), info.blob,
                                                      info.same_host(all[ctx_.rank])));
    eps.push_back(std::move(peer));
  }
  return eps;
}

// Every (peer, channel) proves the communicator's secret to us and we to it; the endpoints
// wire up while both workers progress here. Bounded by `deadline`.
Status UcxInstance::exchange_hellos(const std::vector<std::shared_ptr<Peer>>& eps,
                                    Deadline deadline) {
  const uint32_t hash = comm_hash(ctx_.comm_uid);
  std::vector<HelloLink> links;
  Status error;
  for (size_t i = 0; i < eps.size(); ++i) {
    for (int c = 0; c < ctx_.channels; ++c) {
      HelloLink l;
      l.peer_idx = i;
      l.channel = c;
      l.tx.resize(kHelloBytes);
      l.rx.resize(kHelloBytes + 64);  // room to see an oversized one for what it is
      encode_hello(Hello{ctx_.rank, eps[i]->rank, c, ctx_.comm_uid}, ctx_.secret, l.tx.data());
      ucp_request_param_t rparam{};
      rparam.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_->handle(), l.rx.data(), l.rx.size(),
                                            make_tag(hash, Kind::kHello, c, eps[i]->rank),
                                            ~ucp_tag_t{0}, &rparam);
      if (UCS_PTR_IS_ERR(r) || r == nullptr) {
        error = make_status(Code::kSystemError, "ucx: rank {} could not post a receive: {}",
                            ctx_.rank, ucs_status_string(UCS_PTR_STATUS(r)));
        break;
      }
      l.recv_req = r;
      ucp_request_param_t sparam{};
      ucs_status_ptr_t s = ucp_tag_send_nbx(eps[i]->ep, l.tx.data(), l.tx.size(),
                                            make_tag(hash, Kind::kHello, c, ctx_.rank), &sparam);
      links.push_back(std::move(l));
      if (UCS_PTR_IS_ERR(s)) {
        error = remote_error("ucx: rank {} could not send its hello to {}: {}", ctx_.rank,
                             eps[i]->label, ucs_status_string(UCS_PTR_STATUS(s)));
        break;
      }
      links.back().send_req = s;
    }
    if (!error.ok()) break;
  }

  const int64_t start = now_ns();
  for (;;) {
    worker_->progress();
    bool receiving = false, sending = false;
    for (HelloLink& l : links) {
      const Peer& peer = *eps[l.peer_idx];
      if (l.recv_req != nullptr) {
        ucp_tag_recv_info_t info{};
        ucs_status_t st = ucp_tag_recv_request_test(l.recv_req, &info);
        if (st == UCS_INPROGRESS) {
          receiving = true;
        } else {
          ucp_request_free(l.recv_req);
          l.recv_req = nullptr;
          Status verdict =
              st == UCS_OK
                  ? check_hello(l.rx.data(), info.length,
                                Hello{peer.rank, ctx_.rank, l.channel, ctx_.comm_uid},
                                ctx_.secret, peer.label)
                  : remote_error("ucx: the hello from {} on channel {} could not be received: {}",
                                 peer.label, l.channel,
                                 st == UCS_ERR_MESSAGE_TRUNCATED ? "it is oversized"
                                                                 : ucs_status_string(st));
          if (verdict.ok()) {
            l.verified = true;
          } else if (error.ok()) {
            error = std::move(verdict);
          }
        }
      }
      if (l.send_req != nullptr) {
        ucs_status_t st = ucp_request_check_status(l.send_req);
        if (st == UCS_INPROGRESS) {
          sending = true;
        } else {
          ucp_request_free(l.send_req);
          l.send_req = nullptr;
          if (st != UCS_OK && error.ok()) {
            error = remote_error("ucx: rank {} could not send its hello to {}: {}", ctx_.rank,
                                 peer.label, ucs_status_string(st));
          }
        }
      }
    }
    for (const auto& p : eps) {
      if (p->failed() && error.ok())
        error = remote_error("ucx: {} {} while rank {} was connecting to it", p->label, p->why(),
                             ctx_.rank);
    }
    // After a failure our own hellos still go out (the peer then sees why), within the deadline.
    if (!sending && (!receiving || !error.ok())) break;
    if (deadline.expired()) {
      if (!error.ok()) break;
      std::string missing;
      int listed = 0;
      for (const HelloLink& l : links) {
        if (l.verified || ++listed > 8) continue;
        if (!missing.empty()) missing += "; ";
        missing += fmt::format("{} channel {}: {}", eps[l.peer_idx]->label, l.channel,
                               l.recv_req != nullptr ? "no hello from it yet"
                                                     : "our hello not delivered yet");
      }
      if (listed > 8) missing += fmt::format("; and {} more", listed - 8);
      error = remote_error(
          "ucx: rank {} could not authenticate its UCX endpoints within {} ms "
          "(CHORUS_CONNECT_TIMEOUT_MS): {}",
          ctx_.rank, (now_ns() - start) / 1000000, missing);
      break;
    }
    worker_->wait(deadline.remaining_ms(50));
  }
  // Whatever is still posted goes; its buffers stay with the worker in case UCX writes later.
  for (HelloLink& l : links) {
    if (l.recv_req == nullptr && l.send_req == nullptr) continue;
    if (l.recv_req != nullptr) {
      ucp_request_cancel(worker_->handle(), l.recv_req);
      ucp_request_free(l.recv_req);
    }
    if (l.send_req != nullptr) ucp_request_free(l.send_req);
    worker_->bury(std::move(l.tx));
    worker_->bury(std::move(l.rx));
  }
  return error;
}

Result<ConnectionTable> UcxInstance::connect(const std::vector<EndpointInfo>& all,
                                             const std::vector<int>& peers, Deadline deadline) {
  ConnectionTable out(peers.size());
  if (peers.empty()) return out;
  const int64_t start = now_ns();
  CHORUS_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Peer>> eps, create_endpoints(all, peers));
  Status st = exchange_hellos(eps, deadline);
  if (!st.ok()) {
    CHORUS_WARN(kNet, "{}", st.message());
    return st;
  }
  ConnectionSetup setup;
  setup.worker = worker_;
  setup.my_rank = ctx_.rank;
  setup.comm_hash = comm_hash(ctx_.comm_uid);
  setup.chunk_bytes = chunk_bytes_;
  for (size_t i = 0; i < eps.size(); ++i) {
    setup.peer = eps[i];
    for (int c = 0; c < ctx_.channels; ++c) {
      setup.channel = c;
      auto conn = std::make_unique<UcxConnection>(setup);
      if (!conn->error().ok()) return conn->error();
      out[i].push_back(std::move(conn));
    }
  }
  CHORUS_INFO(kNet, "ucx: {} connected to {} peer(s) x {} channel(s) in {} ms", worker_->label(),
              eps.size(), ctx_.channels, (now_ns() - start) / 1000000);
  if (log::enabled(log::Level::kInfo, log::kNet)) {
    for (const auto& p : eps)
      CHORUS_INFO(kNet, "ucx: {} -> {}: {}", worker_->label(), p->label, ep_lanes(p->ep));
  }
  return out;
}

// Whether a line of the tuner file at `path` gives figures for ucx ("ucx <alpha> <beta>").
bool tuner_file_lists_ucx(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string first;
    if (words >> first && strcasecmp(first.c_str(), "ucx") == 0) return true;
  }
  return false;
}

// UCX is initialised only where it can be chosen: forced (CHORUS_TRANSPORT=UCX, as
// `chorus-info --tune` does to measure a transport), or measured by the tuner file. Elsewhere
// the probe does not touch it: ucp_init() in a child forked while another thread of the parent
// was inside mmap() can hang on UCX's memory-hook lock (UCM), and a worker costs ~25 ms and
// ~10 descriptors per communicator.
bool wanted() {
  const std::string& forced = params::kTransport.get();
  if (!forced.empty() && strcasecmp(forced.c_str(), "AUTO") != 0)
    return strcasecmp(forced.c_str(), "ucx") == 0;
  const std::string& tuner = params::kTunerFile.get();
  return !tuner.empty() && tuner_file_lists_ucx(tuner);
}

Result<std::unique_ptr<TransportInstance>> open_default(const TransportContext& ctx) {
  if (!wanted()) return std::unique_ptr<TransportInstance>();
  return open_instance(ctx, UcxOptions{});
}

}  // namespace

// ---- Wire helpers ---------------------------------------------------------------------------

uint32_t comm_hash(uint64_t comm_uid) {
  // splitmix64's finaliser: every uid bit moves the 24 bits kept.
  uint64_t z = comm_uid + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 40);
}

uint64_t make_tag(uint32_t hash, Kind kind, int channel, int src_rank) {
  return (uint64_t{hash & 0xffffffu} << 40) | (uint64_t{static_cast<uint8_t>(kind) & 0xfu} << 36) |
         (static_cast<uint64_t>(channel & 0xff) << 28) |
         (static_cast<uint64_t>(src_rank) & 0xfffffffu);
}

void encode_hello(const Hello& hello, const net::Secret& secret, uint8_t out[kHelloBytes]) {
  le::put_u32(out, kHelloMagic);
  le::put_u32(out + 4, kHelloVersion);
  le::put_u32(out + 8, static_cast<uint32_t>(hello.from));
  le::put_u32(out + 12, static_cast<uint32_t>(hello.to));
  le::put_u32(out + 16, static_cast<uint32_t>(hello.channel));
  le::put_u32(out + 20, 0);
  le::put_u64(out + 24, hello.comm_uid);
  net::Secret mac = hello_mac(secret, out);
  std::memcpy(out + kHelloFieldBytes, mac.bytes.data(), mac.bytes.size());
}

Status check_hello(const uint8_t* in, size_t bytes, const Hello& expected,
                   const net::Secret& secret, const std::string& peer) {
  if (bytes != kHelloBytes || le::get_u32(in) != kHelloMagic) {
    return remote_error("ucx: {} sent a malformed hello ({} bytes) on channel {}", peer, bytes,
                        expected.channel);
  }
  if (le::get_u32(in + 4) != kHelloVersion) {
    return remote_error("ucx: {} speaks hello version {}, not {}", peer, le::get_u32(in + 4),
                        kHelloVersion);
  }
  net::Secret got;
  std::memcpy(got.bytes.data(), in + kHelloFieldBytes, got.bytes.size());
  if (!(got == hello_mac(secret, in))) {
    return remote_error(
        "ucx: the hello from {} on channel {} was rejected: wrong secret (it does not prove the "
        "secret of communicator {:#x})",
        peer, expected.channel, expected.comm_uid);
  }
  Hello h{static_cast<int>(le::get_u32(in + 8)), static_cast<int>(le::get_u32(in + 12)),
          static_cast<int>(le::get_u32(in + 16)), le::get_u64(in + 24)};
  if (h.from != expected.from || h.to != expected.to || h.channel != expected.channel ||
      h.comm_uid != expected.comm_uid) {
    return remote_error(
        "ucx: the hello from {} was rejected: it is for rank {} -> {} channel {} of communicator "
        "{:#x}, not rank {} -> {} channel {} of {:#x}",
        peer, h.from, h.to, h.channel, h.comm_uid, expected.from, expected.to, expected.channel,
        expected.comm_uid);
  }
  return ok_status();
}

// ---- Instances ------------------------------------------------------------------------------

Result<std::unique_ptr<TransportInstance>> open_instance(const TransportContext& ctx,
                                                         const UcxOptions& options) {
  if (options.chunk_bytes < kMinChunkBytes || options.chunk_bytes > kMaxChunkBytes ||
      options.chunk_bytes % kMinChunkBytes != 0) {
    return invalid_argument("ucx: chunk size {} (must be a multiple of {} in {}..{})",
                            options.chunk_bytes, kMinChunkBytes, kMinChunkBytes, kMaxChunkBytes);
  }
  if (ctx.channels < 1 || ctx.channels > kMaxChannels) {
    return invalid_argument("ucx: {} channels (must be 1..{})", ctx.channels, kMaxChannels);
  }
  if (ctx.rank < 0 || ctx.nranks > kMaxRanks || ctx.rank >= ctx.nranks) {
    return invalid_argument("ucx: rank {} of {} (at most {} ranks)", ctx.rank, ctx.nranks,
                            kMaxRanks);
  }
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Context> context, Context::get(options.config));
  std::string label =
      ctx.comm_label.empty() ? fmt::format("rank {}/{}", ctx.rank, ctx.nranks) : ctx.comm_label;
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Worker> worker,
                          Worker::create(std::move(context), std::move(label)));
  return std::unique_ptr<TransportInstance>(new UcxInstance(ctx, options, std::move(worker)));
}

std::string describe_lanes(TransportInstance* instance, int peer) {
  auto* ucx = dynamic_cast<UcxInstance*>(instance);
  return ucx != nullptr ? ucx->lanes(peer) : std::string();
}

void register_transport() {
  static constexpr TransportDesc desc{
      .name = "ucx",
      .summary = "any two hosts through UCX (UCP tagged messages); opened only when forced "
                 "(CHORUS_TRANSPORT=UCX) or measured in the tuner file",
      .caps = {
          .reach = TransportCaps::Reach::kAnyHost,
          .registration = true,  // UCP memory handles of registered ranges (key_factory)
          .reduce_on_receive = true,
          .opt_in = true,  // a UCP context (threads, fds) in every process: only when forced
      },
      // Declared above TCP's (25 us, 1 GB/s) so that it is never picked by default.
      .cost = {30, 0.9},
      .open = open_default,
  };
  chorus::register_transport(&desc);
}

}  // namespace chorus::ucx
