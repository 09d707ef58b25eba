//! Shared by the CUDA test files: GPU 0, or a printed skip without a driver (a failure with
//! LONGSHORE_REQUIRE_CUDA=1).

use longshore_transfer::Device;

/// `cuda:0`, or `None` (printing why) when no driver or GPU can be used.
pub(crate) fn gpu() -> Option<Device> {
    let require = std::env::var("LONGSHORE_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) if require => panic!("LONGSHORE_REQUIRE_CUDA=1 but cuda:0 cannot be used: {e}"),
        Err(e) => {
            eprintln!("skipping CUDA test: {e}");
            None
        }
    }
}
