//! [`NvjpegDecoder`] as the loader's [`DeviceStage`]: the loader owns delivery (depth, lanes,
//! order, resume marks, stats); the decoder only turns a host batch of encoded images into a
//! decoded device batch.

use longshore_data::Batch;
use longshore_host::PoolBuffer;
use longshore_loader::{DeviceBatch, DeviceStage, LoaderError, StageContext};
use longshore_transfer::Device;

use crate::NvjpegDecoder;

impl DeviceStage for NvjpegDecoder {
    fn device(&self) -> &Device {
        NvjpegDecoder::device(self)
    }

    /// Takes the loader's `on_sample_error`, makes the device's context current on the lane's
    /// thread and keeps `depth + 1` decoding states (made once: an epoch with the same depth
    /// makes none).
    fn prepare(&mut self, context: &StageContext) -> Result<(), LoaderError> {
        self.set_policy(context.on_sample_error);
        self.enter()?;
        self.set_depth(context.depth)?;
        Ok(())
    }

    fn run(
        &mut self,
        seq: u64,
        batch: Batch<PoolBuffer>,
    ) -> Result<Option<DeviceBatch>, LoaderError> {
        self.decode(seq, batch)
    }

    /// A lane shares the handles and the compiled kernel; it has its own stream and states.
    fn lane(&self) -> Option<Result<Self, LoaderError>> {
        Some(NvjpegDecoder::lane(self).map_err(LoaderError::from))
    }
}
