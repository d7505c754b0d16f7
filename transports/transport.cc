// SPDX-License-Identifier: Apache-2.0
#include "transports/transport.h"

#include <fmt/format.h>

#include "common/dtype.h"

namespace chorus {

std::string describe_tag(const MsgTag& tag) {
  auto coll = static_cast<CollKind>(tag.coll);
  std::string text = fmt::format("{} #{} (count {}, {}", coll_name(coll), tag.seq, tag.count,
                                 datatype_name(static_cast<DataType>(tag.dtype)));
  bool reduces = coll == CollKind::kAllReduce || coll == CollKind::kReduce ||
                 coll == CollKind::kReduceScatter;
  if (reduces) text += fmt::format(", {}", redop_name(static_cast<RedOpKind>(tag.redop)));
  if (tag.root >= 0) {
    bool p2p = coll == CollKind::kSend || coll == CollKind::kRecv || coll == CollKind::kSendRecv;
    text += fmt::format(", {} {}", p2p ? "peer" : "root", tag.root);
  }
  return text + ")";
}

std::string describe_message(const MsgTag& tag, uint64_t bytes, bool at_least) {
  return fmt::format("{} in a message of {}{} bytes", describe_tag(tag), at_least ? "at least " : "",
                     bytes);
}

}  // namespace chorus
