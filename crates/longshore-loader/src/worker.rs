//! The worker side of a loader: the body each worker thread runs (turning tasks into
//! batches through the loader's [`Fetch`]), and the per-worker seeds.

use std::sync::Arc;
use std::time::Instant;

use longshore_data::WorkerInfo;
use longshore_data::worker::WorkerGuard;

use crate::engine::{Outcome, Reply, WorkerBody, WorkerCtx, guarded};
use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::placement::{ThreadSetup, WorkerThread};

/// A function run once in each worker thread when it starts (and again after a restart),
/// like PyTorch's `worker_init_fn`.
pub type WorkerInit = Arc<dyn Fn(&WorkerInfo) + Send + Sync>;

/// SplitMix64 finaliser: decorrelates seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of worker `id` in `epoch`: distinct per worker and per epoch (so workers never
/// share random streams, pytorch#5059), and a pure function of (seed, epoch, id), so a resumed
/// run draws the same augmentations.
pub fn worker_seed(seed: u64, epoch: u64, id: usize) -> u64 {
    mix(seed ^ mix(epoch ^ 0xA5A5_A5A5) ^ mix((id as u64).wrapping_add(0x5EED)))
}

/// The body of every worker thread of one engine: takes tasks until the engine shuts down,
/// keeps the per-epoch worker state (an iterable dataset's stream, the generator seeded
/// from `(seed, epoch, id)`) for the tasks of one epoch run (`Task::lineage`), runs
/// `worker_init` at start and after a panic, and turns panics into
/// [`LoaderError::WorkerPanicked`] replies.
pub(crate) fn worker_body<F: Fetch>(
    fetch: Arc<F>,
    init: Option<WorkerInit>,
    setup: Arc<ThreadSetup>,
    num_workers: usize,
    seed: u64,
) -> WorkerBody<F::Output> {
    Arc::new(move |ctx: WorkerCtx<F::Output>| {
        let fetch: &F = &fetch;
        let id = ctx.id;
        // The (epoch, lineage) the state below was made for.
        let mut run: Option<(u64, u64)> = None;
        let mut guard: Option<WorkerGuard> = None;
        let mut state: Option<F::Worker<'_>> = None;
        let mut needs_init = true;
        let mut init_failed: Option<String> = None;
        let mut stream_broken = false;
        let mut thread = WorkerThread::start(setup.clone(), id);
        // Per-sample random streams are keyed by the loader's seed (see
        // `longshore_data::worker::loader_seed`).
        let _seed = longshore_data::worker::enter_seed(seed);
        while let Some(task) = ctx.next_task() {
            thread.refresh();
            if run != Some((task.epoch, task.lineage)) {
                state = None;
                stream_broken = false;
            }
            if state.is_none() {
                let info = WorkerInfo {
                    id,
                    num_workers,
                    ..WorkerInfo::single(worker_seed(seed, task.epoch, id)).with_epoch(task.epoch)
                };
                drop(guard.take());
                guard = Some(longshore_data::worker::enter(info));
                if needs_init {
                    needs_init = false;
                    init_failed = None;
                    if let Some(f) = &init
                        && let Err(m) = guarded(|| f(&info))
                    {
                        init_failed = Some(format!("worker_init panicked: {m}"));
                    }
                }
                match guarded(|| fetch.worker(info)) {
                    Ok(s) => state = Some(s),
                    Err(m) => {
                        init_failed = Some(format!("creating the worker's stream panicked: {m}"))
                    }
                }
                run = Some((task.epoch, task.lineage));
            }
            let span = tracing::trace_span!(target: "longshore::loader", "batch", epoch = task.epoch, seq = task.seq, samples = task.indices.len());
            let entered = span.enter();
            let t0 = Instant::now();
            let mut restarted = false;
            let (outcome, skipped) = if let Some(m) = &init_failed {
                (
                    Outcome::Failed(LoaderError::WorkerPanicked {
                        worker: id,
                        batch: task.seq,
                        message: m.clone(),
                    }),
                    0,
                )
            } else if stream_broken {
                (Outcome::Exhausted, 0)
            } else {
                let cancelled = || ctx.cancelled(&task);
                let st = state.as_mut().expect("state set above");
                let _epoch = longshore_data::worker::enter_epoch(task.epoch);
                match guarded(|| fetch.fetch(st, &task, &cancelled)) {
                    Ok(r) => r,
                    Err(message) => {
                        tracing::error!(target: "longshore::loader", panic = %message, worker.id = id, batch.seq = task.seq, "worker panicked");
                        restarted = true;
                        needs_init = true;
                        if fetch.indexed() {
                            state = None;
                        } else {
                            // A stream cannot be resumed where it panicked: end this worker's share.
                            stream_broken = true;
                        }
                        (
                            Outcome::Failed(LoaderError::WorkerPanicked {
                                worker: id,
                                batch: task.seq,
                                message,
                            }),
                            0,
                        )
                    }
                }
            };
            let busy = t0.elapsed();
            let pinned_wait = match &outcome {
                Outcome::Batch(b) => fetch.output_pinned_wait(b),
                _ => std::time::Duration::ZERO,
            };
            drop(entered);
            let reply = Reply {
                generation: task.generation,
                seq: task.seq,
                worker: id,
                outcome,
                indices: task.indices,
                busy,
                pinned_wait,
                skipped,
                restarted,
            };
            if !ctx.reply(reply) {
                break;
            }
        }
        drop(state);
        drop(guard);
    })
}
