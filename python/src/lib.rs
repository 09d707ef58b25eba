//! `longshore._longshore`: the native module of the `longshore` Python package, a thin layer
//! over the Rust crates (`longshore-loader` for the loader, `longshore-dlpack` for handing
//! batches to PyTorch and NumPy). The Python package (`longshore/__init__.py`) adds the
//! `DataLoader` class, which picks how batches are converted: `_TorchConverter` (a batch per
//! Rust call into torch) or `np.from_dlpack` per tensor, and `longshore.data` (samplers and
//! dataset helpers), over `_EpochOrder`, `_Native` and `_Mixture`.

/// `$d[name] = $s.name` for each field `name` of the record `$s` (counters as a Python dict).
macro_rules! set_fields {
    ($d:expr, $s:expr, $($field:ident),* $(,)?) => {
        $($d.set_item(stringify!($field), $s.$field)?;)*
    };
}

mod boxed;
mod dataset;
mod epoch;
mod errors;
mod fields;
mod loader;
mod logs;
mod mixture;
mod nvjpeg;
mod pump;
mod pydata;
mod sampler;
mod shards;
mod source;
mod tensor;
mod tokens;
mod torch;
mod upload;
mod vision;

use pyo3::prelude::*;

/// Whether a CUDA driver can be used here, and why not.
#[pyfunction]
fn cuda_status() -> (bool, Option<String>) {
    (
        longshore::host::driver_available(),
        longshore::host::driver_unavailable_reason(),
    )
}

#[pymodule]
fn _longshore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    macro_rules! add {
        (classes: $($class:ty),*; functions: $($function:path),* $(,)?) => {
            $(m.add_class::<$class>()?;)*
            $(m.add_function(wrap_pyfunction!($function, m)?)?;)*
        };
    }
    add! {
        classes: dataset::PyNpyDataset, dataset::PyRecordDataset, dataset::PyNative,
            mixture::PyMixture, mixture::PySchedule, mixture::PyWeights, sampler::PyEpochOrder,
            loader::PyLoader, epoch::PyEpoch, loader::PyPinnedPool, tensor::PyTensor,
            torch::PyTorchConverter, vision::PyImageFolder, tokens::PyTokenSequences,
            shards::PyShards, shards::PyShardIter, fields::PyRecordIter, pydata::PyProcessSource;
        functions: sampler::_random_indices, sampler::_permutation, sampler::_weighted_indices,
            sampler::_distributed_indices, sampler::_dist_env, shards::write_image_shards,
            pydata::_at_exit, logs::_next_logs, vision::write_synthetic_folder, cuda_status,
            torch::_cuda_bytes_copied_on,
    }
    logs::install();
    m.add("LoaderError", py.get_type::<errors::LoaderFailure>())?;
    m.add("SampleError", py.get_type::<errors::SampleError>())?;
    m.add("LoaderTimeout", errors::loader_timeout_type(py)?)?;
    Ok(())
}
