// SPDX-License-Identifier: Apache-2.0
// File: transports/direct/direct_connection.h
// A connection between two ranks of one process (see direct_transport.h).
#pragma once

#include <deque>
#include <memory>
#include <mutex>

#include "transports/small_box.h"
#include "transports/transport.h"

namespace chorus::direct {

// Descriptors of posted sends, from one sender to one receiver on one channel. Either side may
// close it (its comm went away): queued sends then fail, and new ones fail at once.
class Inbox {
 public:
  std::mutex mutex;                 // guards everything below; held while copying one message
  std::deque<SendRequest*> sends;   // in posting order
  bool closed = false;
  int closed_by = -1;               // rank that closed it
  Status error;                     // why it was closed, for the other side
  uint64_t finished = 0;            // sends consumed or failed, ever
  // This direction's small-message box (used on channel 0: transports/small_box.h), alive as
  // long as either side's connection.
  struct alignas(64) BoxMemory {
    std::byte bytes[SmallBox::region_bytes()];
  };
  std::unique_ptr<BoxMemory> box_memory = make_box_memory();

 private:
  static std::unique_ptr<BoxMemory> make_box_memory() {
    auto m = std::make_unique<BoxMemory>();
    SmallBox::init(m->bytes);
    return m;
  }
};

class DirectConnection final : public Connection {
 public:
  DirectConnection(int my_rank, int peer, int channel, std::shared_ptr<Inbox> out,
                   std::shared_ptr<Inbox> in);
  ~DirectConnection() override;

  void post_send(SendRequest* req) override;
  void post_recv(RecvRequest* req) override;
  bool progress() override;
  bool idle() const override;
  bool peek(MsgTag* tag, uint64_t* bytes) override;
  const char* transport_name() const override { return "direct"; }
  SmallBox* small_box() override { return box_.get(); }

 private:
  // Consumes the head of in_ into the head receive; false if nothing to consume.
  bool consume_one();
  void fail_all(Status status);
  // Closes `box` (its mutex held) with `why`: its queued sends fail.
  void close_locked(Inbox* box, const Status& why);

  int my_rank_;
  std::shared_ptr<Inbox> out_;  // the peer's inbox for our sends
  std::shared_ptr<Inbox> in_;   // our inbox for the peer's sends
  std::unique_ptr<SmallBox> box_;  // channel 0 only
  uint64_t posted_ = 0;  // sends we queued in out_, ever (compared with out_->finished)
  std::deque<RecvRequest*> recvs_;
};

}  // namespace chorus::direct
