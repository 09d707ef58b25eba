//! [`DeviceId`]: which device something lives on. Its own module so that errors, backends and
//! devices can all name it without depending on one another.

use std::fmt;

/// Which device something lives on: cheap to copy and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceId {
    /// The host, through the `Cpu` backend.
    Cpu,
    /// A CUDA GPU, by ordinal.
    Cuda(usize),
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Cpu => f.write_str("cpu"),
            DeviceId::Cuda(o) => write!(f, "cuda:{o}"),
        }
    }
}
