//! [`Event`]: a point in a stream that the host can query, wait on, await, or make another
//! stream wait on.
//!
//! # How futures are woken
//!
//! * `Cpu` events wake their waiters directly: the job that completes the event runs the
//!   registered callbacks on the stream's worker thread. No polling, no extra thread.
//! * CUDA events are watched by one process-wide thread (`longshore-cuda-events`) that queries
//!   the events being awaited with `cuEventQuery`, backing off from 5 us to 100 us between
//!   rounds while none completes. It blocks on a channel, costing nothing, whenever nothing is
//!   awaited, and an event is registered with it only when a future finds it incomplete.
//!
//!   We chose this over `cuLaunchHostFunc` (a host callback enqueued behind each copy) because
//!   a host function sits *in* the stream: the stream stalls until the driver's single callback
//!   thread has run it, every copy would pay that whether or not anyone awaits it, and the
//!   callback must be decided when the copy is enqueued. The watcher costs one query (about a
//!   microsecond) per awaited event per round and adds at most ~100 us of wake-up latency to
//!   an `.await`; `wait()` (`cuEventSynchronize`) is unaffected. [`Stream::launch_host_fn`]
//!   still exposes `cuLaunchHostFunc` for work that must run in stream order.
//!
//! [`Stream::launch_host_fn`]: crate::Stream::launch_host_fn

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use longshore_host::{Fence, SharedFence};

use crate::backend::EventImpl;
use crate::error::Result;
use crate::id::DeviceId;

/// A point in a [`Stream`](crate::Stream): complete once all the work enqueued on the stream
/// before it has run.
///
/// Query it ([`is_complete`](Event::is_complete)), wait for it on the host
/// ([`synchronize`](Event::synchronize)), `.await` it (a `std` future, no runtime required),
/// or make another stream wait for it without blocking the host
/// ([`Stream::wait_event`](crate::Stream::wait_event)). Cheap to clone.
///
/// `Event` implements [`longshore_host::Fence`]: that is how host buffers and pool leases are
/// kept from being freed or reused while a copy from them is in flight.
#[derive(Clone)]
pub struct Event {
    pub(crate) inner: EventImpl,
    device: DeviceId,
    stream: u64,
}

impl Event {
    pub(crate) fn new(inner: EventImpl, device: DeviceId, stream: u64) -> Self {
        Self {
            inner,
            device,
            stream,
        }
    }

    /// An event on the `Cpu` device that is already complete.
    pub fn completed() -> Self {
        Self::new(EventImpl::completed(), DeviceId::Cpu, 0)
    }

    /// The device of the stream the event was recorded on.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The id of the stream the event was recorded on.
    pub fn stream_id(&self) -> u64 {
        self.stream
    }

    /// Whether the work before the event has finished (non-blocking).
    pub fn is_complete(&self) -> bool {
        self.inner.is_complete()
    }

    /// Blocks the calling thread until the event completes.
    ///
    /// On CUDA this is `cuEventSynchronize`, which reports errors of the work before it.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Blocks until the event completes or `timeout` passes; returns whether it completed.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.inner.wait_timeout(timeout)
    }

    /// Runs `f` once the event completes: at once on this thread if it already has, otherwise
    /// on the stream's worker thread (`Cpu`) or the event watcher thread (CUDA). `f` must be
    /// short and must not block; move heavy work elsewhere.
    pub fn on_complete(&self, f: impl FnOnce() + Send + 'static) {
        self.inner.on_complete(Box::new(f))
    }

    /// The event as a shared [`Fence`], for [`longshore_host::HostMemory::record_fence`].
    pub fn to_fence(&self) -> SharedFence {
        Arc::new(self.clone())
    }

    /// A future that resolves when the event completes (same as `event.clone().await`).
    pub fn completion(&self) -> EventFuture {
        EventFuture {
            event: self.clone(),
            slot: None,
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.device)
            .field("stream", &self.stream)
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl Fence for Event {
    fn is_complete(&self) -> bool {
        Event::is_complete(self)
    }

    /// Woken on completion (the Cpu backend's stream thread, CUDA's event watcher), not by
    /// polling: what the pinned pool's reaper waits on before it hands a block to a waiter.
    fn wait_timeout(&self, timeout: Duration) -> bool {
        Event::wait_timeout(self, timeout)
    }

    fn wait(&self) {
        if let Err(e) = self.synchronize() {
            tracing::error!(target: "longshore::transfer", error = %e, "waiting on an event failed; the device is broken");
        }
    }
}

/// Where a future parks its waker until an event completes.
#[derive(Debug, Default)]
pub(crate) struct WakerSlot {
    waker: Mutex<Option<Waker>>,
}

impl WakerSlot {
    fn fire(&self) {
        let w = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// Polls `event`, registering `cx`'s waker with it once (later polls only refresh the waker).
pub(crate) fn poll_event(
    event: &Event,
    slot: &mut Option<Arc<WakerSlot>>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    if event.is_complete() {
        return Poll::Ready(());
    }
    match slot {
        None => {
            let s = Arc::new(WakerSlot {
                waker: Mutex::new(Some(cx.waker().clone())),
            });
            *slot = Some(s.clone());
            event.on_complete(move || s.fire());
        }
        Some(s) => {
            let mut w = s.waker.lock().unwrap_or_else(|p| p.into_inner());
            match &*w {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
    }
    if event.is_complete() {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

/// The future of an [`Event`]; resolves to the result of the work before it.
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct EventFuture {
    event: Event,
    slot: Option<Arc<WakerSlot>>,
}

impl Future for EventFuture {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match poll_event(&this.event, &mut this.slot, cx) {
            // Complete: synchronize returns at once and reports any sticky device error.
            Poll::Ready(()) => Poll::Ready(this.event.synchronize()),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl IntoFuture for Event {
    type Output = Result<()>;
    type IntoFuture = EventFuture;

    fn into_future(self) -> EventFuture {
        EventFuture {
            event: self,
            slot: None,
        }
    }
}

impl IntoFuture for &Event {
    type Output = Result<()>;
    type IntoFuture = EventFuture;

    fn into_future(self) -> EventFuture {
        self.completion()
    }
}
