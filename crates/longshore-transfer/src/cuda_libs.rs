//! Finding the CUDA libraries loaded at run time where a PyTorch user has them, with no
//! symlinks and no `LD_LIBRARY_PATH`: any library a crate above names with a [`LibrarySpec`]
//! (its sonames, its pip packages' folders, its companions). This crate defines one, [`NVRTC`]
//! (for [`compile_ptx`] with feature `cuda`); others live with the crate that loads them, e.g.
//! longshore-nvjpeg's `NVJPEG`.
//!
//! cudarc's loader only tries unversioned and CUDA-12 names on the system search path, so a
//! pip-installed library (`site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.13`) or a CUDA 13
//! one is not found by it. [`search_order`] lists, in order, every file a library is looked
//! for as:
//!
//! 1. its versioned sonames, newest first (`libnvrtc.so.13`, `.12`, ...), then the unversioned
//!    name, on the **system search path** (`LD_LIBRARY_PATH`, the `ldconfig` cache, `/lib`,
//!    `/usr/lib`), as `dlopen` finds bare names;
//! 2. the **toolkit** named by `CUDA_HOME`, `CUDA_PATH` or `CUDA_ROOT` (`lib64`, `lib`);
//! 3. the **active Python's packages**: the spec's folders of the `nvidia-*` pip packages
//!    (e.g. `nvidia/cuda_nvrtc/lib`) and `torch/lib`, in the `site-packages` of `VIRTUAL_ENV`,
//!    `CONDA_PREFIX`, and the prefix of the first `python3` (or `python`) on `PATH` (found from
//!    the folder layout, without running Python);
//! 4. the toolkits under `/usr/local` (`/usr/local/cuda/lib64`, then `/usr/local/cuda-*`, newest
//!    first) and the distribution's folders (`/usr/lib/<arch>-linux-gnu`, `/lib/<arch>-linux-gnu`);
//! 5. the user's and the system's Python packages (`~/.local/lib/python3*/site-packages`,
//!    `/usr/local/lib/python3*/{site,dist}-packages`, `/usr/lib/python3/dist-packages`);
//! 6. as a last resort, only when no `site-packages` folder was found above, the folders that
//!    `python3 -c "import site; ..."` reports (run once per process, at most).
//!
//! Companion libraries are loaded first from the same folder (`libnvrtc-builtins` beside
//! NVRTC), so their own lookups succeed wherever they live.
//! With feature `cuda`, [`load`] opens the first candidate that loads, says which file in a
//! `debug!` (target `longshore::transfer`), and otherwise fails with a [`LibraryNotFound`]
//! naming every place searched and why each failed.

#[cfg(feature = "cuda")]
pub use crate::backend::cuda::libs::{Library, load, load_from};
#[cfg(feature = "cuda")]
pub use crate::backend::cuda::nvrtc::{compile_ptx, nvrtc_available};
pub use crate::lib_search::{
    Candidate, LibraryNotFound, LibrarySpec, NVRTC, SearchEnv, search_order, search_order_in,
};
