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
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

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

/// `longshore.LoaderTimeout`: no batch arrived within the loader's `timeout`. Both a
/// `RuntimeError` (a `LoaderError`, what PyTorch's loader raises at its timeout, so `except
/// RuntimeError` catches it as it catches torch's) and a `TimeoutError`. Made once, by
/// `type(...)`, since a class with two built-in bases cannot be declared by pyo3's macro.
static LOADER_TIMEOUT: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The `LoaderTimeout` class (see [`LOADER_TIMEOUT`]).
pub(crate) fn loader_timeout_type(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    LOADER_TIMEOUT
        .get_or_try_init(py, || -> PyResult<Py<PyType>> {
            let bases = (
                py.get_type::<PyTimeoutError>(),
                py.get_type::<LoaderFailure>(),
            );
            let attrs = PyDict::new(py);
            attrs.set_item("__module__", "longshore")?;
            attrs.set_item(
                "__doc__",
                "No batch arrived within the loader's `timeout`: a `LoaderError` (a \
                 `RuntimeError`, as PyTorch raises) and a `TimeoutError`.",
            )?;
            let ty = py
                .get_type::<PyType>()
                .call1(("LoaderTimeout", bases, attrs))?;
            Ok(ty.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py).clone())
}

fn timeout_err(msg: String) -> PyErr {
    Python::attach(|py| match loader_timeout_type(py) {
        Ok(ty) => PyErr::from_type(ty, msg),
        Err(e) => e,
    })
}

/// What to do when the process is out of file descriptors, as PyTorch advises (empty for
/// other errors).
pub(crate) fn fd_advice(e: &std::io::Error) -> &'static str {
    if e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE) {
        " (too many open files: raise the limit with `ulimit -n` in the shell, or use fewer \
         workers; every worker holds a pipe and maps the loader's shared blocks)"
    } else {
        ""
    }
}

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

/// A loader error. An invalid option is a `ValueError` with the builder's reason alone, which
/// names the option in PyTorch's words: the message torch's `ValueError` has.
pub(crate) fn loader_err(e: LoaderError) -> PyErr {
    let msg = message(&e);
    match e {
        LoaderError::Config { reason, .. } => PyValueError::new_err(reason),
        LoaderError::Data(d) => data_err(d),
        LoaderError::Sample { .. } | LoaderError::Collate { .. } => SampleError::new_err(msg),
        LoaderError::Timeout { .. } => timeout_err(msg),
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
        E::Fetch { .. }
        | E::MissingShard { .. }
        | E::Io { .. }
        | E::CacheFull { .. }
        | E::Damaged { .. } => PyOSError::new_err(msg),
        _ => LoaderFailure::new_err(msg),
    }
}
