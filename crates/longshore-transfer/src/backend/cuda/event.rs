//! CUDA events: recorded `CUevent`s, and the watcher thread that runs callbacks (wakes
//! futures) when the events being awaited complete.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use cudarc::driver::{CudaEvent, CudaStream};
use longshore_host::Fence;

use super::{CudaDevice, HostFn, err};
use crate::error::Result;

/// Events of one context that nobody references any more, reused by the next record instead
/// of a `cuEventCreate` + `cuEventDestroy` pair per event (several per batch on the loader's
/// hot path). Re-recording an event is safe once its last [`CuEvent`] is gone: a
/// `cuStreamWaitEvent` made earlier waits for the record it saw, and no one can query it.
#[derive(Debug, Default)]
pub(crate) struct EventCache {
    free: Mutex<Vec<CudaEvent>>,
}

/// Events kept per device at most; more are destroyed.
const EVENT_CACHE_MAX: usize = 1024;

impl EventCache {
    fn take(&self) -> Option<CudaEvent> {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give(&self, ev: CudaEvent) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < EVENT_CACHE_MAX {
            free.push(ev);
        }
    }
}

/// A recorded CUDA event.
#[derive(Debug)]
pub(crate) struct CuEvent {
    /// Always `Some` until drop hands it back to `cache`.
    ev: Option<CudaEvent>,
    ordinal: usize,
    cache: Arc<EventCache>,
}

impl CuEvent {
    pub(crate) fn record(dev: &CudaDevice, stream: &CudaStream, stream_id: u64) -> Result<Self> {
        let ev = Self::create(dev)?;
        ev.rerecord(stream, stream_id)?;
        Ok(ev)
    }

    /// An event to record: a cached one (which may still be pending from its last record:
    /// record it before anyone waits on it), or a new one (complete until recorded).
    pub(crate) fn create(dev: &CudaDevice) -> Result<Self> {
        let ev = match dev.events.take() {
            Some(ev) => ev,
            None => dev
                .ctx
                .new_event(None)
                .map_err(|e| err("cuEventCreate", e, dev.ordinal, "creating an event"))?,
        };
        Ok(Self {
            ev: Some(ev),
            ordinal: dev.ordinal,
            cache: dev.events.clone(),
        })
    }

    /// Records the event again, at the current end of `stream`: from now on it completes with
    /// that work. Whoever holds it as a fence must not need its earlier position any more.
    pub(crate) fn rerecord(&self, stream: &CudaStream, stream_id: u64) -> Result<()> {
        self.raw().record(stream).map_err(|e| {
            err(
                "cuEventRecord",
                e,
                self.ordinal,
                format!("recording an event on stream {stream_id}"),
            )
        })
    }

    pub(super) fn raw(&self) -> &CudaEvent {
        self.ev
            .as_ref()
            .expect("a CuEvent holds its event until dropped")
    }

    /// Non-blocking query. A failed query (a broken context) counts as complete: no device
    /// access can happen any more, and reporting incomplete forever would hang every waiter.
    pub(crate) fn is_complete(&self) -> bool {
        match self.raw().try_is_complete() {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(target: "longshore::transfer", device = self.ordinal, error = ?e.0, "cuEventQuery failed; treating the event as complete");
                true
            }
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.raw().synchronize().map_err(|e| {
            err(
                "cuEventSynchronize",
                e,
                self.ordinal,
                "waiting for an event",
            )
        })
    }
}

impl Drop for CuEvent {
    fn drop(&mut self) {
        if let Some(ev) = self.ev.take() {
            self.cache.give(ev);
        }
    }
}

impl Fence for CuEvent {
    fn is_complete(&self) -> bool {
        CuEvent::is_complete(self)
    }

    fn wait(&self) {
        if let Err(e) = self.synchronize() {
            tracing::error!(target: "longshore::transfer", error = %e, "waiting on an event failed; the device is broken");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The event watcher.

struct Watch {
    event: Arc<CuEvent>,
    callback: HostFn,
}

fn watcher() -> Option<&'static Sender<Watch>> {
    static TX: OnceLock<Option<Sender<Watch>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = unbounded::<Watch>();
        match std::thread::Builder::new().name("longshore-cuda-events".into()).spawn(move || watch_loop(rx)) {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(target: "longshore::transfer", error = %e, "cannot spawn the CUDA event watcher");
                None
            }
        }
    })
    .as_ref()
}

fn watch_loop(rx: Receiver<Watch>) {
    let mut list: Vec<Watch> = Vec::new();
    let mut idle_rounds = 0u32;
    loop {
        if list.is_empty() {
            // Nothing awaited: block, costing nothing.
            match rx.recv() {
                Ok(w) => list.push(w),
                Err(_) => return,
            }
        }
        list.extend(rx.try_iter());
        let mut i = 0;
        let mut fired = false;
        while i < list.len() {
            if list[i].event.is_complete() {
                let w = list.swap_remove(i);
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(w.callback)).is_err() {
                    tracing::error!(target: "longshore::transfer", "an event completion callback panicked");
                }
                fired = true;
            } else {
                i += 1;
            }
        }
        if list.is_empty() {
            continue;
        }
        idle_rounds = if fired {
            0
        } else {
            idle_rounds.saturating_add(1)
        };
        // Back off from 5 us to 100 us between queries while nothing completes; a new
        // registration wakes the loop at once.
        let nap = Duration::from_micros((5u64 << idle_rounds.min(5)).min(100));
        match rx.recv_timeout(nap) {
            Ok(w) => list.push(w),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Runs `callback` on the watcher thread once `event` completes.
pub(crate) fn on_complete(event: &Arc<CuEvent>, callback: HostFn) {
    if event.is_complete() {
        callback();
        return;
    }
    match watcher() {
        Some(tx) => {
            if let Err(e) = tx.send(Watch {
                event: event.clone(),
                callback,
            }) {
                // The watcher is gone: fall back to waiting here.
                let w = e.into_inner();
                let _ = w.event.synchronize();
                (w.callback)();
            }
        }
        None => {
            let _ = event.synchronize();
            callback();
        }
    }
}
