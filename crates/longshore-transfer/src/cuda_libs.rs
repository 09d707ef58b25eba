//! Finding the CUDA libraries that crates above load at run time (NCCL, cuBLAS, NVRTC) where a
//! PyTorch user has them, with no symlinks and no `LD_LIBRARY_PATH`.
//!
//! cudarc's loader only tries unversioned and CUDA-12 names on the system search path, so a
//! pip-installed NCCL (`site-packages/nvidia/nccl/lib/libnccl.so.2`) or a CUDA 13 cuBLAS is not
//! found by it. [`search_order`] lists, in order, every file a library is looked for as:
//!
//! 1. its versioned sonames, newest first (`libnccl.so.2`, `libcublas.so.13`, `.12`, ...), then
//!    the unversioned name, on the **system search path** (`LD_LIBRARY_PATH`, the `ldconfig`
//!    cache, `/lib`, `/usr/lib`), as `dlopen` finds bare names;
//! 2. the **toolkit** named by `CUDA_HOME`, `CUDA_PATH` or `CUDA_ROOT` (`lib64`, `lib`);
//! 3. the **active Python's packages**: the library folders of the `nvidia-*` pip packages
//!    (`nvidia/nccl/lib`, `nvidia/cublas/lib`, `nvidia/cuda_nvrtc/lib`) and `torch/lib`, in the
//!    `site-packages` of `VIRTUAL_ENV`, `CONDA_PREFIX`, and the prefix of the first `python3`
//!    (or `python`) on `PATH` (found from the folder layout, without running Python);
//! 4. the toolkits under `/usr/local` (`/usr/local/cuda/lib64`, then `/usr/local/cuda-*`, newest
//!    first) and the distribution's folders (`/usr/lib/<arch>-linux-gnu`, `/lib/<arch>-linux-gnu`);
//! 5. the user's and the system's Python packages (`~/.local/lib/python3*/site-packages`,
//!    `/usr/local/lib/python3*/{site,dist}-packages`, `/usr/lib/python3/dist-packages`);
//! 6. as a last resort, only when no `site-packages` folder was found above, the folders that
//!    `python3 -c "import site; ..."` reports (run once per process, at most).
//!
//! Companion libraries are loaded first from the same folder (`libcublasLt` beside cuBLAS,
//! `libnvrtc-builtins` beside NVRTC), so their own lookups succeed wherever they live.
//! With feature `cuda`, [`load`] opens the first candidate that loads, says which file in a
//! `debug!` (target `longshore::transfer`), and otherwise fails with a [`LibraryNotFound`]
//! naming every place searched and why each failed.

#[cfg(feature = "cuda")]
pub use crate::backend::cuda::libs::{Library, load, load_from};
#[cfg(feature = "cuda")]
pub use crate::backend::cuda::nvrtc::{compile_ptx, nvrtc_available};
pub use crate::lib_search::{
    CUBLAS, Candidate, LibraryNotFound, LibrarySpec, NCCL, NVRTC, SearchEnv, search_order,
    search_order_in,
};
