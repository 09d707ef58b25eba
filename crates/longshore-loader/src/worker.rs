//! The worker side of a loader: the body each worker thread runs (turning tasks into
//! batches through the loader's [`Fetch`]), each worker seeded by [`worker_seed`].

use std::sync::Arc;
use std::time::Instant;

use longshore_data::WorkerInfo;
use longshore_data::seed::worker_seed;
use longshore_data::worker::WorkerGuard;

use crate::engine::{Outcome, Reply, WorkerBody, WorkerCtx, guarded};
use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::placement::{ThreadSetup, WorkerThread};

/// A function run once in each worker thread when it starts (and again after a restart),
/// like PyTorch's `worker_init_fn`.
pub(crate) type WorkerInit = Arc<dyn Fn(&WorkerInfo) + Send + Sync>;

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
