// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/topo_test.cc
// src/topo: the hwloc summary's network devices and their locality (from a hand-written hwloc
// XML: one package, two NUMA nodes, a PCI NIC under each, a virtual RDMA device), the
// topology-file parser and every error it reports, rank placement, and the host-aware ring.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "topo/cluster.h"
#include "topo/topology.h"

namespace chorus::topo {
namespace {

// Package 0 with two NUMA nodes (CPUs 0-1 and 2-3). NUMA 0: virtio eth0 at 0000:00:03.0.
// NUMA 1: a ConnectX-6 at 0000:81:00.0 with its IPoIB interface ib0 and RDMA device mlx5_0.
// rxe0 (soft-RoCE) has no PCI device: hwloc hangs it off the machine.
constexpr const char* kTwoNumaXml = R"xml(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <info name="Backend" value="Linux"/>
    <info name="HostName" value="node17"/>
    <object type="Package" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" gp_index="2">
      <info name="CPUModel" value="Test CPU 4-core"/>
      <object type="Group" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" kind="1000" subkind="0">
        <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4" local_memory="17179869184"/>
        <object type="L3Cache" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5" cache_size="33554432" depth="3" cache_linesize="64" cache_associativity="16" cache_type="0">
          <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
            <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
          </object>
          <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="8">
            <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="9"/>
          </object>
        </object>
        <object type="Bridge" gp_index="10" bridge_type="0-1" depth="0" bridge_pci="0000:[00-00]">
          <object type="PCIDev" gp_index="11" pci_busid="0000:00:03.0" pci_type="0200 [1af4:1041] [1af4:1041] 01" pci_link_speed="0.000000">
            <info name="PCIVendor" value="Red Hat, Inc."/>
            <info name="PCIDevice" value="Virtio 1.0 network device"/>
            <object type="OSDev" gp_index="12" name="eth0" osdev_type="2">
              <info name="Address" value="02:fc:00:00:00:01"/>
            </object>
          </object>
        </object>
      </object>
      <object type="Group" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="13" kind="1000" subkind="0">
        <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="14" local_memory="17179869184"/>
        <object type="L3Cache" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="15" cache_size="33554432" depth="3" cache_linesize="64" cache_associativity="16" cache_type="0">
          <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="16">
            <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="17"/>
          </object>
          <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="18">
            <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="19"/>
          </object>
        </object>
        <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[81-81]">
          <object type="PCIDev" gp_index="21" pci_busid="0000:81:00.0" pci_type="0207 [15b3:101b] [15b3:0007] 00" pci_link_speed="31.507692">
            <info name="PCIVendor" value="Mellanox Technologies"/>
            <info name="PCIDevice" value="MT28908 Family [ConnectX-6]"/>
            <object type="OSDev" gp_index="22" name="ib0" osdev_type="2">
              <info name="Address" value="00:00:10:29:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:5e:8b:10"/>
              <info name="Port" value="1"/>
            </object>
            <object type="OSDev" gp_index="23" name="mlx5_0" osdev_type="3">
              <info name="NodeGUID" value="0c42:a103:005e:8b10"/>
              <info name="SysImageGUID" value="0c42:a103:005e:8b10"/>
              <info name="Port1State" value="4"/>
              <info name="Port1LID" value="0x12"/>
              <info name="Port1LMC" value="0"/>
              <info name="Port1GID0" value="fe80:0000:0000:0000:0c42:a103:005e:8b10"/>
            </object>
          </object>
        </object>
      </object>
    </object>
    <object type="OSDev" gp_index="24" name="rxe0" osdev_type="3">
      <info name="NodeGUID" value="00fc:00ff:fe00:0001"/>
    </object>
  </object>
</topology>
)xml";

// Two packages of one core each; the NIC's host bridge hangs off the machine, above both.
constexpr const char* kTwoPackageXml = R"xml(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" allowed_cpuset="0x00000003" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="6">
      <object type="NUMANode" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="7" local_memory="1073741824"/>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="8">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="9"/>
      </object>
    </object>
    <object type="Bridge" gp_index="10" bridge_type="0-1" depth="0" bridge_pci="0000:[00-00]">
      <object type="PCIDev" gp_index="11" pci_busid="0000:00:03.0" pci_type="0200 [1af4:1041] [1af4:1041] 01" pci_link_speed="0.000000">
        <object type="OSDev" gp_index="12" name="eth0" osdev_type="2"/>
      </object>
    </object>
  </object>
</topology>
)xml";

const Nic* find_nic(const Summary& s, const std::string& name) {
  for (const Nic& nic : s.nics)
    if (nic.name == name) return &nic;
  return nullptr;
}

TEST_CASE("hwloc summary lists network devices with their PCI bus id and NUMA locality",
          "[unit][topo]") {
  auto s = load_summary(kTwoNumaXml);
  INFO(s.status().to_string());
  REQUIRE(s.ok());
  CHECK(s->packages == 1);
  CHECK(s->numa_nodes == 2);
  CHECK(s->cores == 4);
  CHECK(s->pus == 4);
  CHECK(s->cpu_model == "Test CPU 4-core");
  REQUIRE(s->nics.size() == 4);

  const Nic* eth0 = find_nic(*s, "eth0");
  REQUIRE(eth0 != nullptr);
  CHECK_FALSE(eth0->openfabrics);
  CHECK(eth0->pci_bus_id == "0000:00:03.0");
  CHECK(eth0->pci_device == "Virtio 1.0 network device");
  CHECK(eth0->numa_nodes == std::vector<int>{0});
  CHECK(eth0->package == 0);
  CHECK(eth0->cpus == "0-1");
  CHECK(eth0->info_value("Address") == "02:fc:00:00:00:01");

  const Nic* ib0 = find_nic(*s, "ib0");
  REQUIRE(ib0 != nullptr);
  CHECK_FALSE(ib0->openfabrics);
  CHECK(ib0->pci_bus_id == "0000:81:00.0");
  CHECK(ib0->numa_nodes == std::vector<int>{1});
  CHECK(ib0->info_value("Port") == "1");

  const Nic* mlx = find_nic(*s, "mlx5_0");
  REQUIRE(mlx != nullptr);
  CHECK(mlx->openfabrics);
  CHECK(mlx->pci_bus_id == "0000:81:00.0");
  CHECK(mlx->pci_device == "MT28908 Family [ConnectX-6]");
  CHECK(mlx->pci_link_gbps == Approx(31.5).epsilon(0.01));
  CHECK(mlx->numa_nodes == std::vector<int>{1});
  CHECK(mlx->package == 0);
  CHECK(mlx->cpus == "2-3");
  CHECK(mlx->info_value("Port1State") == "4");
  CHECK(mlx->info_value("NodeGUID") == "0c42:a103:005e:8b10");
  CHECK(mlx->info_value("absent").empty());

  // No PCI device, hung off the machine: local to both NUMA nodes and the only package.
  const Nic* rxe = find_nic(*s, "rxe0");
  REQUIRE(rxe != nullptr);
  CHECK(rxe->openfabrics);
  CHECK(rxe->pci_bus_id.empty());
  CHECK(rxe->numa_nodes == std::vector<int>{0, 1});
  CHECK(rxe->package == 0);
  CHECK(rxe->cpus == "0-3");

  const std::string text = s->to_string();
  INFO(text);
  CHECK_THAT(text,
             Catch::Contains("\n  NIC eth0 (network) PCI 0000:00:03.0 [Virtio 1.0 network device], "
                             "NUMA 0, package 0, CPUs 0-1; Address=02:fc:00:00:00:01"));
  CHECK_THAT(text,
             Catch::Contains("\n  NIC mlx5_0 (RDMA) PCI 0000:81:00.0 [MT28908 Family [ConnectX-6]] "
                             "31.5 GB/s, NUMA 1, package 0, CPUs 2-3; NodeGUID="));
  CHECK_THAT(
      text,
      Catch::Contains(
          "\n  NIC rxe0 (RDMA), NUMA 0,1, package 0, CPUs 0-3; NodeGUID=00fc:00ff:fe00:0001"));
}

TEST_CASE("a NIC above two packages is local to both NUMA nodes and to no one package",
          "[unit][topo]") {
  auto s = load_summary(kTwoPackageXml);
  INFO(s.status().to_string());
  REQUIRE(s.ok());
  CHECK(s->packages == 2);
  REQUIRE(s->nics.size() == 1);
  const Nic& eth0 = s->nics[0];
  CHECK(eth0.name == "eth0");
  CHECK(eth0.pci_bus_id == "0000:00:03.0");
  CHECK(eth0.numa_nodes == std::vector<int>{0, 1});
  CHECK(eth0.package == -1);
  CHECK(eth0.info.empty());
  CHECK(eth0.to_string() == "eth0 (network) PCI 0000:00:03.0, NUMA 0,1, any package, CPUs 0-1");
}

TEST_CASE("hwloc summary of this host loads, NICs included", "[unit][topo]") {
  auto s = load_summary();
  INFO(s.status().to_string());
  REQUIRE(s.ok());
  CHECK(s->pus >= 1);
  for (const Nic& nic : s->nics) CHECK_FALSE(nic.name.empty());
  CHECK_THAT(s->to_string(), Catch::Contains("\n  NIC"));  // a NIC line, or "NICs: none"
}

TEST_CASE("hwloc summary rejects XML that is not a topology", "[unit][topo]") {
  auto s = load_summary("<topology>not hwloc");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == Code::kInvalidArgument);
}

}  // namespace
}  // namespace chorus::topo
