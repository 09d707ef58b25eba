//! [`DeviceLoader`] and [`DeviceIter`]: the loader's one delivery to a device. Whatever the
//! [`DeviceStage`], this is where the depth queue, the lanes, the order, the copy bound, the
//! resume marks, the worker placement and the stats live.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use longshore_data::Batch;
use longshore_host::PoolBuffer;
use longshore_transfer::Event;

use crate::device::DeviceBatch;
use crate::device::lanes::{Answer, Job, LaneThread};
use crate::device::stage::{DeviceStage, StageContext};
use crate::device::stats::DeviceStats;
use crate::device::window::DeviceWindow;
use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::iter::{LoaderIter, Marker};
use crate::loader::DataLoader;
use crate::sync::lock;

/// What the lanes of a stage share with the [`DeviceLoader`] between epochs.
pub(crate) struct Shared<S> {
    /// The stage's lanes while no epoch runs (`None` while one does): lane 0 is the stage the
    /// user gave, the others were made by its [`DeviceStage::lane`] and are kept with their
    /// state for the next epoch.
    lanes: Mutex<Option<Vec<S>>>,
    /// Signalled when an epoch gives the lanes back.
    returned: Condvar,
    stats: Mutex<DeviceStats>,
}

/// A [`DataLoader`] with a [`DeviceStage`]: every epoch's batches turned into
/// [`DeviceBatch`]es by the stage, `depth` batches in flight per lane, in the loader's order.
/// Made by [`DataLoader::with_stage`]; [`DataLoader::to_device`] is the same with the
/// [`Upload`](crate::Upload) stage.
///
/// It owns the stage across epochs (and the lanes it made, with their state): iterate it with
/// [`iter`](DeviceLoader::iter) once per epoch. `state_dict()` on the loader counts the
/// batches [`DeviceIter`] handed out, not those the stage has taken ahead.
pub struct DeviceLoader<F: Fetch, S: DeviceStage> {
    loader: DataLoader<F>,
    shared: Arc<Shared<S>>,
    depth: usize,
    lanes: usize,
    max_copies: Option<usize>,
}

impl<F: Fetch, S: DeviceStage> fmt::Debug for DeviceLoader<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceLoader")
            .field("depth", &self.depth)
            .field("lanes", &self.lanes)
            .field("stats", &*lock(&self.shared.stats))
            .finish_non_exhaustive()
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> DataLoader<F> {
    /// The loader with `stage` turning its batches into device batches (2 in flight, one
    /// lane; see [`DeviceLoader::depth`] and [`DeviceLoader::lanes`]). The stage is kept across
    /// epochs.
    pub fn with_stage<S: DeviceStage>(&self, stage: S) -> DeviceLoader<F, S> {
        DeviceLoader {
            loader: self.clone(),
            shared: Arc::new(Shared {
                lanes: Mutex::new(Some(vec![stage])),
                returned: Condvar::new(),
                stats: Mutex::new(DeviceStats::default()),
            }),
            depth: 2,
            lanes: 1,
            max_copies: None,
        }
    }

    /// Iterates one epoch with every batch copied to `device` on a new copy stream, keeping
    /// `depth` batches in flight (PyTorch: `pin_memory=True` plus
    /// `.to(device, non_blocking=True)`, done right): `with_stage(Upload::new(device)?)`.
    ///
    /// Each item is a [`DeviceBatch`] with the event its copy completes at: call
    /// [`wait_on`](DeviceBatch::wait_on) with your compute stream (the GPU waits, the host does
    /// not) or [`wait`](DeviceBatch::wait). With `pin_memory` the copies are direct DMA from
    /// the batch's page-locked lease, which returns to the pool only after its copy.
    ///
    /// Under [`Placement::GpuLocal`](crate::Placement::GpuLocal) (the default) the workers run
    /// on the CPUs nearest `device` and the loader's own pool allocates on its NUMA node,
    /// where the host has several nodes (see [`DataLoader::placement`]).
    ///
    /// # Errors
    /// [`LoaderError::Transfer`] when the copy stream cannot be made.
    pub fn to_device(
        &self,
        device: &longshore_transfer::Device,
        depth: usize,
    ) -> Result<DeviceIter<F, crate::Upload>, LoaderError> {
        self.with_stage(crate::Upload::new(device)?)
            .depth(depth)
            .iter()
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage> DeviceLoader<F, S> {
    /// Batches in flight per lane (at least 1; default 2): taken from the loader and handed to
    /// the stage before the training loop asks for them.
    pub fn depth(mut self, depth: usize) -> Self {
        self.depth = depth.max(1);
        self
    }

    /// Lanes (threads) the stage runs on (default 1: on the thread iterating the epoch).
    /// Several lanes need a stage that makes them ([`DeviceStage::lane`]); batches are dealt
    /// round-robin and handed out in order. Lanes are kept across epochs.
    pub fn lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes.max(1);
        self
    }

    /// Bounds the batches whose device work is enqueued and not yet complete, handed out or
    /// not (default `4 * depth * lanes`, at least one more than the batches in flight): a
    /// consumer that enqueues its work faster than the device does it is held there, so the
    /// workers are throttled by the loader's in-flight limit instead of filling page-locked
    /// memory with batches queued behind the device. `usize::MAX` turns the bound off.
    pub fn max_copies(mut self, n: usize) -> Self {
        self.max_copies = Some(n);
        self
    }

    /// The loader (its `state_dict`, `set_epoch`, `stats`, ...).
    pub fn loader(&self) -> &DataLoader<F> {
        &self.loader
    }

    /// Runs `f` on the stage (lane 0, the stage given to
    /// [`with_stage`](DataLoader::with_stage)); `None` while an epoch holds it.
    pub fn stage<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        lock(&self.shared.lanes)
            .as_mut()
            .and_then(|l| l.first_mut())
            .map(f)
    }

    /// Runs `f` on every lane kept (lane 0 first); `None` while an epoch holds them.
    pub fn lanes_kept<R>(&self, f: impl FnOnce(&mut [S]) -> R) -> Option<R> {
        lock(&self.shared.lanes).as_mut().map(|l| f(l))
    }

    /// What the delivery has done over every epoch so far, and where its time went.
    pub fn stats(&self) -> DeviceStats {
        *lock(&self.shared.stats)
    }

    /// Iterates one epoch.
    ///
    /// An epoch still ending (its iterator dropped on another thread, as a binding's epoch
    /// thread does after a `break`) gives the stage back first: this waits for it, up to the
    /// loader's `shutdown_timeout`.
    ///
    /// # Errors
    /// [`LoaderError::State`] while another epoch of this device loader still runs past that
    /// wait (drop its iterator first) or when every lane was lost to a panic in an earlier
    /// epoch; the stage's errors making a lane.
    pub fn iter(&self) -> Result<DeviceIter<F, S>, LoaderError> {
        let wait = self.loader.config().options.shutdown_timeout;
        let home = lock(&self.shared.lanes);
        let (mut home, _) = self
            .shared
            .returned
            .wait_timeout_while(home, wait, |l| l.is_none())
            .unwrap_or_else(|p| p.into_inner());
        let mut lanes = home.take().ok_or_else(|| {
            LoaderError::State(format!(
                "an epoch of this device loader is still running after {wait:?}: drop its iterator first"
            ))
        })?;
        drop(home);
        let Some(first) = lanes.first() else {
            return Err(LoaderError::State(
                "the device stage was lost to a panic in an earlier epoch".into(),
            ));
        };
        // Workers (persistent ones too) move to the device's CPUs before their next batch.
        self.loader.place(first.device().topology(), false);
        while lanes.len() < self.lanes {
            let made = match lanes[0].lane() {
                Some(Ok(lane)) => lane,
                Some(Err(e)) => {
                    *lock(&self.shared.lanes) = Some(lanes);
                    return Err(e);
                }
                None => break,
            };
            lanes.push(made);
        }
        let n = self.lanes.min(lanes.len());
        let mut source = self.loader.iter();
        let marker = source.defer_marks();
        let context = StageContext {
            depth: self.depth,
            on_sample_error: self.loader.config().options.on_sample_error,
            epoch: source.epoch(),
        };
        let in_flight = self.depth * n;
        let mut window = DeviceWindow::for_depth(self.depth, n);
        if let Some(m) = self.max_copies {
            window.set_max(m.max(in_flight + 1));
        }
        let mut it = DeviceIter {
            source,
            source_done: false,
            marker,
            shared: self.shared.clone(),
            stage: Stage::Inline {
                lanes,
                prepared: false,
            },
            context,
            depth: self.depth,
            queue: VecDeque::with_capacity(in_flight + 1),
            window,
            in_flight_max: in_flight,
            stats: DeviceStats::default(),
            last_return: None,
            finished: false,
        };
        if n > 1 {
            it.start_lanes(n)?;
        }
        Ok(it)
    }
}

/// A batch from the loader (or its error) with its position in the epoch and whether it
/// counts as delivered.
type Pulled = (Option<(u64, bool)>, Result<Batch<PoolBuffer>, LoaderError>);

/// An item in the order it will be handed out: its position in the epoch (and whether it
/// counts as delivered), and what the stage made of it.
struct Item {
    tag: Option<(u64, bool)>,
    /// Samples in the host batch the stage was given.
    taken: usize,
    result: Result<Option<DeviceBatch>, LoaderError>,
}

enum Stage<S> {
    /// The stage runs on the iterating thread (`lanes[0]`; the others are only kept).
    Inline { lanes: Vec<S>, prepared: bool },
    /// The stage runs on lane threads, jobs dealt round-robin.
    Threads {
        threads: Vec<LaneThread<S>>,
        /// Lanes kept but not running this epoch.
        idle: Vec<S>,
        sent: u64,
        answered: u64,
    },
}

/// One epoch of a [`DeviceLoader`]: yields each batch as a [`DeviceBatch`] with the event its
/// device work ends at, in the loader's order; errors pass through in place. Batches whose
/// every sample the stage dropped are left out.
///
/// A batch counts as delivered for [`DataLoader::state_dict`] when this iterator hands it
/// out, not when the stage takes it from the loader. Dropping the iterator mid-epoch gives the
/// stage's lanes back to the [`DeviceLoader`] (their work in flight completes first, as the
/// lanes' threads end) and every host lease back to the pool once its device work is done.
pub struct DeviceIter<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage> {
    source: LoaderIter<F>,
    source_done: bool,
    marker: Marker<F>,
    shared: Arc<Shared<S>>,
    stage: Stage<S>,
    context: StageContext,
    depth: usize,
    /// Inline: items made and not yet handed out.
    queue: VecDeque<Item>,
    /// Batches handed out whose work may still run.
    window: DeviceWindow,
    /// Batches taken from the loader and not yet handed out, at most (`depth x lanes`).
    in_flight_max: usize,
    stats: DeviceStats,
    last_return: Option<Instant>,
    /// The lanes went back to the [`DeviceLoader`] (the epoch ended or was dropped).
    finished: bool,
}

impl<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage> fmt::Debug for DeviceIter<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceIter")
            .field("depth", &self.depth)
            .field("in_flight", &self.in_flight())
            .field("max_copies", &self.window.max())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage> DeviceIter<F, S> {
    /// Bounds the batches whose device work may still run (see [`DeviceLoader::max_copies`]);
    /// takes effect from the next batch taken from the loader.
    pub fn max_copies(mut self, n: usize) -> Self {
        self.window.set_max(n.max(self.in_flight_max + 1));
        self
    }

    /// How many times the iterator waited for handed-out batches' device work before taking
    /// the next batch from the loader: how often the device, not the consumer, set the pace.
    pub fn throttled(&self) -> u64 {
        self.stats.throttled
    }

    /// This epoch's figures so far (the [`DeviceLoader`]'s [`stats`](DeviceLoader::stats)
    /// gets them when the epoch ends).
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// The stage, while it runs on the iterating thread (one lane).
    pub fn stage(&self) -> Option<&S> {
        match &self.stage {
            Stage::Inline { lanes, .. } => lanes.first(),
            Stage::Threads { .. } => None,
        }
    }

    /// Batches taken from the loader and not yet handed out.
    pub fn in_flight(&self) -> usize {
        match &self.stage {
            Stage::Inline { .. } => self.queue.len(),
            Stage::Threads { sent, answered, .. } => (sent - answered) as usize,
        }
    }

    fn start_lanes(&mut self, n: usize) -> Result<(), LoaderError> {
        let Stage::Inline { lanes, .. } = &mut self.stage else {
            return Ok(());
        };
        let mut lanes = std::mem::take(lanes);
        let idle = lanes.split_off(n);
        let mut threads = Vec::with_capacity(n);
        let mut error = None;
        for (id, lane) in lanes.into_iter().enumerate() {
            match LaneThread::spawn(id, lane, self.context, self.depth) {
                Ok(t) => threads.push(t),
                Err((e, lane)) => {
                    error.get_or_insert(e);
                    // Kept for the next epoch, in its place among the lanes.
                    threads.push(LaneThread::parked(id, lane));
                }
            }
        }
        self.stage = Stage::Threads {
            threads,
            idle,
            sent: 0,
            answered: 0,
        };
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for handed-out batches' work until one more batch may be taken within the bound.
    fn make_room(&mut self, in_flight: usize) {
        let before = self.window.throttled();
        if let Err(e) = self.window.make_room(in_flight, Event::synchronize) {
            // The device is broken: the stage's next call fails and reports it.
            tracing::error!(target: "longshore::loader", error = %e, "waiting for a delivered batch's device work failed");
        }
        let after = self.window.throttled();
        self.stats.throttled += after.0 - before.0;
        self.stats.throttle_time += after.1 - before.1;
    }

    /// The loader's next batch with its position, the wait timed.
    fn pull(&mut self) -> Option<Pulled> {
        if self.source_done {
            return None;
        }
        let t = Instant::now();
        let item = self.source.next();
        self.stats.source_wait += t.elapsed();
        let Some(item) = item else {
            self.source_done = true;
            return None;
        };
        let tag = self.source.last_yielded();
        if item.is_ok() && tag.is_none() {
            return Some((
                None,
                Err(LoaderError::State(
                    "a batch came without its position".into(),
                )),
            ));
        }
        Some((tag, item))
    }

    fn fill_inline(&mut self) {
        while self.queue.len() < self.depth {
            self.make_room(self.queue.len());
            let Some((tag, item)) = self.pull() else {
                break;
            };
            let Stage::Inline { lanes, prepared } = &mut self.stage else {
                return;
            };
            let Some(stage) = lanes.first_mut() else {
                return;
            };
            let t = Instant::now();
            let taken = item.as_ref().map_or(0, Batch::batch_size);
            let result = (|| {
                if !*prepared {
                    stage.prepare(&self.context)?;
                    *prepared = true;
                }
                let batch = item?;
                let seq = tag.map_or(0, |(s, _)| s);
                stage.run(seq, batch)
            })();
            self.stats.stage_time += t.elapsed();
            self.queue.push_back(Item { tag, taken, result });
        }
    }

    /// Lanes: deals batches until `lanes x depth` are in flight.
    fn deal(&mut self) {
        loop {
            let (n, in_flight) = match &self.stage {
                Stage::Threads {
                    threads,
                    sent,
                    answered,
                    ..
                } => (threads.len() as u64, sent - answered),
                Stage::Inline { .. } => return,
            };
            if in_flight >= n * self.depth as u64 {
                return;
            }
            self.make_room(in_flight as usize);
            let Some((tag, item)) = self.pull() else {
                return;
            };
            let Stage::Threads { threads, sent, .. } = &mut self.stage else {
                return;
            };
            threads[(*sent % n) as usize].send(Job { tag, item });
            *sent += 1;
        }
    }

    fn next_item(&mut self) -> Option<Item> {
        match &self.stage {
            Stage::Inline { .. } => {
                self.fill_inline();
                let out = self.queue.pop_front();
                self.fill_inline();
                out
            }
            Stage::Threads { .. } => {
                self.deal();
                let Stage::Threads {
                    threads,
                    sent,
                    answered,
                    ..
                } = &mut self.stage
                else {
                    return None;
                };
                if answered == sent {
                    return None;
                }
                let lane = (*answered % threads.len() as u64) as usize;
                let t = Instant::now();
                let answer = threads[lane].recv(*answered);
                self.stats.lane_wait += t.elapsed();
                *answered += 1;
                let Answer {
                    tag,
                    taken,
                    result,
                    busy,
                } = answer;
                self.stats.stage_time += busy;
                // Keep the lanes busy while the consumer works on this batch.
                self.deal();
                Some(Item { tag, taken, result })
            }
        }
    }

    fn finish_epoch(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let mut lanes = match std::mem::replace(
            &mut self.stage,
            Stage::Inline {
                lanes: Vec::new(),
                prepared: true,
            },
        ) {
            Stage::Inline { lanes, .. } => lanes,
            Stage::Threads { threads, idle, .. } => {
                // A lane whose thread panicked is lost; the others keep their order.
                let mut kept: Vec<S> = threads.into_iter().filter_map(LaneThread::finish).collect();
                kept.extend(idle);
                kept
            }
        };
        self.queue.clear();
        let mut stats = lock(&self.shared.stats);
        *stats += &self.stats;
        drop(stats);
        let mut home = lock(&self.shared.lanes);
        match home.as_mut() {
            // Only one epoch holds the lanes at a time; this cannot happen, but nothing is lost.
            Some(l) => l.append(&mut lanes),
            None => *home = Some(lanes),
        }
        drop(home);
        self.shared.returned.notify_all();
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage> Iterator for DeviceIter<F, S> {
    type Item = Result<DeviceBatch, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        let entered = Instant::now();
        if let Some(last) = self.last_return {
            self.stats.consumer_time += entered - last;
        }
        let out = loop {
            let Some(Item { tag, taken, result }) = self.next_item() else {
                break None;
            };
            if let Ok(b) = &result {
                // What the stage left out of the batch it was given (skipped samples).
                let kept = b.as_ref().map_or(0, DeviceBatch::batch_size);
                self.stats.dropped += taken.saturating_sub(kept) as u64;
            }
            match result {
                Ok(Some(batch)) => {
                    if let Some((seq, _)) = tag {
                        self.marker.mark(seq);
                    }
                    self.stats.batches += 1;
                    self.stats.samples += batch.batch_size() as u64;
                    self.window.record(batch.ready().clone());
                    break Some(Ok(batch));
                }
                // Every sample dropped: nothing to hand out, the batch counts at once.
                Ok(None) => {
                    if let Some((seq, true)) = tag {
                        self.marker.mark(seq);
                    }
                }
                Err(e) => {
                    // A device failure does not count (a resume loads the batch again); a
                    // data error in the loader or the stage does, as on the CPU path.
                    let counts = !matches!(e, LoaderError::Transfer(_));
                    if let Some((seq, true)) = tag
                        && counts
                    {
                        self.marker.mark(seq);
                    }
                    self.stats.errors += 1;
                    break Some(Err(e));
                }
            }
        };
        let left = Instant::now();
        self.stats.consumer_wait += left - entered;
        self.stats.wall_time += left - self.last_return.unwrap_or(entered);
        self.last_return = Some(left);
        if out.is_none() {
            self.finish_epoch();
        }
        out
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage> Drop for DeviceIter<F, S> {
    fn drop(&mut self) {
        self.finish_epoch();
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> DeviceIter<F, crate::Upload> {
    /// The copy stream (one lane).
    pub fn copy_stream(&self) -> Option<&longshore_transfer::Stream> {
        self.stage().map(crate::Upload::stream)
    }
}
