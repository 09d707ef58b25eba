//! Backends: one module per device kind, each with the same small set of concepts (stream,
//! event, memory), dispatched by enums in the public types.
//!
//! * [`cpu`]: always compiled. Streams are worker threads fed by channels, events are
//!   condition variables, device memory is host memory owned by the backend.
//! * `cuda` (feature `cuda`): cudarc streams and events, stream-ordered device allocations,
//!   raw `cuMemcpy*Async` copies and an event watcher thread for futures.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod reaper;
