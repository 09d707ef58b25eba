//! The raw baselines of the copy benchmarks: one bare driver copy plus a stream
//! synchronisation on the same buffers, with none of longshore's machinery (no events, no
//! tracking, no staging).
//!
//! Built on longshore-transfer's public seams, as any crate above it could be: the native
//! stream ([`Stream::as_raw`]) and device pointer ([`DeviceBuffer::cuda_device_ptr`]) on CUDA,
//! the bytes of a Cpu-device buffer ([`DeviceBuffer::cpu_memory`]) on the Cpu device. The copy
//! bypasses the buffer's cross-stream tracking, so only call these on a buffer no work of
//! longshore's is using (the benchmarks use a buffer allocated on `stream`, only by this
//! thread).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, bail, ensure};
use cudarc::driver::{CudaContext, result, sys};
use longshore::transfer::{DeviceBuffer, DeviceId, Stream};

/// `cuMemcpyHtoDAsync(dst, src)` + `cuStreamSynchronize` on `stream`. On the Cpu device: wait
/// for the stream's work, then one `memcpy` into the buffer's bytes.
///
/// # Errors
/// `dst` is on another device than `stream`, `src` is longer than `dst`, or the driver failed.
pub fn bare_htod(stream: &Stream, src: &[u8], dst: &mut DeviceBuffer) -> Result<()> {
    check(stream, dst, src.len())?;
    match stream.device().id() {
        DeviceId::Cpu => {
            stream.synchronize()?;
            let mem = dst.cpu_memory().context("a Cpu-device buffer")?;
            mem.lock()[..src.len()].copy_from_slice(src);
            Ok(())
        }
        DeviceId::Cuda(ordinal) => {
            let (raw, ptr) = cuda_handles(stream, dst, ordinal)?;
            // SAFETY: `ptr` is the start of a live allocation of at least `src.len()` bytes
            // (checked above) in the primary context made current by `cuda_handles`, `raw` is
            // the live `CUstream` of `stream` (borrowed for the whole call), and the stream is
            // synchronised below before `src`'s borrow ends.
            unsafe { result::memcpy_htod_async(ptr, src, raw) }
                .with_context(|| format!("cuMemcpyHtoDAsync of {} bytes", src.len()))?;
            // SAFETY: `raw` is live (above).
            unsafe { result::stream::synchronize(raw) }.context("cuStreamSynchronize")
        }
    }
}

/// `cuMemcpyDtoHAsync(dst, src)` + `cuStreamSynchronize` on `stream`. On the Cpu device: wait
/// for the stream's work, then one `memcpy` out of the buffer's bytes.
///
/// # Errors
/// `src` is on another device than `stream`, `dst` is longer than `src`, or the driver failed.
pub fn bare_dtoh(stream: &Stream, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
    check(stream, src, dst.len())?;
    match stream.device().id() {
        DeviceId::Cpu => {
            stream.synchronize()?;
            let mem = src.cpu_memory().context("a Cpu-device buffer")?;
            dst.copy_from_slice(&mem.lock()[..dst.len()]);
            Ok(())
        }
        DeviceId::Cuda(ordinal) => {
            let (raw, ptr) = cuda_handles(stream, src, ordinal)?;
            let len = dst.len();
            // SAFETY: `ptr` is the start of a live allocation of at least `dst.len()` bytes
            // (checked above) in the primary context made current by `cuda_handles`, `raw` is
            // the live `CUstream` of `stream`, and the stream is synchronised below before
            // `dst`'s borrow ends.
            unsafe { result::memcpy_dtoh_async(dst, ptr, raw) }
                .with_context(|| format!("cuMemcpyDtoHAsync of {len} bytes"))?;
            // SAFETY: `raw` is live (above).
            unsafe { result::stream::synchronize(raw) }.context("cuStreamSynchronize")
        }
    }
}

/// The buffer is on the stream's device and holds at least `bytes`.
fn check(stream: &Stream, buf: &DeviceBuffer, bytes: usize) -> Result<()> {
    let (on, at) = (stream.device().id(), buf.device().id());
    ensure!(
        on == at,
        "bare copy: the buffer is on {at}, the stream on {on}"
    );
    if bytes > buf.len() {
        bail!(
            "bare copy: {bytes} bytes do not fit a buffer of {}",
            buf.len()
        );
    }
    Ok(())
}

/// Makes GPU `ordinal`'s primary context (the one longshore-transfer uses) current on this
/// thread, and returns the stream's `CUstream` and the buffer's device pointer.
fn cuda_handles(
    stream: &Stream,
    buf: &DeviceBuffer,
    ordinal: usize,
) -> Result<(sys::CUstream, sys::CUdeviceptr)> {
    primary_context(ordinal)?
        .bind_to_thread()
        .context("cuCtxSetCurrent")?;
    let raw = stream.as_raw()? as sys::CUstream;
    let ptr = buf.cuda_device_ptr().context("a CUDA buffer")?;
    Ok((raw, ptr))
}

/// GPU `ordinal`'s primary context, retained once per process (not per copy, so the baseline
/// pays only the copy and the synchronisation).
fn primary_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut contexts = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(ctx) = contexts.get(&ordinal) {
        return Ok(ctx.clone());
    }
    let ctx = CudaContext::new(ordinal)
        .with_context(|| format!("retaining the primary context of cuda:{ordinal}"))?;
    contexts.insert(ordinal, ctx.clone());
    Ok(ctx)
}

#[cfg(test)]
mod tests {
    use longshore::transfer::Device;

    use super::*;

    /// A round trip through the bare copies on `dev`: what goes in comes out, and a copy
    /// longer than the buffer is refused before anything runs.
    fn round_trip(dev: &Device) {
        let stream = dev.new_stream().unwrap();
        let mut buf = stream.alloc_zeroed(64).unwrap();
        let src: Vec<u8> = (0..48).collect();
        bare_htod(&stream, &src, &mut buf).unwrap();
        let mut back = vec![0u8; 48];
        bare_dtoh(&stream, &buf, &mut back).unwrap();
        assert_eq!(back, src);
        // The rest of the buffer is untouched, as longshore's own copy reads it.
        let all = stream.read_to_vec::<u8>(&buf).unwrap();
        assert_eq!(&all[..48], &src[..]);
        assert!(all[48..].iter().all(|&b| b == 0));
        let err = bare_htod(&stream, &[0u8; 65], &mut buf).unwrap_err();
        assert!(err.to_string().contains("65 bytes"), "{err}");
        let err = bare_dtoh(&stream, &buf, &mut [0u8; 65]).unwrap_err();
        assert!(err.to_string().contains("65 bytes"), "{err}");
    }

    #[test]
    fn bare_copies_round_trip_on_the_cpu_device() {
        round_trip(&Device::cpu());
    }

    /// On a GPU, and a GPU buffer is refused on a Cpu-device stream. Skips without a GPU,
    /// unless `LONGSHORE_REQUIRE_CUDA=1`.
    #[test]
    fn bare_copies_round_trip_on_cuda() {
        let test = "bare_copies_round_trip_on_cuda";
        if let Some(dev) = longshore_testing::cuda_or_skip(test, Device::cuda(0)) {
            round_trip(&dev);
            let mut buf = dev.new_stream().unwrap().alloc_zeroed(8).unwrap();
            let cpu = Device::cpu().new_stream().unwrap();
            let err = bare_htod(&cpu, &[1u8; 8], &mut buf).unwrap_err();
            assert!(err.to_string().contains("cuda:0"), "{err}");
        }
    }
}
