//! [`upload_new`]: a host value into a new device buffer, the shape every upload stage uses.

use longshore_host::HostMemory;

use crate::buffer::DeviceBuffer;
use crate::error::Result;
use crate::stream::Stream;

/// Allocates a device buffer of `src`'s length on `stream` and uploads `src` into it; `src` is
/// released (back to its pool, for a lease) once the copy has completed. The loader's
/// `Upload` stage uploads each batch this way; a stage of your own can too.
///
/// ```
/// use longshore_host::{HostBuffer, MemoryKind};
/// use longshore_transfer::{Device, upload_new};
///
/// let stream = Device::cpu().new_stream()?;
/// let host = HostBuffer::from_slice(MemoryKind::Pageable, &[1u8; 80])?;
/// let on_device = upload_new(&stream, host)?;
/// assert_eq!(stream.read_to_vec::<u8>(&on_device)?, vec![1u8; 80]);
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
pub fn upload_new<S: HostMemory>(stream: &Stream, src: S) -> Result<DeviceBuffer> {
    let mut dst = stream.alloc(src.as_bytes().len())?;
    stream.upload(src, &mut dst)?.release();
    Ok(dst)
}
