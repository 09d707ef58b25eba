//! Lane threads of a [`DeviceStage`]: each owns one lane of the stage for an epoch, runs the
//! jobs dealt to it in order and answers in order.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use longshore_data::Batch;
use longshore_host::PoolBuffer;

use crate::device::DeviceBatch;
use crate::device::stage::{DeviceStage, StageContext};
use crate::error::LoaderError;
use crate::sync::lock;

/// A host batch (or the loader's error, passed through in place) with its position.
pub(crate) struct Job {
    pub(crate) tag: Option<(u64, bool)>,
    pub(crate) item: Result<Batch<PoolBuffer>, LoaderError>,
}

/// What a lane made of a job, and the time its stage took.
pub(crate) struct Answer {
    pub(crate) tag: Option<(u64, bool)>,
    /// Samples in the host batch of the job.
    pub(crate) taken: usize,
    pub(crate) result: Result<Option<DeviceBatch>, LoaderError>,
    pub(crate) busy: Duration,
}

/// One thread running one lane of a stage for an epoch. [`finish`](LaneThread::finish) (or
/// dropping it) ends the thread: its queued jobs and unread answers are dropped (their leases
/// and device buffers are freed after their events).
pub(crate) struct LaneThread<S> {
    id: usize,
    jobs: Option<SyncSender<Job>>,
    answers: Option<Receiver<Answer>>,
    thread: Option<JoinHandle<Option<S>>>,
    /// A lane that could not get a thread this epoch, kept for the next.
    parked: Option<S>,
}

impl<S: DeviceStage> LaneThread<S> {
    /// Starts lane `id` on its own thread, `depth` jobs and answers queued at most. When the
    /// thread cannot be started, the error and the lane (to keep) come back.
    pub(crate) fn spawn(
        id: usize,
        stage: S,
        context: StageContext,
        depth: usize,
    ) -> Result<LaneThread<S>, (LoaderError, Option<S>)> {
        let (job_tx, job_rx) = sync_channel::<Job>(depth.max(1));
        let (ans_tx, ans_rx) = sync_channel::<Answer>(depth.max(1));
        // The lane reaches its thread through a slot, so that it can be taken back when the
        // thread cannot be started (the closure is then dropped without running).
        let slot = Arc::new(Mutex::new(Some(stage)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("longshore-stage-{id}"))
            .spawn(move || {
                let stage = lock(&theirs).take()?;
                lane_loop(id, stage, context, job_rx, ans_tx)
            });
        match spawned {
            Ok(thread) => Ok(LaneThread {
                id,
                jobs: Some(job_tx),
                answers: Some(ans_rx),
                thread: Some(thread),
                parked: None,
            }),
            Err(source) => Err((
                LoaderError::Spawn { worker: id, source },
                lock(&slot).take(),
            )),
        }
    }

    /// A lane kept without a thread this epoch; it answers every job with an error.
    pub(crate) fn parked(id: usize, stage: Option<S>) -> LaneThread<S> {
        LaneThread {
            id,
            jobs: None,
            answers: None,
            thread: None,
            parked: stage,
        }
    }

    /// Deals a job to the lane (a lane that is gone answers with an error in
    /// [`recv`](LaneThread::recv)).
    pub(crate) fn send(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(job);
        }
    }

    /// The lane's next answer, in the order its jobs were dealt; `seq` names the batch in the
    /// error when the lane's thread has ended.
    pub(crate) fn recv(&self, seq: u64) -> Answer {
        match self.answers.as_ref().map(Receiver::recv) {
            Some(Ok(a)) => a,
            _ => Answer {
                tag: None,
                taken: 0,
                result: Err(LoaderError::WorkerPanicked {
                    worker: self.id,
                    batch: seq,
                    message: "a device stage lane thread ended".into(),
                }),
                busy: Duration::ZERO,
            },
        }
    }

    /// Ends the thread and returns its lane (`None` if the thread panicked).
    pub(crate) fn finish(mut self) -> Option<S> {
        self.end()
    }

    fn end(&mut self) -> Option<S> {
        drop(self.jobs.take());
        drop(self.answers.take());
        match self.thread.take() {
            Some(t) => t.join().ok().flatten(),
            None => self.parked.take(),
        }
    }
}

impl<S> Drop for LaneThread<S> {
    fn drop(&mut self) {
        drop(self.jobs.take());
        drop(self.answers.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A lane thread: prepares the lane for the epoch, then runs its jobs in order until the
/// iterator hangs up. Returns the lane (`None` after a panic in the stage, which is reported
/// as the answer to the job it happened in).
fn lane_loop<S: DeviceStage>(
    id: usize,
    mut stage: S,
    context: StageContext,
    jobs: Receiver<Job>,
    answers: SyncSender<Answer>,
) -> Option<S> {
    let mut prepared = false;
    for (n, Job { tag, item }) in jobs.iter().enumerate() {
        let started = Instant::now();
        let taken = item.as_ref().map_or(0, Batch::batch_size);
        let run = catch_unwind(AssertUnwindSafe(|| {
            if !prepared {
                stage.prepare(&context)?;
                prepared = true;
            }
            let batch = item?;
            stage.run(tag.map_or(0, |(seq, _)| seq), batch)
        }));
        let busy = started.elapsed();
        let (result, panicked) = match run {
            Ok(r) => (r, false),
            Err(p) => {
                let message = longshore_data::worker::panic_message(p);
                let batch = tag.map_or(n as u64, |(seq, _)| seq);
                (
                    Err(LoaderError::WorkerPanicked {
                        worker: id,
                        batch,
                        message: format!("device stage lane {id} panicked: {message}"),
                    }),
                    true,
                )
            }
        };
        let answer = Answer {
            tag,
            taken,
            result,
            busy,
        };
        if answers.send(answer).is_err() || panicked {
            if panicked {
                tracing::error!(target: "longshore::loader", lane = id, "a device stage lane panicked; it is not kept");
                return None;
            }
            break;
        }
    }
    Some(stage)
}
