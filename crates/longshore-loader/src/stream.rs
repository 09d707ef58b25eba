//! [`LoaderStream`]: one epoch as an async [`Stream`](futures_core::Stream) for tokio (or any
//! executor).
//!
//! Workers are threads, so the stream needs no runtime of its own: a small bridge thread pulls
//! batches from the epoch's iterator and hands them over a bounded channel whose receiving end
//! is polled by the executor. No runtime thread ever blocks. Dropping the stream closes the
//! channel; the bridge then drops the iterator, which stops the workers and returns every
//! lease to the pool.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::loader::DataLoader;

/// One epoch of a [`DataLoader`] as an async stream; see [`DataLoader::stream`].
#[derive(Debug)]
pub struct LoaderStream<O> {
    rx: tokio::sync::mpsc::Receiver<Result<O, LoaderError>>,
}

impl<O> futures_core::Stream for LoaderStream<O> {
    type Item = Result<O, LoaderError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl<F: Fetch> DataLoader<F> {
    /// Iterates one epoch as an async stream (`while let Some(batch) = stream.next().await`).
    ///
    /// ```
    /// # use longshore_data::VecDataset;
    /// # use longshore_loader::DataLoader;
    /// use futures_util::StreamExt;
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let data: Vec<([u8; 4],)> = (0..10u8).map(|i| ([i; 4],)).collect();
    /// let loader = DataLoader::builder(VecDataset::new(data)).batch_size(3).num_workers(2).build()?;
    /// let mut stream = loader.stream()?;
    /// let mut n = 0;
    /// while let Some(batch) = stream.next().await {
    ///     n += batch?.batch_size();
    /// }
    /// assert_eq!(n, 10);
    /// # Ok::<(), longshore_loader::LoaderError>(())
    /// # }).unwrap();
    /// ```
    pub fn stream(&self) -> Result<LoaderStream<F::Output>, LoaderError> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let iter = self.iter();
        std::thread::Builder::new()
            .name("longshore-stream".into())
            .spawn(move || {
                for item in iter {
                    if tx.blocking_send(item).is_err() {
                        break; // the stream was dropped
                    }
                }
            })
            .map_err(|source| LoaderError::Spawn {
                worker: usize::MAX,
                source,
            })?;
        Ok(LoaderStream { rx })
    }
}
