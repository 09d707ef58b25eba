//! Errors of the loader.

use std::time::Duration;

use longshore_data::DataError;
use longshore_host::HostError;

/// Everything the loader can report, each naming where it happened (worker, batch, sample).
///
/// `Display` says what failed and where; the cause (the dataset's, the pool's, the OS's
/// error) is [`source()`](std::error::Error::source), never repeated in the message. Print
/// the whole chain with `anyhow`'s `{:#}`, or walk `source()`:
///
/// ```
/// # use longshore_loader::LoaderError;
/// # let e = LoaderError::Sample { index: 7, batch: 1, source: longshore_data::DataError::Empty { what: "row" } };
/// let mut text = e.to_string();
/// let mut cause = std::error::Error::source(&e);
/// while let Some(c) = cause {
///     text += &format!(": {c}");
///     cause = c.source();
/// }
/// assert!(text.starts_with("failed to load sample 7 (batch 1): "));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoaderError {
    /// An option, or a combination of options, is invalid (PyTorch raises `ValueError`).
    #[error("invalid loader option `{option}`: {reason}")]
    Config {
        /// The option, as named in the builder.
        option: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// A sample could not be loaded.
    #[error("failed to load sample {index} (batch {batch})")]
    Sample {
        /// The dataset index.
        index: usize,
        /// The batch's position in the epoch.
        batch: u64,
        /// The dataset's error.
        #[source]
        source: DataError,
    },
    /// A batch could not be collated.
    #[error("failed to collate batch {batch}")]
    Collate {
        /// The batch's position in the epoch.
        batch: u64,
        /// The collate error.
        #[source]
        source: DataError,
    },
    /// The sampler or dataset refused an operation outside a batch.
    #[error(transparent)]
    Data(#[from] DataError),
    /// No host memory could be leased for a batch.
    #[error("no host memory for batch {batch}")]
    Memory {
        /// The batch's position in the epoch.
        batch: u64,
        /// The pool's error (budget, driver, ...).
        #[source]
        source: HostError,
    },
    /// Host memory could not be set up.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A worker panicked while loading a batch.
    #[error("worker {worker} panicked while loading batch {batch}: {message}")]
    WorkerPanicked {
        /// The worker id.
        worker: usize,
        /// The batch's position in the epoch.
        batch: u64,
        /// The panic message.
        message: String,
    },
    /// No batch arrived within the loader's `timeout`.
    #[error("timed out after {waited:?} waiting for batch {batch} from worker {worker}")]
    Timeout {
        /// The worker the batch was sent to.
        worker: usize,
        /// The batch's position in the epoch.
        batch: u64,
        /// How long the loader waited.
        waited: Duration,
    },
    /// A worker thread is gone (it ended without answering).
    #[error("worker {worker} is gone; batch {batch} cannot be loaded")]
    WorkerGone {
        /// The worker id.
        worker: usize,
        /// The batch it held.
        batch: u64,
    },
    /// A worker thread could not be started.
    #[error("could not start worker {worker}")]
    Spawn {
        /// The worker id.
        worker: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A saved loader state does not fit this loader.
    #[error("cannot restore loader state: {0}")]
    State(String),
    /// A copy to or from the device failed.
    #[error(transparent)]
    Transfer(#[from] longshore_transfer::TransferError),
}

/// `e` and its causes, joined by `": "` (for log fields: a `LoaderError`'s own `Display`
/// leaves its cause to `source()`).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}
