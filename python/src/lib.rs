//! `longshore._longshore`: the native module of the `longshore` Python package, a thin layer
//! over the Rust crates (`longshore-loader` for the loader, `longshore-dlpack` for handing
//! batches to PyTorch and NumPy). The Python package (`longshore/__init__.py`) adds the
//! `DataLoader` class, which picks how batches are converted: `_TorchConverter` (a batch per
//! Rust call into torch) or `np.from_dlpack` per tensor, and `longshore.data` (samplers and
//! dataset helpers), over `_EpochOrder`, `_Native` and `_Mixture`.

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
    m.add_class::<dataset::PyNpyDataset>()?;
    m.add_class::<dataset::PyRecordDataset>()?;
    m.add_class::<dataset::PyNative>()?;
    m.add_class::<mixture::PyMixture>()?;
    m.add_class::<mixture::PySchedule>()?;
    m.add_class::<mixture::PyWeights>()?;
    m.add_class::<sampler::PyEpochOrder>()?;
    m.add_function(wrap_pyfunction!(sampler::_random_indices, m)?)?;
    m.add_function(wrap_pyfunction!(sampler::_permutation, m)?)?;
    m.add_function(wrap_pyfunction!(sampler::_weighted_indices, m)?)?;
    m.add_function(wrap_pyfunction!(sampler::_distributed_indices, m)?)?;
    m.add_function(wrap_pyfunction!(sampler::_dist_env, m)?)?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<epoch::PyEpoch>()?;
    m.add_class::<loader::PyPinnedPool>()?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<torch::PyTorchConverter>()?;
    m.add_class::<vision::PyImageFolder>()?;
    m.add_class::<tokens::PyTokenSequences>()?;
    m.add_class::<shards::PyShards>()?;
    m.add_class::<shards::PyShardIter>()?;
    m.add_class::<fields::PyRecordIter>()?;
    m.add_function(wrap_pyfunction!(shards::write_image_shards, m)?)?;
    m.add_class::<pydata::PyProcessSource>()?;
    m.add_function(wrap_pyfunction!(pydata::_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_next_logs, m)?)?;
    logs::install();
    m.add_function(wrap_pyfunction!(vision::write_synthetic_folder, m)?)?;
    m.add("LoaderError", py.get_type::<errors::LoaderFailure>())?;
    m.add("SampleError", py.get_type::<errors::SampleError>())?;
    m.add("LoaderTimeout", errors::loader_timeout_type(py)?)?;
    m.add_function(wrap_pyfunction!(cuda_status, m)?)?;
    m.add_function(wrap_pyfunction!(torch::_cuda_bytes_copied_on, m)?)?;
    Ok(())
}
