// SPDX-License-Identifier: Apache-2.0
// File: transports/ucx/ucx_connection.h
// One UCX connection (peer, channel): ordered, tagged messages on the peer's endpoint, received
// on this rank's worker with tags that name the peer and the channel. README.md has the format.
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transports/protocol.h"
#include "transports/transport.h"
#include "transports/ucx/ucx_transport.h"
#include "transports/ucx/ucx_worker.h"

namespace chorus::ucx {

struct ConnectionSetup {
  std::shared_ptr<Worker> worker;
  std::shared_ptr<Peer> peer;
  int my_rank = -1;
  int channel = 0;
  uint32_t comm_hash = 0;
  size_t chunk_bytes = kDefaultChunkBytes;
};

// Not thread-safe: post_*, progress() and the queries come from one thread at a time (the
// progress engine's). Requests complete in posting order per direction.
class UcxConnection final : public Connection {
 public:
  // Posts the receive that catches the peer's farewell; the endpoint is authenticated already.
  explicit UcxConnection(const ConnectionSetup& setup);
  // Cancels what is posted and waits a little for UCX to let go of buffers (200 ms, then the
  // endpoint is forced closed); never hangs on a dead peer.
  ~UcxConnection() override;

  void post_send(SendRequest* req) override;
  void post_recv(RecvRequest* req) override;
  bool progress() override;
  bool idle() const override { return sends_.empty() && recvs_.empty(); }
  // The worker's event fd, armed (see Worker::poll_fd); -1 after an error.
  int poll_fd(short* events) const override;
  bool peek(MsgTag* tag, uint64_t* bytes) override;
  const char* transport_name() const override { return "ucx"; }
  void farewell(const Status& why) override;

 private:
  static constexpr size_t kWindow = 16;  // payload receives posted ahead (2 when reducing)

  // One posted send: its header message (+ inline payload) and the UCX requests in flight,
  // each with the payload offset it completes.
  struct SendOp {
    SendRequest* req = nullptr;
    std::vector<uint8_t> msg;
    std::vector<std::pair<void*, size_t>> pending;
    size_t next = 0;  // first entry of `pending` not known to be complete
  };
  // A UCX request owned outside the data path (a farewell being sent, a receive or send of a
  // failed connection) and the buffer it uses, if ours.
  struct Aux {
    void* req = nullptr;
    std::vector<uint8_t> buf;
  };
  // kArrived: a header is in rx_header_ (checked for framing), not yet matched to a receive.
  enum class RxPhase : uint8_t { kIdle, kHeader, kArrived, kPayload };

  // `memh`: the memory handle of the registered range holding buf (MemoryKey), or null.
  Status send_msg(const void* buf, size_t bytes, uint64_t tag, SendOp* op, size_t end,
                  ucp_mem_h memh = nullptr);
  Result<void*> post_ucx_recv(void* buf, size_t bytes, uint64_t tag, ucp_mem_h memh = nullptr);
  bool progress_sends();
  bool progress_recvs();
  // Posts the receive of the next header message if none is, and tests it: true once a header
  // has arrived (kArrived, in rx_header_). `req` (may be null) is named in errors.
  bool poll_header(const RecvRequest* req, bool* moved);
  // The header of the front receive arrived (`length` bytes): checks it, completes an inline
  // message. False when the connection failed.
  bool on_header(RecvRequest* req, size_t length);
  // Posts and completes payload chunks of the front receive; true once all arrived.
  bool progress_payload(RecvRequest* req, bool* moved);
  void finish_recv(RecvRequest* req);
  // Sends a farewell once: `code` and `reason` (kOk: a goodbye, this end closes normally).
  void send_farewell(Code code, const std::string& reason);
  // True when the peer's farewell has arrived (fw_code_ and fw_text_ hold it).
  bool check_farewell();
  // Fails the connection (true) if the peer said farewell or its endpoint failed.
  bool check_gone(bool peeking = false);
  // Records why the connection broke (logged once), tells the peer if `tell_peer`, makes UCX
  // let go of the caller's buffers, and fails every pending request.
  void fail_all(Status status, bool tell_peer);
  void cancel_recvs();
  void release_sends();
  void reap();
  // Progresses until every Aux request completed, at most `ms`.
  bool drain(int ms);

  Status peer_error() const;
  Status corrupt(const RecvRequest* req, const std::string& what) const;
  // "while rank 0 was receiving AllReduce #3 (...) (0 of 64 bytes) on ucx channel 1".
  std::string situation() const;

  std::shared_ptr<Worker> worker_;
  std::shared_ptr<Peer> peer_;
  int my_rank_;
  size_t chunk_bytes_;
  uint64_t out_header_tag_, out_payload_tag_, out_farewell_tag_;
  uint64_t in_header_tag_, in_payload_tag_, in_farewell_tag_;
  bool broken_ = false;
  bool farewell_sent_ = false;

  std::deque<std::unique_ptr<SendOp>> sends_;
  std::vector<std::unique_ptr<SendOp>> spare_;

  RequestQueue<RecvRequest> recvs_;
  RxPhase rx_phase_ = RxPhase::kIdle;
  void* rx_header_req_ = nullptr;
  std::vector<uint8_t> rx_header_buf_;
  WireHeader rx_header_{};   // the last header that arrived
  size_t rx_header_len_ = 0;  // bytes of its message (header + inline payload)
  size_t rx_chunk_ = 0;   // the sender's chunk size for the front receive
  size_t rx_chunks_ = 0;  // chunks of the front receive
  size_t rx_posted_ = 0;  // chunks posted
  size_t rx_done_ = 0;    // chunks completed
  std::array<void*, kWindow> rx_chunk_reqs_{};
  std::vector<uint8_t> bounce_;  // reducing receives: two chunk-sized halves

  void* fw_req_ = nullptr;
  std::vector<uint8_t> fw_buf_;
  bool fw_arrived_ = false;
  Code fw_code_ = Code::kRemoteError;
  std::string fw_text_;

  std::vector<Aux> aux_;
};

}  // namespace chorus::ucx
