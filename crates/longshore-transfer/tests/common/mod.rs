//! Shared by the CUDA test files: GPU 0, or a printed skip without a driver (a failure with
//! LONGSHORE_REQUIRE_CUDA=1).

use longshore_transfer::Device;

/// `cuda:0`, or `None` (printing why) when no driver or GPU can be used.
pub(crate) fn gpu() -> Option<Device> {
    longshore_testing::cuda_or_skip("CUDA test", Device::cuda(0))
}
