//! longshore: a data loader that keeps GPUs fed.
//!
//! The facade re-exports each layer as a short module.

#[doc(inline)]
pub use longshore_data as data;
#[doc(inline)]
pub use longshore_host as host;
#[doc(inline)]
pub use longshore_loader as loader;
#[doc(inline)]
pub use longshore_transfer as transfer;
