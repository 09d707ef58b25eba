//! [`DeviceWindow`]: the bound on batches whose device work may still run.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use longshore_transfer::{Event, TransferError};

/// The bound on device work in flight: batches taken from the loader plus batches handed out
/// whose work (a copy, a decode) may still run. Without it a consumer that only enqueues work
/// (a training step that never waits on the host) lets the workers run ahead until the
/// pinned budget stops them; with it the loader's in-flight limit does, and page-locked
/// memory stays at what the window allows.
///
/// [`DeviceIter`](crate::DeviceIter) keeps one; a pipeline of its own (a binding that
/// enqueues copies from two threads, say) keeps one per enqueuing side and records each
/// batch it hands out.
///
/// ```
/// use longshore_loader::DeviceWindow;
/// use longshore_transfer::Device;
///
/// let stream = Device::cpu().new_stream()?;
/// let mut window = DeviceWindow::new(2);
/// for _ in 0..4 {
///     // Waits for the oldest handed-out batch while two are outstanding.
///     window.make_room(0, |e| e.synchronize())?;
///     window.record(stream.record()?);
/// }
/// assert!(window.outstanding() <= 2);
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
#[derive(Debug)]
pub struct DeviceWindow {
    handed: VecDeque<Event>,
    max: usize,
    throttled: u64,
    throttle_time: Duration,
}

impl DeviceWindow {
    /// A window of at most `max` batches (at least 1; `usize::MAX`: no bound, nothing is
    /// kept).
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            handed: VecDeque::with_capacity(max.min(64)),
            max,
            throttled: 0,
            throttle_time: Duration::ZERO,
        }
    }

    /// The default window of a pipeline with `depth` batches in flight on each of `lanes`
    /// lanes: four times what is in flight, enough that the device's queue never runs dry
    /// while the consumer's stream catches up, and one more than what is in flight at least.
    pub fn for_depth(depth: usize, lanes: usize) -> Self {
        let in_flight = depth.max(1) * lanes.max(1);
        Self::new((4 * in_flight).max(in_flight + 1))
    }

    /// The most batches the window holds.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Changes the bound (at least 1); it applies from the next [`make_room`](Self::make_room).
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
    }

    /// Handed-out batches whose work may still run (completed ones are dropped by
    /// [`make_room`](Self::make_room)).
    pub fn outstanding(&self) -> usize {
        self.handed.len()
    }

    /// Records a batch handed out, by the event that ends its device work.
    pub fn record(&mut self, ready: Event) {
        if self.max != usize::MAX {
            self.handed.push_back(ready);
        }
    }

    /// Makes room for one more batch beside `in_flight` batches not yet handed out: drops
    /// handed-out batches whose work completed, oldest first, and calls `wait` on the oldest
    /// one still running while the window is full. Returns the first error of `wait` (the
    /// device is broken; the batch's event is dropped from the window).
    pub fn make_room(
        &mut self,
        in_flight: usize,
        mut wait: impl FnMut(&Event) -> Result<(), TransferError>,
    ) -> Result<(), TransferError> {
        while in_flight + self.handed.len() >= self.max {
            let Some(oldest) = self.handed.pop_front() else {
                break;
            };
            if oldest.is_complete() {
                continue;
            }
            self.throttled += 1;
            let t = Instant::now();
            let r = wait(&oldest);
            self.throttle_time += t.elapsed();
            r?;
        }
        Ok(())
    }

    /// How many times [`make_room`](Self::make_room) waited, and for how long in all.
    pub fn throttled(&self) -> (u64, Duration) {
        (self.throttled, self.throttle_time)
    }
}
