//! The topology of GPU 0 read through the driver's PCI bus id, checked against sysfs read
//! here directly. Skips without a driver unless LONGSHORE_REQUIRE_CUDA=1.

mod common;

use std::path::Path;

use common::gpu;
use longshore_host::CpuSet;
use longshore_transfer::Device;

#[test]
fn cpu_device_has_no_topology() {
    assert!(Device::cpu().topology().is_none());
}

#[test]
fn gpu0_topology_matches_sysfs() {
    let Some(dev) = gpu() else { return };
    let topo = dev.topology().expect("a CUDA device has a PCI address");
    println!("{}: {topo:?}", dev.name());
    // sysfs's form: domain:bus:device.function, lowercase, four-digit domain.
    let parts: Vec<&str> = topo.pci_bus_id.split([':', '.']).collect();
    assert_eq!(parts.len(), 4, "{}", topo.pci_bus_id);
    assert_eq!(parts[0].len(), 4);
    assert_eq!(topo.pci_bus_id, topo.pci_bus_id.to_ascii_lowercase());
    let dir = Path::new("/sys/bus/pci/devices").join(&topo.pci_bus_id);
    assert!(
        dir.exists(),
        "{} is not a PCI device in sysfs",
        dir.display()
    );

    let node: i64 = std::fs::read_to_string(dir.join("numa_node"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(topo.numa_node, usize::try_from(node).ok());

    let cpus: CpuSet = std::fs::read_to_string(dir.join("local_cpulist"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(topo.local_cpus.as_ref(), Some(&cpus));
    // The GPU's CPUs are CPUs of this host.
    let online: CpuSet = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .unwrap()
        .parse()
        .unwrap();
    assert!(cpus.is_subset(&online), "{cpus} not within online {online}");

    let nodes: CpuSet = std::fs::read_to_string("/sys/devices/system/node/online")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(topo.host_numa_nodes, Some(nodes.len()));
    if let Some(n) = topo.numa_node {
        assert!(nodes.contains(n));
    }
    // A second read through another handle agrees.
    assert_eq!(Device::cuda(0).unwrap().topology(), Some(topo));
}
