//! Raw baselines for the benchmarks: one bare driver copy plus a stream synchronisation on the
//! same buffers, with none of this crate's machinery (no events, no tracking, no staging).

use crate::buffer::DeviceBuffer;
use crate::error::{Result, TransferError};
use crate::stream::Stream;

fn check(stream: &Stream, buf: &DeviceBuffer, bytes: usize) -> Result<()> {
    if stream.device().id() != buf.device().id() {
        return Err(TransferError::DeviceMismatch {
            op: "bare copy",
            what: "the buffer",
            expected: stream.device().id(),
            found: buf.device().id(),
        });
    }
    if bytes > buf.len() {
        return Err(TransferError::OutOfBounds {
            op: "bare copy",
            bytes,
            offset: 0,
            capacity: buf.len(),
        });
    }
    Ok(())
}

/// `cuMemcpyHtoDAsync(dst, src)` + `cuStreamSynchronize`. On `Cpu`: drain the stream, then one
/// `memcpy` into the backend's memory.
pub fn bare_htod(stream: &Stream, src: &[u8], dst: &mut DeviceBuffer) -> Result<()> {
    check(stream, dst, src.len())?;
    stream.backend().bare_htod(&dst.mem, src)
}

/// `cuMemcpyDtoHAsync(dst, src)` + `cuStreamSynchronize`. On `Cpu`: drain the stream, then one
/// `memcpy` out of the backend's memory.
pub fn bare_dtoh(stream: &Stream, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
    check(stream, src, dst.len())?;
    stream.backend().bare_dtoh(&src.mem, dst)
}
