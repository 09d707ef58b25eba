//! Loading the CUDA libraries found by [`crate::cuda_libs`]: `dlopen` of each candidate in
//! order, companions first, the first that loads kept for the process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::lib_search::{Candidate, LibraryNotFound, LibrarySpec, NOT_FOUND, search_order};

/// A loaded shared library: where it came from, and its symbols.
#[derive(Debug)]
pub struct Library {
    lib: libloading::Library,
    path: PathBuf,
    /// Companions loaded from the same folder first, kept loaded as long as it is.
    _companions: Vec<libloading::Library>,
}

impl Library {
    /// The file that was loaded: a full path, or the bare soname the system search path
    /// resolved.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address of the function `symbol`, as a function pointer of type `T`.
    ///
    /// # Safety
    /// `T` is an `extern "C" fn` type with exactly the symbol's signature.
    pub unsafe fn get<T: Copy>(&self, symbol: &str) -> Result<T, String> {
        // SAFETY: forwarded from the caller (the type matches the symbol).
        unsafe { self.lib.get::<T>(symbol.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("{} has no {symbol}: {e}", self.path.display()))
    }
}

/// Loads `spec` from the first of [`search_order`]'s candidates that loads, once per process
/// (later calls return the same library, or the same error).
pub fn load(spec: &LibrarySpec) -> Result<&'static Library, LibraryNotFound> {
    type Loaded = Mutex<HashMap<&'static str, Result<&'static Library, LibraryNotFound>>>;
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    let mut map = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    map.entry(spec.name)
        .or_insert_with(|| {
            // Kept for the process, as the driver is: symbols handed out stay valid.
            load_from(spec, &search_order(spec)).map(|l| &*Box::leak(Box::new(l)))
        })
        .clone()
}

/// Loads `spec` from the first of `candidates` that loads (no caching): a full path that does
/// not exist fails as "not found" without a `dlopen`.
pub fn load_from(spec: &LibrarySpec, candidates: &[Candidate]) -> Result<Library, LibraryNotFound> {
    let mut tried = Vec::new();
    for c in candidates {
        let full = c.file.parent().is_some_and(|d| !d.as_os_str().is_empty());
        if full && !c.file.exists() {
            tried.push((c.clone(), NOT_FOUND.to_owned()));
            continue;
        }
        let companions = if full {
            companions(spec, &c.file)
        } else {
            Vec::new()
        };
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions
        // on us; the handle is kept while any symbol from it is used (the library lives for
        // the process once `load` keeps it).
        match unsafe { libloading::Library::new(&c.file) } {
            Ok(lib) => {
                tracing::debug!(target: "longshore::transfer", library = spec.name, file = %c.file.display(), origin = %c.origin, "cuda library loaded");
                return Ok(Library {
                    lib,
                    path: c.file.clone(),
                    _companions: companions,
                });
            }
            Err(e) => tried.push((c.clone(), e.to_string())),
        }
    }
    Err(LibraryNotFound {
        library: spec.name,
        tried,
    })
}

/// Loads the companions of `spec` from `file`'s folder: `<prefix>.<major>*` first, then any
/// `<prefix>*`. Failures are only logged (the library may not need them there).
fn companions(spec: &LibrarySpec, file: &Path) -> Vec<libloading::Library> {
    let Some(dir) = file.parent() else {
        return Vec::new();
    };
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let major = name
        .split(".so.")
        .nth(1)
        .and_then(|v| v.split('.').next())
        .unwrap_or("");
    let entries: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut out = Vec::new();
    for prefix in spec.companions {
        let versioned = format!("{prefix}.{major}");
        let pick = entries
            .iter()
            .filter(|e| !major.is_empty() && e.starts_with(&versioned))
            .chain(entries.iter().filter(|e| e.starts_with(prefix)))
            .min_by_key(|e| !e.starts_with(&versioned));
        if let Some(pick) = pick {
            let path = dir.join(pick);
            // SAFETY: as for the library itself: a CUDA library's initialisers.
            match unsafe { libloading::Library::new(&path) } {
                Ok(l) => out.push(l),
                Err(e) => {
                    tracing::debug!(target: "longshore::transfer", file = %path.display(), error = %e, "companion library not loaded")
                }
            }
        }
    }
    out
}
