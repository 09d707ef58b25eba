//! Where a GPU sits on the host: its PCI address, its NUMA node and the CPUs nearest it, read
//! from sysfs (`/sys/bus/pci/devices/<bus id>/numa_node` and `local_cpulist`).
//!
//! A loader uses this to run its workers on the GPU's CPUs and to allocate its page-locked
//! batches on the GPU's memory node. Nothing here stops a program: what cannot be read is
//! unknown (`None`), with the reason logged at `warn` (target `"longshore::transfer"`).
//!
//! ```
//! use longshore_transfer::{Device, GpuTopology};
//!
//! assert!(Device::cpu().topology().is_none()); // the Cpu backend has no topology
//! if let Ok(gpu) = Device::cuda(0) {
//!     let topo = gpu.topology().expect("a GPU has a PCI address");
//!     println!("{} on node {:?}, near cpus {:?}", topo.pci_bus_id, topo.numa_node, topo.local_cpus);
//! }
//! // The same facts from any sysfs tree (tests use a fake one):
//! let topo = GpuTopology::from_sysfs("/nonexistent".as_ref(), "0000:3b:00.0");
//! assert_eq!((topo.numa_node, topo.local_cpus), (None, None));
//! ```

use std::path::{Path, PathBuf};

use longshore_host::{CpuListError, CpuSet};

use crate::backend::DeviceImpl;
use crate::device::Device;

impl Device {
    /// Where this GPU sits on the host (see [`GpuTopology`]): its PCI address, NUMA node and
    /// nearest CPUs, from `/sys`. `None` for the `Cpu` device, which has no topology, and when
    /// the driver cannot say the GPU's PCI address (logged at `warn`).
    pub fn topology(&self) -> Option<GpuTopology> {
        self.topology_at(Path::new("/sys"))
    }

    /// [`topology`](Device::topology) with the sysfs tree at `sysfs`.
    pub(crate) fn topology_at(&self, sysfs: &Path) -> Option<GpuTopology> {
        #[cfg(not(feature = "cuda"))]
        let _ = sysfs;
        match &self.shared.backend {
            DeviceImpl::Cpu => None,
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(d) => match crate::backend::cuda::pci_bus_id(d) {
                Ok(id) => Some(GpuTopology::from_sysfs(sysfs, &id)),
                Err(e) => {
                    tracing::warn!(target: "longshore::transfer", device = %self.id(), error = %e, "the GPU's topology is unknown");
                    None
                }
            },
        }
    }
}

/// Where a GPU sits on the host. Fields that could not be read are `None` ("unknown").
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GpuTopology {
    /// The PCI address as sysfs names it, `domain:bus:device.function` in lowercase hex
    /// (`0000:3b:00.0`).
    pub pci_bus_id: String,
    /// The NUMA node of the GPU's PCI device; `None` if unknown (sysfs says `-1` on hosts
    /// without NUMA, or the file is missing).
    pub numa_node: Option<usize>,
    /// The CPUs nearest the GPU (its `local_cpulist`); `None` if unknown.
    pub local_cpus: Option<CpuSet>,
    /// Memory nodes online on the host (`devices/system/node/online`); `None` if unknown.
    pub host_numa_nodes: Option<usize>,
}

impl GpuTopology {
    /// Reads the topology of the PCI device `pci_bus_id` under the sysfs tree at `sysfs`
    /// (normally `/sys`). The id may be in the driver's form (`0000:3B:00.0`, or NVML's
    /// eight-digit domain); it is normalised to sysfs's. Never fails: what cannot be read or
    /// parsed is `None`, logged at `warn` with the file and the text.
    pub fn from_sysfs(sysfs: &Path, pci_bus_id: &str) -> GpuTopology {
        let bus = normalize_bus_id(pci_bus_id);
        let numa_node = read_numa_node(sysfs, &bus).unwrap_or_else(|e| {
            tracing::warn!(target: "longshore::transfer", error = %e, gpu.pci = %bus, "the GPU's NUMA node is unknown");
            None
        });
        let local_cpus = read_local_cpus(sysfs, &bus).unwrap_or_else(|e| {
            tracing::warn!(target: "longshore::transfer", error = %e, gpu.pci = %bus, "the GPU's local CPUs are unknown");
            None
        });
        let host_numa_nodes = longshore_host::numa::online_nodes_at(sysfs).map(|s| s.len());
        GpuTopology {
            pci_bus_id: bus,
            numa_node,
            local_cpus,
            host_numa_nodes,
        }
    }

    /// Whether the host has more than one memory node, so that where threads run and memory
    /// lives matters. Unknown counts as one.
    pub fn multi_node(&self) -> bool {
        self.host_numa_nodes.is_some_and(|n| n > 1)
    }
}

/// Reading or parsing a sysfs file of a GPU's topology failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum TopologyError {
    /// The file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file's text is not what the kernel writes there.
    #[error("cannot parse {path}: {text:?} is {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Its text.
        text: String,
        /// What was expected.
        reason: String,
    },
}

/// sysfs's form of a PCI address: lowercase, the domain in hex without leading zeros beyond
/// four digits (the driver may give `0000:3B:00.0`, NVML `00000000:3B:00.0`; Intel VMD
/// domains start at `0x10000`, which sysfs names `10000:...`).
pub(crate) fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => id,
        },
        _ => id,
    }
}

fn device_file(sysfs: &Path, bus: &str, name: &str) -> PathBuf {
    sysfs.join("bus/pci/devices").join(bus).join(name)
}

/// The file's text, or `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The NUMA node of PCI device `bus` (sysfs form): `None` if the file is missing or says `-1`.
pub(crate) fn read_numa_node(sysfs: &Path, bus: &str) -> Result<Option<usize>, TopologyError> {
    let path = device_file(sysfs, bus, "numa_node");
    let Some(text) = read_optional(&path)? else {
        return Ok(None);
    };
    match text.trim().parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(n) if n >= 0 => Ok(Some(n as usize)),
        _ => Err(TopologyError::Parse {
            path,
            text,
            reason: "not a node number or -1".to_owned(),
        }),
    }
}

/// The CPUs nearest PCI device `bus` (sysfs form): `None` if the file is missing or empty.
pub(crate) fn read_local_cpus(sysfs: &Path, bus: &str) -> Result<Option<CpuSet>, TopologyError> {
    let path = device_file(sysfs, bus, "local_cpulist");
    let Some(text) = read_optional(&path)? else {
        return Ok(None);
    };
    match text.parse::<CpuSet>() {
        Ok(s) if s.is_empty() => Ok(None),
        Ok(s) => Ok(Some(s)),
        Err(CpuListError { item, reason, .. }) => Err(TopologyError::Parse {
            path,
            text,
            reason: format!("not a cpu list ({reason} at {item:?})"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUS: &str = "0000:3b:00.0";

    /// A fake sysfs tree: `nodes` online, and the GPU's files when given.
    fn tree(nodes: Option<&str>, numa: Option<&str>, cpus: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if let Some(n) = nodes {
            let d = dir.path().join("devices/system/node");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("online"), n).unwrap();
        }
        let dev = dir.path().join("bus/pci/devices").join(BUS);
        std::fs::create_dir_all(&dev).unwrap();
        if let Some(n) = numa {
            std::fs::write(dev.join("numa_node"), n).unwrap();
        }
        if let Some(c) = cpus {
            std::fs::write(dev.join("local_cpulist"), c).unwrap();
        }
        dir
    }

    #[test]
    fn one_node_host() {
        let t = tree(Some("0\n"), Some("0\n"), Some("0-15\n"));
        let topo = GpuTopology::from_sysfs(t.path(), "0000:3B:00.0");
        assert_eq!(topo.pci_bus_id, BUS);
        assert_eq!(topo.numa_node, Some(0));
        assert_eq!(topo.local_cpus.as_ref().unwrap().to_string(), "0-15");
        assert_eq!(topo.host_numa_nodes, Some(1));
        assert!(!topo.multi_node());
    }

    #[test]
    fn two_node_host() {
        let t = tree(Some("0-1\n"), Some("1\n"), Some("16-31,48-63\n"));
        let topo = GpuTopology::from_sysfs(t.path(), "00000000:3B:00.0");
        assert_eq!(topo.numa_node, Some(1));
        assert_eq!(topo.local_cpus.as_ref().unwrap().len(), 32);
        assert!(topo.multi_node());
    }

    #[test]
    fn minus_one_and_missing_files_are_unknown() {
        let t = tree(None, Some("-1\n"), None);
        let topo = GpuTopology::from_sysfs(t.path(), BUS);
        assert_eq!(
            (
                topo.numa_node,
                topo.local_cpus.clone(),
                topo.host_numa_nodes
            ),
            (None, None, None)
        );
        assert!(!topo.multi_node());
        let topo = GpuTopology::from_sysfs(t.path(), "0000:99:00.0");
        assert_eq!((topo.numa_node, topo.local_cpus), (None, None));
        assert_eq!(read_local_cpus(t.path(), BUS).unwrap(), None);
        let t = tree(Some("0"), Some("0"), Some("\n"));
        assert_eq!(read_local_cpus(t.path(), BUS).unwrap(), None);
    }

    #[test]
    fn garbage_is_unknown_and_the_error_names_file_and_text() {
        let t = tree(Some("0-1"), Some("banana\n"), Some("0-3,x\n"));
        let topo = GpuTopology::from_sysfs(t.path(), BUS);
        assert_eq!((topo.numa_node, topo.local_cpus.clone()), (None, None));
        let e = read_numa_node(t.path(), BUS).unwrap_err().to_string();
        assert!(e.contains("numa_node") && e.contains("banana"), "{e}");
        let e = read_local_cpus(t.path(), BUS).unwrap_err().to_string();
        assert!(
            e.contains("local_cpulist") && e.contains("0-3,x") && e.contains("\"x\""),
            "{e}"
        );
    }

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalize_bus_id("0000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(normalize_bus_id("00000000:3B:00.0\n"), "0000:3b:00.0");
        assert_eq!(normalize_bus_id("00000001:0A:00.0"), "0001:0a:00.0");
        assert_eq!(normalize_bus_id("0002:c1:00.0"), "0002:c1:00.0");
        // Intel VMD domains are five hex digits in sysfs.
        assert_eq!(normalize_bus_id("00010000:01:00.0"), "10000:01:00.0");
    }
}
