// SPDX-License-Identifier: Apache-2.0
#include "core/internal_ops.h"

#include <algorithm>
#include <cstring>

#include "algo/algo.h"
#include "core/group.h"

namespace chorus {

namespace {

// Ring allgather of fixed-size blocks among `members`; block j belongs to members[j].
Task ring_allgather(OpContext& ctx, const std::vector<int>& members, int me, char* buf,
                    size_t block) {
  const int m = static_cast<int>(members.size());
  if (m == 1 || block == 0) co_return Status();
  const int next = members[algo::mod(me + 1, m)], prev = members[algo::mod(me - 1, m)];
  for (int s = 0; s < m - 1; ++s) {
    int sb = algo::mod(me - s, m), rb = algo::mod(me - s - 1, m);
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, next, 0, buf + sb * block, block);
    ctx.recv(rreq, prev, 0, buf + rb * block, block);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

Task exchange_records(OpContext& ctx, std::vector<int> members, std::string mine,
                      std::vector<std::string>* out) {
  const int m = static_cast<int>(members.size());
  const int me = static_cast<int>(std::find(members.begin(), members.end(), ctx.rank()) - members.begin());
  std::vector<uint64_t> lengths(m, 0);
  lengths[me] = mine.size();
  CHORUS_CO_RETURN_IF_ERROR(co_await ring_allgather(ctx, members, me,
                                                     reinterpret_cast<char*>(lengths.data()),
                                                     sizeof(uint64_t)));
  uint64_t widest = *std::max_element(lengths.begin(), lengths.end());
  if (widest > (64u << 20)) co_return remote_error("a peer announced a {}-byte record", widest);
  std::string all(widest * m, '\0');
  std::memcpy(all.data() + me * widest, mine.data(), mine.size());
  CHORUS_CO_RETURN_IF_ERROR(co_await ring_allgather(ctx, members, me, all.data(), widest));
  out->clear();
  for (int j = 0; j < m; ++j) out->push_back(all.substr(j * widest, lengths[j]));
  co_return Status();
}

}  // namespace

Result<std::vector<std::string>> allgather_records(Comm& comm, const std::vector<int>& members,
                                                   const std::string& mine) {
  if (std::find(members.begin(), members.end(), comm.rank()) == members.end())
    return internal_error("rank {} is not among the members of its own exchange", comm.rank());
  auto result = std::make_shared<std::vector<std::string>>();
  auto op = std::make_shared<Op>(&comm, "exchange of communicator records",
                                 [members, mine, result](OpContext& ctx) {
                                   return exchange_records(ctx, members, mine, result.get());
                                 });
  CHORUS_RETURN_IF_ERROR(run_and_wait({op}, {&comm}));
  return std::move(*result);
}

}  // namespace chorus
