// SPDX-License-Identifier: Apache-2.0
// The compressed collectives (include/chorus/compress.h) on 2 to 8 ranks as threads: results
// within the analytic bound of their quantizations and identical on every rank
// (tests/support/compress_check.h), the wire volume from the byte counters, non-finite blocks,
// error feedback, the transparent mode (CHORUS_COMPRESS) and bad input. The same checks run on
// processes over shared memory and TCP in tests/mp.
#include <catch2/catch.hpp>
#include <chorus/compress.h>
#include <chorus/stream.h>
#include <nccl.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/compress_check.h"
#include "support/rank_group.h"
#include "support/require_error.h"
#include "support/scoped_env.h"

namespace chorus::test {
namespace {


TEST_CASE("compressed collectives are within their error bound and identical on every rank",
          "[ranks][compress]") {
  for (int nranks = 2; nranks <= 8; ++nranks) {
    INFO(nranks << " ranks");
    RankGroup group(nranks);
    REQUIRE(group.init_error().empty());
    std::string f = group.run([&](int, ncclComm_t comm) {
      return check_compressed_matrix(comm, 1000 + nranks, /*large=*/nranks <= 3);
    });
    if (f.size() > 6000) f = f.substr(0, 6000) + "... (cut)";
    CHECK(f == "");
  }
}

TEST_CASE("compressed collectives put at most 26 % of the bytes on the wire",
          "[ranks][compress]") {
  for (int nranks : {2, 5}) {
    INFO(nranks << " ranks");
    RankGroup group(nranks);
    REQUIRE(group.init_error().empty());
    CHECK(group.run([](int, ncclComm_t comm) { return check_compressed_volume(comm); }) == "");
  }
}

TEST_CASE("a compressed block holding Inf or NaN decodes to NaN on every rank",
          "[ranks][compress]") {
  RankGroup group(3);
  REQUIRE(group.init_error().empty());
  CHECK(group.run([](int, ncclComm_t comm) { return check_compressed_nonfinite(comm); }) == "");
}

TEST_CASE("error feedback carries what quantization dropped into the next call",
          "[ranks][compress]") {
  RankGroup group(4);
  REQUIRE(group.init_error().empty());
  CHECK(group.run([](int, ncclComm_t comm) { return check_error_feedback(comm); }) == "");
}

// Plain ncclAllReduce under CHORUS_COMPRESS: compressed (approximate, identical on every rank,
// fewer bytes) with POLICY=ALWAYS; exact where the tuner says it does not pay (threads: the
// direct transport is far faster than the codec) and for integers.
TEST_CASE("CHORUS_COMPRESS compresses plain AllReduce where allowed", "[ranks][compress]") {
  ScopedEnv mode("CHORUS_COMPRESS", "FP8_E4M3");
  ScopedEnv min_bytes("CHORUS_COMPRESS_MIN_BYTES", "1024");
  const size_t count = 100000;
  auto run = [&](RankGroup& group, ncclDataType_t dtype, double* wire_ratio, bool* exact,
                 bool* identical) {
    std::vector<double> ratio(group.size());
    std::vector<int> ok(group.size()), same(group.size());
    std::string f = group.run([&](int rank, ncclComm_t comm) -> std::string {
      std::vector<float> x(count), y(count);
      std::vector<int32_t> xi(count), yi(count);
      for (size_t i = 0; i < count; ++i) {
        x[i] = 0.001f * static_cast<float>((i * 7919 + rank * 104729) % 2000) - 0.9f;
        xi[i] = static_cast<int32_t>(i % 1000) - 500 + rank;
      }
      chorusCommResetByteCounters(comm);
      ncclResult_t r = dtype == ncclFloat32
                           ? ncclAllReduce(x.data(), y.data(), count, dtype, ncclSum, comm, nullptr)
                           : ncclAllReduce(xi.data(), yi.data(), count, dtype, ncclSum, comm,
                                           nullptr);
      if (r != ncclSuccess) return "ncclAllReduce failed: " + last_error();
      chorusByteCounters_t b{};
      chorusCommGetByteCounters(comm, -1, &b);
      ratio[rank] = static_cast<double>(b.wireBytesSent) / b.dataBytesSent;
      int n = group.size();
      bool is_exact = true;
      for (size_t i = 0; i < count && is_exact; ++i) {
        if (dtype == ncclFloat32) {
          double want = 0;
          for (int p = 0; p < n; ++p)
            want += 0.001f * static_cast<float>((i * 7919 + p * 104729) % 2000) - 0.9f;
          is_exact = std::fabs(y[i] - want) <= 1e-5 * (1 + std::fabs(want));
        } else {
          int64_t want = 0;
          for (int p = 0; p < n; ++p) want += static_cast<int32_t>(i % 1000) - 500 + p;
          is_exact = yi[i] == want;
        }
      }
      ok[rank] = is_exact;
      // Identical results: rank 0's broadcast compared.
      std::vector<float> first(count);
      void* mine = dtype == ncclFloat32 ? static_cast<void*>(y.data()) : yi.data();
      if (rank == 0) std::memcpy(first.data(), mine, count * 4);
      ncclBroadcast(first.data(), first.data(), count * 4, ncclUint8, 0, comm, nullptr);
      same[rank] = std::memcmp(first.data(), mine, count * 4) == 0;
      return "";
    });
    REQUIRE(f == "");
    *wire_ratio = ratio[0];
    *exact = true;
    *identical = true;
    for (int r = 0; r < group.size(); ++r) {
      *exact = *exact && ok[r];
      *identical = *identical && same[r];
    }
  };
  double ratio = 0;
  bool exact = false, identical = false;
  {
    ScopedEnv policy("CHORUS_COMPRESS_POLICY", "ALWAYS");
    RankGroup group(3);
    REQUIRE(group.init_error().empty());
    run(group, ncclFloat32, &ratio, &exact, &identical);
    CHECK(ratio < 0.27);
    CHECK_FALSE(exact);
    CHECK(identical);
    run(group, ncclInt32, &ratio, &exact, &identical);  // integers never compress
    CHECK(ratio == 1.0);
    CHECK(exact);
  }
  {
    ScopedEnv policy("CHORUS_COMPRESS_POLICY", "AUTO");
    RankGroup group(3);
    REQUIRE(group.init_error().empty());
    run(group, ncclFloat32, &ratio, &exact, &identical);
    CHECK(ratio == 1.0);
    CHECK(exact);
  }
}

TEST_CASE("compressed calls reject what cannot be compressed", "[ranks][compress][bad_input]") {
  RankGroup group(1);
  ncclComm_t comm = group.comm(0);
  std::vector<float> buf(256, 1.0f);
  chorusCompressor_t comp = nullptr;
  REQUIRE(chorusCompressorCreate(nullptr, &comp) == ncclSuccess);
  REQUIRE_ERROR(chorusAllReduceCompressed(buf.data(), buf.data(), 16, ncclInt32, ncclSum, comp,
                                          comm, nullptr),
                ncclInvalidArgument, "not int32");
  REQUIRE_ERROR(chorusAllReduceCompressed(buf.data(), buf.data(), 16, ncclFloat64, ncclSum, comp,
                                          comm, nullptr),
                ncclInvalidArgument, "float32, bfloat16 or float16");
  REQUIRE_ERROR(chorusReduceScatterCompressed(buf.data(), buf.data(), 16, ncclFloat32, ncclProd,
                                              comp, comm, nullptr),
                ncclInvalidArgument, "prod");
  REQUIRE_ERROR(chorusAllReduceCompressed(buf.data(), buf.data(), 16, ncclFloat32, ncclSum,
                                          nullptr, comm, nullptr),
                ncclInvalidArgument, "compressor is NULL");
  REQUIRE_ERROR(chorusAllGatherCompressed(buf.data(), nullptr, 16, ncclFloat32, comp, comm,
                                          nullptr),
                ncclInvalidArgument, "recvbuff is NULL");
  REQUIRE(chorusCompressorDestroy(comp) == ncclSuccess);
  REQUIRE_ERROR(chorusAllReduceCompressed(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, comp,
                                          comm, nullptr),
                ncclInvalidArgument, "not a live chorusCompressor_t");
  REQUIRE_ERROR(chorusCompressorDestroy(comp), ncclInvalidArgument, "destroyed twice");

  chorusCompressConfig_t cfg = CHORUS_COMPRESS_CONFIG_INIT;
  cfg.blockSize = 0;
  REQUIRE_ERROR(chorusCompressorCreate(&cfg, &comp), ncclInvalidArgument, "blockSize 0");
  cfg = CHORUS_COMPRESS_CONFIG_INIT;
  const int seven = 7;  // what a C caller may pass; not loaded as the enum type here
  std::memcpy(&cfg.format, &seven, sizeof seven);
  REQUIRE_ERROR(chorusCompressorCreate(&cfg, &comp), ncclInvalidArgument, "format 7");
  cfg = CHORUS_COMPRESS_CONFIG_INIT;
  cfg.size = 8;
  REQUIRE_ERROR(chorusCompressorCreate(&cfg, &comp), ncclInvalidArgument,
                "CHORUS_COMPRESS_CONFIG_INIT");
  cfg = CHORUS_COMPRESS_CONFIG_INIT;
  cfg.errorFeedback = 2;
  REQUIRE_ERROR(chorusCompressorCreate(&cfg, &comp), ncclInvalidArgument, "errorFeedback");
  REQUIRE_ERROR(chorusCommGetByteCounters(comm, 1, nullptr), ncclInvalidArgument, "NULL");
  chorusByteCounters_t b{};
  REQUIRE_ERROR(chorusCommGetByteCounters(comm, 1, &b), ncclInvalidArgument, "peer 1");

  // A compressor's calls on a stream hold it until they are done, not longer: reset works once
  // the stream is synchronized.
  cfg = CHORUS_COMPRESS_CONFIG_INIT;
  cfg.errorFeedback = 1;
  REQUIRE(chorusCompressorCreate(&cfg, &comp) == ncclSuccess);
  chorusStream_t stream = nullptr;
  REQUIRE(chorusStreamCreate(&stream) == ncclSuccess);
  REQUIRE(chorusAllReduceCompressed(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, comp, comm,
                                    stream) == ncclSuccess);
  REQUIRE(chorusStreamSynchronize(stream) == ncclSuccess);
  CHECK(chorusCompressorReset(comp) == ncclSuccess);
  REQUIRE(chorusStreamDestroy(stream) == ncclSuccess);
  REQUIRE(chorusCompressorDestroy(comp) == ncclSuccess);

  // The communicator is still usable, and one rank compresses nothing: the output is the input.
  REQUIRE(chorusCompressorCreate(nullptr, &comp) == ncclSuccess);
  std::vector<float> out(256);
  REQUIRE(chorusAllReduceCompressed(buf.data(), out.data(), 256, ncclFloat32, ncclSum, comp, comm,
                                    nullptr) == ncclSuccess);
  CHECK(out == buf);
  REQUIRE(chorusCompressorDestroy(comp) == ncclSuccess);
}

}  // namespace
}  // namespace chorus::test
