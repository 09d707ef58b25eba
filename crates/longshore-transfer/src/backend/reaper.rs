//! Deferred drops: values whose memory an in-flight copy may still use are dropped on a
//! background thread once the copy's event has completed, so that neither the caller nor a
//! stream worker (nor the CUDA event watcher) blocks in a destructor.

use std::sync::OnceLock;

use crossbeam_channel::{Sender, unbounded};

type Garbage = Box<dyn Send + 'static>;

fn reaper() -> Option<&'static Sender<Garbage>> {
    static TX: OnceLock<Option<Sender<Garbage>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = unbounded::<Garbage>();
        let spawned = std::thread::Builder::new().name("longshore-reaper".into()).spawn(move || {
            for garbage in rx {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(garbage))).is_err() {
                    tracing::error!(target: "longshore::transfer", "a deferred drop panicked");
                }
            }
        });
        match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(target: "longshore::transfer", error = %e, "cannot spawn the reaper thread; deferred drops run inline");
                None
            }
        }
    })
    .as_ref()
}

/// Drops `value` on the reaper thread (inline if that thread could not be started).
pub(crate) fn drop_later<T: Send + 'static>(value: T) {
    match reaper() {
        Some(tx) => {
            if let Err(e) = tx.send(Box::new(value)) {
                drop(e.into_inner());
            }
        }
        None => drop(value),
    }
}
