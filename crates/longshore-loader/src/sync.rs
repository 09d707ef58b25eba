//! The loader's one locking helper, below every module that shares state.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning (no loader invariant spans a panic inside these locks).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
