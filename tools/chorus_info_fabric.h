// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_info_fabric.h
// chorus-info's fabric section (chorus_info_fabric.cc).
#pragma once

namespace chorus::info {

// The RDMA devices: ports (state, link layer, active MTU) and valid GIDs (index, type, address);
// "none" on one line when there are none.
void print_rdma_devices();
// The transports and devices UCX finds (memory domain, transport, device, type); "none" when
// there are none.
void print_ucx_resources();

}  // namespace chorus::info
