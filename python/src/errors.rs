//! Rust errors as Python exceptions: option errors are `ValueError` (as PyTorch raises them),
//! a missing file `FileNotFoundError`, a failing sample `longshore.SampleError` naming the
//! sample, batch and file, everything else `longshore.LoaderError` (a `RuntimeError`).

use longshore::data::DataError;
use longshore::dlpack::DlpackError;
use longshore::loader::LoaderError;
use pyo3::exceptions::{
    PyBufferError, PyFileNotFoundError, PyOSError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;

pyo3::create_exception!(
    longshore,
    LoaderFailure,
    PyRuntimeError,
    "A failure of the loader (a worker, the memory pool, a device copy)."
);
pyo3::create_exception!(
    longshore,
    SampleError,
    LoaderFailure,
    "A sample could not be loaded or collated; the message names the sample, batch and file."
);
pyo3::create_exception!(
    longshore,
    LoaderTimeout,
    PyTimeoutError,
    "No batch arrived within the loader's `timeout`."
);

/// The full message: the error and its chain of sources.
fn message(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        src = cause.source();
    }
    s
}

/// A data-layer error (opening a file, a bad argument).
pub(crate) fn data_err(e: DataError) -> PyErr {
    let msg = message(&e);
    match &e {
        DataError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        DataError::Io { .. } => PyOSError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// A loader error.
pub(crate) fn loader_err(e: LoaderError) -> PyErr {
    let msg = message(&e);
    match e {
        LoaderError::Config { .. } => PyValueError::new_err(msg),
        LoaderError::Data(d) => data_err(d),
        LoaderError::Sample { .. } | LoaderError::Collate { .. } => SampleError::new_err(msg),
        LoaderError::Timeout { .. } => LoaderTimeout::new_err(msg),
        _ => LoaderFailure::new_err(msg),
    }
}

/// A DLPack export error: what the protocol calls a `BufferError`.
pub(crate) fn dlpack_err(e: DlpackError) -> PyErr {
    match e {
        DlpackError::Transfer(t) => LoaderFailure::new_err(message(&t)),
        other => PyBufferError::new_err(message(&other)),
    }
}

/// A transfer error (opening a device, a stream operation).
pub(crate) fn transfer_err(e: longshore::transfer::TransferError) -> PyErr {
    LoaderFailure::new_err(message(&e))
}

/// A sharded dataset's error (longshore-shards): an option or resume state that does not fit
/// is a `ValueError`, a shard that cannot be reached or read an `OSError`, a malformed shard,
/// index or sample a `longshore.LoaderError`; each message names the URL, shard, sample and
/// offset the error names.
pub(crate) fn shard_err(e: longshore::shards::ShardError) -> PyErr {
    use longshore::shards::ShardError as E;
    let msg = message(&e);
    match &e {
        E::Url { .. }
        | E::Order { .. }
        | E::Resume { .. }
        | E::Pattern { .. }
        | E::StoreConfig { .. }
        | E::BudgetTooSmall { .. }
        | E::MdsCompression { .. } => PyValueError::new_err(msg),
        E::Fetch { .. } | E::MissingShard { .. } | E::Io { .. } | E::CacheFull { .. } => {
            PyOSError::new_err(msg)
        }
        _ => LoaderFailure::new_err(msg),
    }
}
