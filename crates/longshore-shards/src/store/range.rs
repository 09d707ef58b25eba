//! [`ShardStore::get_range`]: the bytes of a range of one object, retried whole on a cut or
//! stalled body.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use super::retry::Interrupted;
use super::{ShardStore, block_on};
use crate::ShardError;
use crate::url::ShardUrl;

impl ShardStore {
    /// The bytes `range` of one object (a range `GET`, retried whole on a cut body or one that
    /// delivers no byte for the [`RetryPolicy::stall_timeout`](super::RetryPolicy::stall_timeout)),
    /// within the store's [`Timeouts`](super::Timeouts).
    ///
    /// # Errors
    ///
    /// URL errors and [`ShardError::Fetch`] (a range past the end included).
    pub async fn get_range_async(&self, url: &str, range: Range<u64>) -> Result<Bytes, ShardError> {
        let u = ShardUrl::parse(url)?;
        let (client, path) = self.located(&u)?;
        let want = range.end.saturating_sub(range.start);
        if want == 0 {
            return Ok(Bytes::new());
        }
        let stall = self.retry_policy().stall_timeout;
        let store = &client.store;
        self.retrying("get", &u, client.endpoint.as_deref(), || {
            let (store, path, range) = (Arc::clone(store), path.clone(), range.clone());
            async move {
                let bytes = read_range(&*store, &path, range, stall).await?;
                if bytes.len() as u64 != want {
                    return Err(Interrupted::error(format!(
                        "range read returned {} of {want} bytes",
                        bytes.len()
                    )));
                }
                Ok(bytes)
            }
        })
        .await
    }

    /// [`get_range_async`](Self::get_range_async), blocking.
    ///
    /// # Errors
    ///
    /// As [`get_range_async`](Self::get_range_async), and [`block_on`]'s.
    pub fn get_range(&self, url: &str, range: Range<u64>) -> Result<Bytes, ShardError> {
        block_on(self.get_range_async(url, range))?
    }
}

/// One range `GET`'s body, failing when no byte comes for `stall`.
async fn read_range(
    store: &dyn ObjectStore,
    path: &ObjectPath,
    range: Range<u64>,
    stall: Duration,
) -> Result<Bytes, object_store::Error> {
    let options = object_store::GetOptions {
        range: Some(range.into()),
        ..Default::default()
    };
    let mut body = store.get_opts(path, options).await?.into_stream();
    let mut chunks: Vec<Bytes> = Vec::new();
    loop {
        match tokio::time::timeout(stall, body.next()).await {
            Err(_) => {
                let got: usize = chunks.iter().map(Bytes::len).sum();
                return Err(Interrupted::error(format!(
                    "the body stalled: no byte for {stall:?} after {got} bytes of a range read"
                )));
            }
            Ok(Some(chunk)) => chunks.push(chunk?),
            Ok(None) => break,
        }
    }
    Ok(match chunks.len() {
        1 => chunks.pop().unwrap_or_default(),
        _ => chunks.concat().into(),
    })
}
