//! `longshore-testing` is the test support shared by longshore's crates: the gate of every
//! test that needs a GPU.
//!
//! Tests that need CUDA do not use `#[ignore]`: they probe for what they need, skip with the
//! reason printed when it is missing, and fail instead when `LONGSHORE_REQUIRE_CUDA=1` (as on
//! the GPU machines, where a skip would hide a broken driver setup).
//!
//! ```
//! use longshore_testing::cuda_or_skip;
//!
//! // A test's probe: the device, or why it cannot be used.
//! let probe: Result<u32, String> = Err("no CUDA driver".into());
//! if std::env::var("LONGSHORE_REQUIRE_CUDA").as_deref() != Ok("1") {
//!     // Prints "skipping my_test: no CUDA driver".
//!     assert_eq!(cuda_or_skip("my_test", probe), None);
//! }
//! ```
//!
//! Unlike longshore's libraries, this crate prints: a skipped test says why on stderr.
#![forbid(unsafe_code)]

use std::fmt::Display;

/// The variable that turns a skip into a failure.
pub const REQUIRE_CUDA: &str = "LONGSHORE_REQUIRE_CUDA";

/// Whether CUDA is required: `LONGSHORE_REQUIRE_CUDA=1`.
pub fn cuda_required() -> bool {
    std::env::var(REQUIRE_CUDA).as_deref() == Ok("1")
}

/// The CUDA test gate: `probe`'s value, or `None` after printing `skipping {test}: {reason}`
/// when it failed.
///
/// # Panics
///
/// When `probe` failed and CUDA is [required](cuda_required), with
/// `{test}: LONGSHORE_REQUIRE_CUDA=1 but CUDA is unavailable: {reason}`.
#[track_caller]
pub fn cuda_or_skip<T, E: Display>(test: &str, probe: Result<T, E>) -> Option<T> {
    match probe {
        Ok(v) => Some(v),
        Err(reason) if cuda_required() => {
            panic!("{test}: {REQUIRE_CUDA}=1 but CUDA is unavailable: {reason}")
        }
        Err(reason) => {
            eprintln!("skipping {test}: {reason}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_that_succeeds_passes_its_value() {
        assert_eq!(cuda_or_skip::<_, String>("t", Ok(3)), Some(3));
    }

    #[test]
    fn a_failed_probe_skips_or_fails_as_required() {
        let gate = std::panic::catch_unwind(|| cuda_or_skip::<(), _>("t", Err("no driver")));
        match gate {
            Ok(v) => {
                assert!(!cuda_required());
                assert_eq!(v, None);
            }
            Err(panic) => {
                assert!(cuda_required());
                let msg = panic.downcast_ref::<String>().unwrap();
                assert_eq!(
                    msg,
                    "t: LONGSHORE_REQUIRE_CUDA=1 but CUDA is unavailable: no driver"
                );
            }
        }
    }
}
