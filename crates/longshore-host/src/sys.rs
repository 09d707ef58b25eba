//! Facts about the host: page size, physical memory, the locked-memory limit.

use std::sync::OnceLock;

/// The size of a virtual-memory page in bytes (4096 on most x86-64 Linux hosts).
pub fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions; it only reads a system constant.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if v > 0 { v as usize } else { 4096 }
    })
}

/// Physical RAM of the host in bytes, or `None` if the OS does not say.
pub fn physical_memory() -> Option<usize> {
    // Miri does not implement `sysconf(_SC_PHYS_PAGES)`; callers already handle "unknown".
    if cfg!(miri) {
        return None;
    }
    // SAFETY: sysconf has no preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    if pages <= 0 {
        return None;
    }
    (pages as usize).checked_mul(page_size())
}

/// The soft `RLIMIT_MEMLOCK` in bytes: `None` means unlimited.
///
/// `mlock` fails past this limit unless the process has `CAP_IPC_LOCK`.
pub fn memlock_limit() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur as usize)
}

/// Human-readable `RLIMIT_MEMLOCK`, for error messages.
pub(crate) fn memlock_limit_text() -> String {
    match memlock_limit() {
        None => "unlimited".to_owned(),
        Some(b) => format!("{b} bytes"),
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two); `None` on overflow.
pub(crate) fn round_up(n: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    n.checked_add(align - 1).map(|v| v & !(align - 1))
}
