//! Read-only memory maps of files: the one place in `longshore-data` where unsafe code
//! is allowed (the crate denies it everywhere else).
//!
//! # The file-modification hazard
//!
//! A memory map is a view of the file's pages, not a copy. The mapping stays valid after
//! the `File` is closed, but if another process writes the file while it is mapped the
//! bytes change under the `&[u8]` views handed out, and if another process truncates it,
//! reading the lost pages raises `SIGBUS`. Neither can be checked for: **files must not be
//! modified or truncated while mapped.** Callers check the mapped length against what
//! the header or record layout says before reading, so a file that was short to begin with
//! is an error, not a fault.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::DataError;

/// Maps `file` read-only into memory (see the module notes on modifying mapped files).
fn map_readonly(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: `Mmap::map` is unsafe only because the mapped memory may change under us if the
    // file is modified by someone else while mapped. We map read-only, never write through the
    // map, hand out only `&[u8]` views tied to the `Mmap`'s lifetime, and document (module
    // notes, `formats` and the dataset types) that mapped files must not be modified; lengths
    // are checked by callers before reading.
    unsafe { Mmap::map(file) }
}

/// Opens `path` read-only and maps it.
///
/// # Errors
/// [`DataError::Io`] naming `path` when it cannot be opened or mapped.
pub(crate) fn open_map(path: &Path) -> Result<Mmap, DataError> {
    let io = |source| DataError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    map_readonly(&file).map_err(io)
}
