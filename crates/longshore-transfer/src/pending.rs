//! [`Pending<T>`]: a value held back until a copy's event completes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::error::Result;
use crate::event::{Event, WakerSlot, poll_event};

/// A value that an in-flight copy is still reading or writing, reachable only once the copy's
/// [`Event`] has completed: through [`wait`](Pending::wait), `.await`, or
/// [`try_take`](Pending::try_take).
///
/// A device -> host copy returns `Pending<D>` holding the destination; a host -> device copy
/// returns `Pending<S>` holding the source, so the source cannot be written while the copy
/// reads it. Dropping a `Pending` is fine: the value is dropped once the copy has completed
/// (on a background thread, so the drop never blocks), and a pool lease then goes back to its
/// pool.
///
/// Reading the result of a device -> host copy before it completes does not compile: the host
/// buffer was moved into the copy, and `Pending` gives no access to it.
///
/// ```compile_fail,E0382
/// use longshore_host::HostBuffer;
/// use longshore_transfer::Device;
///
/// let stream = Device::cpu().new_stream()?;
/// let on_device = stream.to_device(&[1u32, 2, 3, 4])?;
/// let out = HostBuffer::pageable(16)?;
/// let pending = stream.download(&on_device, out)?;
/// let racy = out.as_slice::<u32>()?[0]; // error[E0382]: use of moved value `out`
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
///
/// ```compile_fail,E0599
/// # use longshore_host::HostBuffer;
/// # use longshore_transfer::Device;
/// # let stream = Device::cpu().new_stream()?;
/// # let on_device = stream.to_device(&[1u32, 2, 3, 4])?;
/// let pending = stream.download(&on_device, HostBuffer::pageable(16)?)?;
/// let racy = pending.as_slice::<u32>(); // error[E0599]: no method `as_slice` on `Pending<_>`
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
///
/// The way that compiles waits first:
///
/// ```
/// # use longshore_host::HostBuffer;
/// # use longshore_transfer::Device;
/// # let stream = Device::cpu().new_stream()?;
/// # let on_device = stream.to_device(&[1u32, 2, 3, 4])?;
/// let pending = stream.download(&on_device, HostBuffer::pageable(16)?)?;
/// let out = pending.wait()?;
/// assert_eq!(out.as_slice::<u32>()?, &[1, 2, 3, 4]);
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
#[must_use = "dropping a Pending discards the copied data (the copy still completes)"]
pub struct Pending<T: Send + 'static> {
    // Boxed so that the bytes an in-flight copy uses never move, whatever `T` is.
    value: Option<Box<T>>,
    event: Event,
    slot: Option<Arc<WakerSlot>>,
}

impl<T: Send + 'static> Pending<T> {
    /// Holds `value` back until `event` completes.
    ///
    /// Safe code can build one, but only the copies of this crate make it meaningful.
    pub fn new(value: Box<T>, event: Event) -> Self {
        Self {
            value: Some(value),
            event,
            slot: None,
        }
    }

    /// The event the value waits for.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Whether the copy has completed (so [`wait`](Pending::wait) would not block).
    pub fn is_ready(&self) -> bool {
        self.event.is_complete()
    }

    /// Blocks until the copy completes, then hands the value over.
    pub fn wait(mut self) -> Result<T> {
        self.event.synchronize()?;
        Ok(*self.take())
    }

    /// The value if the copy has completed, otherwise `self` back.
    pub fn try_take(mut self) -> std::result::Result<T, Self> {
        if self.event.is_complete() {
            Ok(*self.take())
        } else {
            Err(self)
        }
    }

    fn take(&mut self) -> Box<T> {
        match self.value.take() {
            Some(v) => v,
            // `value` is only taken by the consuming methods and by a completed poll.
            None => unreachable!("Pending polled after completion"),
        }
    }
}

impl<S: longshore_host::HostMemory> Pending<S> {
    /// Drops the held source of a host -> device copy: at once if its memory defers its own
    /// reuse until the copy's fence completes ([`HostMemory::drop_defers_reuse`]: a pool lease,
    /// which waits in its pool's pending list), so no background thread has to watch the
    /// event; otherwise as dropping the `Pending` does.
    ///
    /// [`HostMemory::drop_defers_reuse`]: longshore_host::HostMemory::drop_defers_reuse
    pub fn release(mut self) {
        if self.value.as_ref().is_some_and(|v| v.drop_defers_reuse()) {
            drop(self.value.take());
        }
    }
}

impl<T: Send + 'static> Future for Pending<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match poll_event(&this.event, &mut this.slot, cx) {
            Poll::Ready(()) => Poll::Ready(this.event.synchronize().map(|()| *this.take())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for Pending<T> {
    fn drop(&mut self) {
        if let Some(v) = self.value.take() {
            if self.event.is_complete() {
                drop(v);
            } else {
                self.event
                    .on_complete(move || crate::backend::reaper::drop_later(v));
            }
        }
    }
}

impl<T: Send + 'static> fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("type", &std::any::type_name::<T>())
            .field("event", &self.event)
            .finish_non_exhaustive()
    }
}
