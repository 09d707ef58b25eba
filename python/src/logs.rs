//! The Rust crates' `tracing` events in Python's `logging`: every event at `INFO` or above
//! whose target starts with `longshore` is queued (a bounded queue: when Python does not
//! drain it, the newest are dropped and counted) and handed to `longshore/_logs.py`, whose
//! thread emits each on `logging.getLogger(target)` with `::` read as `.`
//! (`longshore::shards` -> `longshore.shards`, a child of `longshore`). No Rust thread takes
//! the GIL to log: the Python thread takes the queued records every 0.2 s.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};
use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Records waiting for Python, at most.
const QUEUE: usize = 10_000;

/// One record: Python's level number, the logger's name, the message.
type Record = (u8, String, String);

struct Queue {
    tx: Sender<Record>,
    rx: Receiver<Record>,
    dropped: AtomicU64,
}

static QUEUE_CELL: OnceLock<Queue> = OnceLock::new();

fn queue() -> &'static Queue {
    QUEUE_CELL.get_or_init(|| {
        let (tx, rx) = bounded(QUEUE);
        Queue {
            tx,
            rx,
            dropped: AtomicU64::new(0),
        }
    })
}

/// The event's message and its other fields (`key=value`).
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

/// The layer that queues longshore's events for Python.
struct ToPython;

impl<S: Subscriber> Layer<S> for ToPython {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        *metadata.level() <= Level::INFO && metadata.target().starts_with("longshore")
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let level = match *meta.level() {
            Level::ERROR => 40,
            Level::WARN => 30,
            _ => 20,
        };
        let mut text = Text::default();
        event.record(&mut text);
        let logger = meta.target().replace("::", ".");
        let q = queue();
        if q.tx
            .try_send((level, logger, text.message + &text.fields))
            .is_err()
        {
            q.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Installs the layer as the process's `tracing` subscriber, unless one is set already (an
/// application embedding Python that set its own keeps it).
pub(crate) fn install() {
    let subscriber = tracing_subscriber::registry().with(ToPython);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// `_next_logs(timeout)`: the records queued, waiting up to `timeout` seconds (the GIL
/// released) for the first; an empty list when none came. A record saying how many were
/// dropped comes first when the queue overflowed. With `timeout <= 0` it takes what is
/// queued without waiting and without releasing the GIL: what `_logs.py`'s thread calls, so
/// that it never has to take the GIL back from Rust while the interpreter finalizes (a daemon
/// thread doing so is ended by CPython with `pthread_exit`, which must not unwind Rust frames).
#[pyfunction]
pub(crate) fn _next_logs(py: Python<'_>, timeout: f64) -> Vec<Record> {
    let q = queue();
    let first = if timeout > 0.0 {
        let wait = Duration::from_secs_f64(timeout.min(3600.0));
        py.detach(|| q.rx.recv_timeout(wait).ok())
    } else {
        None
    };
    let mut out = Vec::new();
    let dropped = q.dropped.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        out.push((
            30,
            "longshore".to_owned(),
            format!("{dropped} log records were dropped: Python did not take them in time"),
        ));
    }
    out.extend(first);
    out.extend(q.rx.try_iter().take(1024));
    out
}
