//! The process's tokio runtime for store I/O, and [`block_on`] for synchronous threads.

use std::future::Future;
use std::sync::{Arc, Mutex};

use super::TARGET;
use crate::ShardError;

struct HeldRuntime {
    pid: u32,
    runtime: Arc<tokio::runtime::Runtime>,
}

static RUNTIME: Mutex<Option<HeldRuntime>> = Mutex::new(None);

/// The process's tokio runtime for store I/O, created on first use.
///
/// The runtime is created lazily, in the process that first uses it, never at load time: a
/// loader that forks worker processes before touching a store gets one runtime per process.
/// The creating process id is recorded; a process that was forked after the runtime existed
/// (its worker threads do not exist in the child) sees a different id and builds a new runtime,
/// leaking the inherited one rather than dropping it (dropping would wait for threads that are
/// not there).
///
/// # Errors
///
/// [`ShardError::Runtime`] if the runtime cannot be built (threads cannot be spawned).
pub fn runtime() -> Result<Arc<tokio::runtime::Runtime>, ShardError> {
    runtime_for(std::process::id())
}

fn runtime_for(pid: u32) -> Result<Arc<tokio::runtime::Runtime>, ShardError> {
    let mut held = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = held.as_ref()
        && h.pid == pid
    {
        return Ok(Arc::clone(&h.runtime));
    }
    if let Some(stale) = held.take() {
        tracing::warn!(
            target: TARGET,
            inherited_pid = stale.pid,
            pid,
            "store runtime inherited through fork; building a new one"
        );
        std::mem::forget(stale.runtime);
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("longshore-shards-io")
        .enable_all()
        .build()
        .map(Arc::new)
        .map_err(|e| ShardError::Runtime {
            reason: format!("cannot build the tokio runtime: {e}"),
        })?;
    tracing::debug!(target: TARGET, pid, threads, "store runtime started");
    *held = Some(HeldRuntime {
        pid,
        runtime: Arc::clone(&runtime),
    });
    Ok(runtime)
}

/// Runs a future to completion on the process's store runtime ([`runtime`]), from a
/// synchronous thread such as a loader worker.
///
/// # Errors
///
/// [`ShardError::Runtime`] if the runtime cannot be built, or if called from inside an async
/// runtime (await the `*_async` methods there instead: blocking a runtime thread deadlocks).
pub fn block_on<F: Future>(future: F) -> Result<F::Output, ShardError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(ShardError::Runtime {
            reason: "block_on called from inside an async runtime; await the async method".into(),
        });
    }
    Ok(runtime()?.block_on(future))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_process_gets_a_new_runtime() {
        let pid = std::process::id();
        let a = runtime_for(pid).unwrap();
        let b = runtime_for(pid).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one runtime per process");
        // As seen from a child forked after the runtime existed: another pid.
        let child = runtime_for(pid.wrapping_add(1)).unwrap();
        assert!(
            !Arc::ptr_eq(&a, &child),
            "a forked process builds its own runtime"
        );
        assert_eq!(child.block_on(async { 7 }), 7);
        // Back in this process (as the test's other users expect).
        let again = runtime_for(pid).unwrap();
        assert_eq!(again.block_on(async { 8 }), 8);
    }

    #[test]
    fn block_on_refuses_inside_a_runtime() {
        let rt = runtime().unwrap();
        let inner = rt.block_on(async { block_on(async { 1 }) });
        assert!(matches!(inner, Err(ShardError::Runtime { .. })));
    }
}
