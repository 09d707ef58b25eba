//! Read-only memory maps of files, for memory-mapped datasets.
//!
//! The one `unsafe` operation a memory-mapped dataset needs lives here, so that
//! `longshore-data` can forbid unsafe code entirely.

use std::fs::File;

/// Maps `file` read-only into memory.
///
/// The mapping stays valid after `file` is closed. As with every memory map, the bytes change
/// if another process writes the file, and reading past a region another process truncated
/// away raises `SIGBUS`: files must not be modified or truncated while mapped. Callers check
/// the mapped length against what they expect before reading.
pub fn map_readonly(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: `Mmap::map` is unsafe only because the mapped memory may change under us if the
    // file is modified by someone else while mapped. We map read-only, never write through the
    // map, hand out only `&[u8]` views tied to the `Mmap`'s lifetime, and document above that
    // mapped files must not be modified; lengths are checked by callers before reading.
    unsafe { memmap2::Mmap::map(file) }
}
