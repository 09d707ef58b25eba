//! CUDA events: recorded `CUevent`s, and the watcher thread that runs callbacks (wakes
//! futures) when the events being awaited complete.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use cudarc::driver::{CudaEvent, CudaStream};
use longshore_host::Fence;

use super::{CudaDevice, HostFn, err};
use crate::error::Result;

/// A recorded CUDA event.
#[derive(Debug)]
pub(crate) struct CuEvent {
    ev: CudaEvent,
    ordinal: usize,
}

impl CuEvent {
    pub(crate) fn record(dev: &CudaDevice, stream: &CudaStream, stream_id: u64) -> Result<Self> {
        let ev = stream.record_event(None).map_err(|e| {
            err(
                "cuEventRecord",
                e,
                dev.ordinal,
                format!("recording an event on stream {stream_id}"),
            )
        })?;
        Ok(Self {
            ev,
            ordinal: dev.ordinal,
        })
    }

    /// A new event, not yet recorded (complete until it is).
    pub(crate) fn create(dev: &CudaDevice) -> Result<Self> {
        let ev = dev
            .ctx
            .new_event(None)
            .map_err(|e| err("cuEventCreate", e, dev.ordinal, "creating an event"))?;
        Ok(Self {
            ev,
            ordinal: dev.ordinal,
        })
    }

    /// Records the event again, at the current end of `stream`: from now on it completes with
    /// that work. Whoever holds it as a fence must not need its earlier position any more.
    pub(crate) fn rerecord(&self, stream: &CudaStream, stream_id: u64) -> Result<()> {
        self.ev.record(stream).map_err(|e| {
            err(
                "cuEventRecord",
                e,
                self.ordinal,
                format!("recording an event on stream {stream_id}"),
            )
        })
    }

    pub(super) fn raw(&self) -> &CudaEvent {
        &self.ev
    }

    /// Non-blocking query. A failed query (a broken context) counts as complete: no device
    /// access can happen any more, and reporting incomplete forever would hang every waiter.
    pub(crate) fn is_complete(&self) -> bool {
        match self.ev.try_is_complete() {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(target: "longshore::transfer", device = self.ordinal, error = ?e.0, "cuEventQuery failed; treating the event as complete");
                true
            }
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ev.synchronize().map_err(|e| {
            err(
                "cuEventSynchronize",
                e,
                self.ordinal,
                "waiting for an event",
            )
        })
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
