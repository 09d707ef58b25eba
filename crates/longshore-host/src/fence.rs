//! Fences: points in a device's work queue that the host can query.
//!
//! The pool and buffers in this crate use fences to keep memory from being reused or freed
//! while a copy from it may still be running. The trait is small so that every backend can
//! implement it: `longshore-transfer` implements it for CUDA events and for the events of its
//! `Cpu` backend; [`CpuFence`] is a plain host-signalled fence for tests and host-side work.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A point in some ordered stream of work that completes once, and stays complete.
///
/// # Contract
///
/// Once [`is_complete`](Fence::is_complete) returns `true` it must keep returning `true`, and
/// no work ordered before the fence may still access memory. A fence whose device has failed
/// (a broken CUDA context) reports complete only if no device access can happen any more.
pub trait Fence: Send + Sync + fmt::Debug {
    /// Non-blocking query: has all the work before this fence finished?
    fn is_complete(&self) -> bool;

    /// Blocks the calling thread until the fence completes.
    fn wait(&self);

    /// Blocks until the fence completes or `timeout` passes; returns whether it completed.
    ///
    /// The default polls [`is_complete`](Fence::is_complete) with a short back-off.
    fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut nap = Duration::from_micros(10);
        loop {
            if self.is_complete() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }
}

/// A shared fence handle, as stored by leases and buffers.
pub type SharedFence = Arc<dyn Fence>;

/// A fence signalled by host code: complete once [`signal`](CpuFence::signal) is called.
#[derive(Debug, Default)]
pub struct CpuFence {
    done: Mutex<bool>,
    cv: Condvar,
}

impl CpuFence {
    /// A new, incomplete fence.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A fence that is already complete.
    pub fn completed() -> Arc<Self> {
        let f = Self::new();
        f.signal();
        f
    }

    /// Completes the fence and wakes every waiter.
    pub fn signal(&self) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *done = true;
        self.cv.notify_all();
    }
}

impl Fence for CpuFence {
    fn is_complete(&self) -> bool {
        *self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn wait_timeout(&self, timeout: Duration) -> bool {
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (done, _) = self
            .cv
            .wait_timeout_while(done, timeout, |d| !*d)
            .unwrap_or_else(|p| p.into_inner());
        *done
    }
}
