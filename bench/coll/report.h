// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/report.h
// What rank 0 prints, in nccl-tests' layout: the header (version, configuration, one line per
// rank), the table (one row per size: out-of-place and in-place time, algbw, busbw, #wrong),
// the footer, and with -J the same rows as a JSON document.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/coll/args.h"
#include "bench/coll/world.h"

namespace chorus::bench {

class Json;

// One rank's identity, exchanged between ranks as raw bytes (fixed size, no pointers).
struct RankInfo {
  int32_t rank = 0;
  int32_t proc = 0;
  int32_t pid = 0;
  int32_t device = 0;  // ncclCommCuDevice: the rank's index among the ranks of its host
  char host[64] = {};
};

struct Placement {
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  int64_t wrong = -1;  // elements wrong, summed over ranks; -1 when not checked (-c 0)
};

struct Row {
  size_t bytes = 0;  // max(send, receive) bytes of one rank
  size_t count = 0;  // the count argument of the call
  ncclDataType_t dtype = ncclFloat;
  int op = -1;    // -1 when the collective does not reduce
  int root = -1;  // -1 when it has no root
  Placement out_of_place;
  Placement in_place;
};

class Reporter {
 public:
  Reporter(const Options& options, const World& world, const char* tool, int argc, char** argv);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // Prints everything above the first row. ranks holds every rank, in rank order.
  void begin(const std::vector<RankInfo>& ranks);
  // Prints one row and keeps it for the averages and the JSON file.
  void row(const Row& r);
  // The bytes the timed calls put on the wire, summed over ranks, and what they stand for
  // uncompressed (chorusCommGetByteCounters). The footer shows their ratio under --compress,
  // or whenever they differ (CHORUS_COMPRESS in the environment).
  void bytes(unsigned long long wire, unsigned long long data);
  // -M 1: the buffer bytes rank 0 allocated, printed in the footer with the peak RSS.
  void memory(size_t buffer_bytes) { memory_bytes_ = buffer_bytes; }
  // Prints the footer (and `error`, if any) and writes the JSON file. Call once.
  void end(const std::string& error);

  // Rows x placements whose check found wrong elements.
  int out_of_bounds() const { return out_of_bounds_; }

 private:
  void print_configuration() const;
  void open_json();
  void json_config(Json& j) const;
  void json_results(Json& j) const;
  void write_json(const std::string& error);

  const Options& options_;
  const World& world_;
  std::string tool_;
  std::vector<std::string> args_;
  std::string start_time_;
  std::FILE* json_ = nullptr;  // -J, opened by begin(), written and closed by end()
  std::vector<RankInfo> ranks_;
  std::vector<Row> rows_;
  double busbw_sum_ = 0;
  int busbw_count_ = 0;
  int out_of_bounds_ = 0;
  unsigned long long wire_bytes_ = 0;
  unsigned long long data_bytes_ = 0;
  size_t memory_bytes_ = 0;
};

}  // namespace chorus::bench
