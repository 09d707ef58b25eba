//! Delivery to a device: one pipeline ([`DeviceLoader`], [`DeviceIter`]) around one seam
//! ([`DeviceStage`]), yielding one batch type ([`DeviceBatch`]).
//!
//! Module order (imports point down): `pipeline` -> `lanes` -> `stage` -> `batch`, `stats`,
//! `window`.

mod batch;
mod lanes;
mod pipeline;
mod stage;
mod stats;
mod window;

pub use batch::{DeviceBatch, DevicePart};
pub use pipeline::{DeviceIter, DeviceLoader};
pub use stage::{DeviceStage, StageContext, Upload};
pub use stats::DeviceStats;
pub use window::DeviceWindow;
