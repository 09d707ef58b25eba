//! [`DeviceStats`]: what the delivery to a device did and where the iterating thread's time
//! went, whatever the stage.

use std::time::Duration;

/// What a [`DeviceLoader`](crate::DeviceLoader) delivered, and where its time went: who is
/// the bottleneck, the loader's workers (`source_wait`), the stage (`stage_time`,
/// `lane_wait`), the device (`throttle_time`) or the consumer (`consumer_time`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeviceStats {
    /// Batches handed out.
    pub batches: u64,
    /// Samples in the batches handed out.
    pub samples: u64,
    /// Errors handed out.
    pub errors: u64,
    /// Samples the stage left out of the batches it was given (under
    /// [`SampleErrorPolicy::Skip`](crate::SampleErrorPolicy::Skip), samples that failed in it:
    /// nvJPEG's undecodable JPEGs), counted here whatever the stage.
    pub dropped: u64,
    /// Times the iterator waited for handed-out batches' device work before taking another
    /// batch (the bound of [`DeviceLoader::max_copies`](crate::DeviceLoader::max_copies)).
    pub throttled: u64,
    /// Time spent in those waits.
    pub throttle_time: Duration,
    /// Time waiting for the loader's next host batch.
    pub source_wait: Duration,
    /// Time in the stage's `prepare` and `run` (summed over lanes with several lanes).
    pub stage_time: Duration,
    /// Lanes: time waiting for a lane's answer.
    pub lane_wait: Duration,
    /// Time the consumer spent inside `next()`: its wait for data.
    pub consumer_wait: Duration,
    /// Time between handing a batch out and the next call: the consumer's own work.
    pub consumer_time: Duration,
    /// From each epoch's first `next()` to its last return, summed.
    pub wall_time: Duration,
}

impl DeviceStats {
    /// The share of the wall time the consumer waited for data (0 when the delivery keeps up).
    pub fn wait_fraction(&self) -> f64 {
        let wall = self.wall_time.as_secs_f64();
        if wall > 0.0 {
            self.consumer_wait.as_secs_f64() / wall
        } else {
            0.0
        }
    }

    /// Samples per second of wall time.
    pub fn samples_per_second(&self) -> f64 {
        let wall = self.wall_time.as_secs_f64();
        if wall > 0.0 {
            self.samples as f64 / wall
        } else {
            0.0
        }
    }
}

/// Counts and times add up (epochs).
impl std::ops::AddAssign<&DeviceStats> for DeviceStats {
    fn add_assign(&mut self, o: &DeviceStats) {
        self.batches += o.batches;
        self.samples += o.samples;
        self.errors += o.errors;
        self.dropped += o.dropped;
        self.throttled += o.throttled;
        self.throttle_time += o.throttle_time;
        self.source_wait += o.source_wait;
        self.stage_time += o.stage_time;
        self.lane_wait += o.lane_wait;
        self.consumer_wait += o.consumer_wait;
        self.consumer_time += o.consumer_time;
        self.wall_time += o.wall_time;
    }
}
