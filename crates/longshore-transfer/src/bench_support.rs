//! Raw baselines for the benchmarks: one bare driver copy plus a stream synchronisation on the
//! same buffers, with none of this crate's machinery (no events, no tracking, no staging).

use crate::buffer::{DeviceBuffer, DeviceMem};
use crate::error::{Result, TransferError};
use crate::stream::{Stream, StreamBackend};

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
    match (stream.backend(), &dst.mem) {
        (StreamBackend::Cpu(_), DeviceMem::Cpu(m)) => {
            stream.synchronize()?;
            m.lock()[..src.len()].copy_from_slice(src);
            Ok(())
        }
        #[cfg(feature = "cuda")]
        (StreamBackend::Cuda { dev, stream: s }, DeviceMem::Cuda(m)) => {
            dev.bind()?;
            // SAFETY: the range fits `m` (checked), and we synchronise before `src`'s borrow ends.
            unsafe { crate::backend::cuda::htod(s, m.ptr, src.as_ptr(), src.len()) }.map_err(
                |e| {
                    crate::backend::cuda::err(
                        "cuMemcpyHtoDAsync",
                        e,
                        dev.ordinal,
                        format!("bare copy of {} bytes", src.len()),
                    )
                },
            )?;
            s.synchronize().map_err(|e| {
                crate::backend::cuda::err("cuStreamSynchronize", e, dev.ordinal, "bare copy")
            })
        }
        #[cfg(feature = "cuda")]
        _ => Err(TransferError::Invalid(
            "stream and buffer backends differ".to_owned(),
        )),
    }
}

/// `cuMemcpyDtoHAsync(dst, src)` + `cuStreamSynchronize`. On `Cpu`: drain the stream, then one
/// `memcpy` out of the backend's memory.
pub fn bare_dtoh(stream: &Stream, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
    check(stream, src, dst.len())?;
    match (stream.backend(), &src.mem) {
        (StreamBackend::Cpu(_), DeviceMem::Cpu(m)) => {
            stream.synchronize()?;
            dst.copy_from_slice(&m.lock()[..dst.len()]);
            Ok(())
        }
        #[cfg(feature = "cuda")]
        (StreamBackend::Cuda { dev, stream: s }, DeviceMem::Cuda(m)) => {
            dev.bind()?;
            // SAFETY: the range fits `m` (checked), and we synchronise before `dst`'s borrow ends.
            unsafe { crate::backend::cuda::dtoh(s, dst.as_mut_ptr(), m.ptr, dst.len()) }.map_err(
                |e| {
                    crate::backend::cuda::err(
                        "cuMemcpyDtoHAsync",
                        e,
                        dev.ordinal,
                        format!("bare copy of {} bytes", dst.len()),
                    )
                },
            )?;
            s.synchronize().map_err(|e| {
                crate::backend::cuda::err("cuStreamSynchronize", e, dev.ordinal, "bare copy")
            })
        }
        #[cfg(feature = "cuda")]
        _ => Err(TransferError::Invalid(
            "stream and buffer backends differ".to_owned(),
        )),
    }
}
