//! [`NvjpegIter`]: a loader's host batches decoded on the device, `depth` batches in flight,
//! in the loader's order, on the calling thread or on several lane threads; and
//! [`NvjpegLoader::nvjpeg`], its `to_device`.

use std::collections::VecDeque;
use std::iter::Fuse;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use longshore_data::{Batch, Storage};
use longshore_host::{HostMemory, PoolBuffer};
use longshore_loader::{DataLoader, Fetch, LoaderError, LoaderIter};
use longshore_transfer::Prefetched;

use super::batch::NvjpegBatch;
use super::decoder::NvjpegDecoder;

/// Host batches of [`EncodedCollate`](super::EncodedCollate) decoded on the device: each item
/// is a [`Prefetched`] [`NvjpegBatch`] with the event its work completes at, in the source's
/// order; errors pass through in place. Batches whose every sample was skipped are left out.
///
/// With [`with_lanes`](NvjpegIter::with_lanes) the device stage runs on several threads, each
/// with its own [`NvjpegDecoder::lane`] (decoding states, stream), batches dealt round-robin
/// and handed out in order: nvJPEG's host-side work per image (parsing, submitting to the
/// engines) then runs in parallel instead of on the thread iterating the loader.
pub struct NvjpegIter<I: Iterator> {
    source: Fuse<I>,
    decoder: NvjpegDecoder,
    depth: usize,
    queue: VecDeque<Result<Prefetched<NvjpegBatch>, LoaderError>>,
    seq: u64,
    /// Lane threads (empty: the device stage runs on the calling thread).
    lanes: Vec<Lane>,
    /// Lanes mode: jobs dealt and answers taken, both round-robin over `lanes`.
    sent: u64,
    answered: u64,
    /// Whether `next` was called before (the time since its last return is the consumer's).
    started: bool,
}

type Answer = Result<Option<Prefetched<NvjpegBatch>>, LoaderError>;

/// A host batch (or the source's error, passed through in place) for a lane, with its position.
type Job = (
    u64,
    Box<dyn FnOnce(&mut NvjpegDecoder, u64) -> Answer + Send>,
);

/// One thread of a parallel device stage. Dropping it ends the thread (its queued jobs and
/// unread answers are dropped: their leases and device buffers are freed after their events).
struct Lane {
    jobs: Option<SyncSender<Job>>,
    answers: Option<Receiver<Answer>>,
    thread: Option<JoinHandle<NvjpegDecoder>>,
}

impl Lane {
    /// Ends the thread and returns its decoder (`None` if the thread panicked).
    fn finish(&mut self) -> Option<NvjpegDecoder> {
        drop(self.jobs.take());
        drop(self.answers.take());
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        drop(self.finish());
    }
}

/// A lane thread: decodes its jobs in order until the iterator hangs up.
fn lane_loop(
    lane: usize,
    mut dec: NvjpegDecoder,
    jobs: Receiver<Job>,
    answers: SyncSender<Answer>,
) -> NvjpegDecoder {
    for (seq, job) in jobs.iter() {
        // The lane's phases start with the job: its idle time between jobs is no phase.
        dec.lap();
        let answer = match catch_unwind(AssertUnwindSafe(|| {
            dec.bind().map_err(LoaderError::from)?;
            job(&mut dec, seq)
        })) {
            Ok(a) => a,
            Err(p) => {
                let message = longshore_data::worker::panic_message(p);
                let _ = answers.send(Err(LoaderError::WorkerPanicked {
                    worker: lane,
                    batch: seq,
                    message: format!("an nvjpeg lane panicked: {message}"),
                }));
                break;
            }
        };
        if answers.send(answer).is_err() {
            break;
        }
    }
    dec
}

impl<I: Iterator> std::fmt::Debug for NvjpegIter<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvjpegIter")
            .field("decoder", &self.decoder)
            .field("depth", &self.depth)
            .field("in_flight", &self.queue.len())
            .finish()
    }
}

impl<I, S> NvjpegIter<I>
where
    I: Iterator<Item = Result<Batch<S>, LoaderError>>,
    S: Storage + HostMemory,
{
    /// Decodes `source`'s batches with `decoder`, keeping `depth` (at least 1) in flight.
    ///
    /// # Errors
    /// [`LoaderError::Transfer`] when the decoder's states cannot be made.
    pub fn new(
        source: impl IntoIterator<IntoIter = I>,
        mut decoder: NvjpegDecoder,
        depth: usize,
    ) -> Result<Self, LoaderError> {
        let depth = depth.max(1);
        decoder.set_depth(depth)?;
        Ok(NvjpegIter {
            source: source.into_iter().fuse(),
            decoder,
            depth,
            queue: VecDeque::with_capacity(depth + 1),
            seq: 0,
            lanes: Vec::new(),
            sent: 0,
            answered: 0,
            started: false,
        })
    }

    /// [`NvjpegIter::new`] with the device stage on `lanes` threads, each keeping `depth`
    /// batches in flight (`lanes <= 1`: on the calling thread, as `new`). The lanes' decoders
    /// are [`lane`](NvjpegDecoder::lane)s of `decoder`; their counts are added to its own by
    /// [`into_decoder`](NvjpegIter::into_decoder), which also keeps them in `decoder` for the
    /// next epoch (with their nvJPEG states: an epoch with the same lanes makes none).
    ///
    /// # Errors
    /// [`LoaderError::Transfer`] when a lane's states or stream cannot be made;
    /// [`LoaderError::Spawn`] when a thread cannot be started.
    pub fn with_lanes(
        source: impl IntoIterator<IntoIter = I>,
        decoder: NvjpegDecoder,
        lanes: usize,
        depth: usize,
    ) -> Result<Self, LoaderError>
    where
        S: Send + 'static,
    {
        let mut it = NvjpegIter::new(source, decoder, depth)?;
        for id in 0..if lanes > 1 { lanes } else { 0 } {
            let dec = it.decoder.take_lane()?;
            let (job_tx, job_rx) = sync_channel::<Job>(it.depth);
            let (ans_tx, ans_rx) = sync_channel::<Answer>(it.depth);
            let thread = std::thread::Builder::new()
                .name(format!("longshore-nvjpeg-{id}"))
                .spawn(move || lane_loop(id, dec, job_rx, ans_tx))
                .map_err(|source| LoaderError::Spawn { worker: id, source })?;
            it.lanes.push(Lane {
                jobs: Some(job_tx),
                answers: Some(ans_rx),
                thread: Some(thread),
            });
        }
        Ok(it)
    }

    /// The decoder (its stream, its counts; with lanes, the lanes' counts are added at
    /// [`into_decoder`](NvjpegIter::into_decoder)).
    pub fn decoder(&self) -> &NvjpegDecoder {
        &self.decoder
    }

    /// The decoder back, to decode the next epoch with the same states (with lanes: once
    /// their threads have ended, with their counts added and the lanes kept in it).
    pub fn into_decoder(mut self) -> NvjpegDecoder {
        for mut lane in std::mem::take(&mut self.lanes) {
            if let Some(d) = lane.finish() {
                self.decoder.keep_lane(d);
            }
        }
        self.decoder
    }

    /// Lanes mode: deals source batches until `lanes x depth` are in flight.
    fn deal(&mut self)
    where
        S: Send + 'static,
    {
        let n = self.lanes.len() as u64;
        while self.sent - self.answered < n * self.depth as u64 {
            let Some(item) = self.timed_source_next() else {
                break;
            };
            let seq = self.seq;
            self.seq += 1;
            let job: Job = (
                seq,
                Box::new(move |dec: &mut NvjpegDecoder, seq| item.and_then(|b| dec.decode(seq, b))),
            );
            let lane = &self.lanes[(self.sent % n) as usize];
            // A lane that is gone answers with a disconnected channel below.
            if let Some(jobs) = &lane.jobs {
                let _ = jobs.send(job);
            }
            self.sent += 1;
        }
    }

    /// Lanes mode: the next answer in order.
    fn next_from_lanes(&mut self) -> Option<Result<Prefetched<NvjpegBatch>, LoaderError>>
    where
        S: Send + 'static,
    {
        loop {
            self.deal();
            if self.answered == self.sent {
                return None;
            }
            let n = self.lanes.len() as u64;
            let lane_id = (self.answered % n) as usize;
            let answer = match self.lanes[lane_id].answers.as_ref().map(Receiver::recv) {
                Some(Ok(a)) => a,
                _ => Err(LoaderError::WorkerPanicked {
                    worker: lane_id,
                    batch: self.answered,
                    message: "an nvjpeg lane thread ended".into(),
                }),
            };
            self.answered += 1;
            match answer {
                Ok(Some(p)) => return Some(Ok(p)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The source's next batch, the wait for it timed as `source_wait_time`.
    fn timed_source_next(&mut self) -> Option<I::Item> {
        let lap = self.decoder.lap();
        self.decoder.stats_mut().hand_out_time += lap;
        let item = self.source.next();
        let lap = self.decoder.lap();
        self.decoder.stats_mut().source_wait_time += lap;
        item
    }

    fn fill(&mut self) {
        while self.queue.len() < self.depth {
            let Some(item) = self.timed_source_next() else {
                break;
            };
            let seq = self.seq;
            self.seq += 1;
            match item.and_then(|b| self.decoder.decode(seq, b)) {
                Ok(Some(p)) => self.queue.push_back(Ok(p)),
                Ok(None) => {}
                Err(e) => self.queue.push_back(Err(e)),
            }
        }
    }
}

impl<I, S> Iterator for NvjpegIter<I>
where
    I: Iterator<Item = Result<Batch<S>, LoaderError>>,
    S: Storage + HostMemory + Send + 'static,
{
    type Item = Result<Prefetched<NvjpegBatch>, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        // Every phase is a lap of the decoder's clock: the consumer's time since the last
        // return, the source's waits, the decoder's phases, the hand-out.
        let lap = self.decoder.lap();
        let entered = self.decoder.clock();
        if std::mem::replace(&mut self.started, true) {
            let stats = self.decoder.stats_mut();
            stats.consumer_time += lap;
            stats.wall_time += lap;
        }
        let out = if self.lanes.is_empty() {
            self.fill();
            let out = self.queue.pop_front();
            self.fill();
            out
        } else {
            self.next_from_lanes()
        };
        let lap = self.decoder.lap();
        let left = self.decoder.clock();
        let stats = self.decoder.stats_mut();
        stats.hand_out_time += lap;
        stats.wall_time += left - entered;
        out
    }
}

/// [`DataLoader::to_device`] for device decoding: `loader.nvjpeg(decoder, depth)`.
pub trait NvjpegLoader {
    /// The iterator over one epoch.
    type Iter;

    /// Iterates one epoch with every host batch (of [`EncodedCollate`](super::EncodedCollate))
    /// decoded on the device by `decoder`, `depth` batches in flight. The decoder takes the
    /// loader's `on_sample_error` policy for samples that fail in the device stage.
    ///
    /// # Errors
    /// [`LoaderError::Transfer`] when the decoder's states cannot be made.
    fn nvjpeg(&self, decoder: NvjpegDecoder, depth: usize) -> Result<Self::Iter, LoaderError>;

    /// [`nvjpeg`](NvjpegLoader::nvjpeg) with the device stage on `lanes` threads
    /// ([`NvjpegIter::with_lanes`]).
    ///
    /// # Errors
    /// As [`NvjpegIter::with_lanes`].
    fn nvjpeg_lanes(
        &self,
        decoder: NvjpegDecoder,
        lanes: usize,
        depth: usize,
    ) -> Result<Self::Iter, LoaderError>;
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> NvjpegLoader for DataLoader<F> {
    type Iter = NvjpegIter<LoaderIter<F>>;

    fn nvjpeg(&self, decoder: NvjpegDecoder, depth: usize) -> Result<Self::Iter, LoaderError> {
        self.nvjpeg_lanes(decoder, 1, depth)
    }

    fn nvjpeg_lanes(
        &self,
        decoder: NvjpegDecoder,
        lanes: usize,
        depth: usize,
    ) -> Result<Self::Iter, LoaderError> {
        let decoder = decoder.on_sample_error(self.config().on_sample_error);
        // Workers and the loader's pool near the decoder's GPU, as `to_device` places them.
        self.place_for(decoder.device());
        NvjpegIter::with_lanes(self.iter(), decoder, lanes, depth)
    }
}
