//! [`ShardStore::download`]: a whole object streamed into a local file, resuming a cut or
//! stalled body from the byte already written.

use std::io::Write;

use futures_util::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStore};

use super::retry::Interrupted;
use super::{ShardInfo, ShardStore, TARGET, block_on, fetch_error};
use crate::ShardError;
use crate::url::ShardUrl;

/// What a [`ShardStore::download`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DownloadReport {
    /// Bytes written (the object's size).
    pub bytes: u64,
    /// Requests made.
    pub attempts: u32,
    /// How many of them resumed a cut body with a range request.
    pub resumes: u32,
    /// The object's entity tag, as the first response that had one gave it.
    pub etag: Option<String>,
}

impl ShardStore {
    /// Downloads a whole shard into the file at `dest` (created or truncated), streaming.
    ///
    /// A body that is cut or stalls is resumed with a range request from the byte already
    /// written, on the condition that the object's entity tag is still the one the first
    /// response gave; no byte is written twice or skipped. The file is synced before this
    /// returns. Writing to a temporary name and renaming is the caller's part. The
    /// [`Timeouts`](super::Timeouts)' retry budget counts from the last new byte, so a slow
    /// download that keeps going is not cut.
    ///
    /// # Errors
    ///
    /// [`ShardError::Fetch`] when an error is permanent, `max_attempts` requests in a row
    /// brought no new byte, or the retry budget passed without one;
    /// [`ShardError::SizeMismatch`] when the object's size is not
    /// `shard.size`; [`ShardError::Io`] for the local file.
    pub async fn download_async(
        &self,
        shard: &ShardInfo,
        dest: &std::path::Path,
    ) -> Result<DownloadReport, ShardError> {
        let url = ShardUrl::parse(&shard.url)?;
        let (client, path) = self.located(&url)?;
        let (store, endpoint) = (&client.store, client.endpoint.as_deref());
        let io = |op, source| ShardError::Io {
            op,
            path: dest.to_owned(),
            source,
        };
        let mut file = std::fs::File::create(dest).map_err(|e| io("create", e))?;
        let stall = self.retry_policy().stall_timeout;
        let mut retries = self.retries();
        let mismatch = |actual| ShardError::SizeMismatch {
            url: shard.url.clone(),
            expected: shard.size,
            actual,
        };
        let mut report = DownloadReport {
            bytes: 0,
            attempts: 0,
            resumes: 0,
            etag: None,
        };
        let mut idle = 0; // attempts in a row without a new byte
        loop {
            report.attempts += 1;
            let before = report.bytes;
            let mut options = GetOptions::default();
            if report.bytes > 0 {
                report.resumes += 1;
                options.range = Some(GetRange::Offset(report.bytes));
                options.if_match = report.etag.clone();
            }
            let failure: object_store::Error = match store.get_opts(&path, options).await {
                Err(e) => e,
                Ok(res) => {
                    if res.meta.size != shard.size {
                        return Err(mismatch(res.meta.size));
                    }
                    if res.range.start != report.bytes {
                        return Err(fetch_error(
                            "download",
                            &url,
                            endpoint,
                            report.attempts,
                            retries.elapsed(),
                            format!(
                                "asked for bytes from {}, got from {}",
                                report.bytes, res.range.start
                            ),
                        ));
                    }
                    if report.etag.is_none() {
                        report.etag = res.meta.e_tag.clone();
                    }
                    let mut body = res.into_stream();
                    loop {
                        match tokio::time::timeout(stall, body.next()).await {
                            Err(_) => {
                                break Interrupted::error(format!(
                                    "the body stalled: no byte for {stall:?} at byte {}",
                                    report.bytes
                                ));
                            }
                            Ok(Some(Ok(chunk))) => {
                                let end = report.bytes + chunk.len() as u64;
                                if end > shard.size {
                                    return Err(mismatch(end));
                                }
                                file.write_all(&chunk).map_err(|e| io("write", e))?;
                                report.bytes = end;
                            }
                            Ok(Some(Err(e))) => break e,
                            Ok(None) if report.bytes == shard.size => {
                                file.sync_all().map_err(|e| io("sync", e))?;
                                tracing::debug!(
                                    target: TARGET,
                                    url = %url,
                                    bytes = report.bytes,
                                    attempts = report.attempts,
                                    "downloaded"
                                );
                                return Ok(report);
                            }
                            Ok(None) => {
                                break Interrupted::error(format!(
                                    "the body ended at byte {} of {}",
                                    report.bytes, shard.size
                                ));
                            }
                        }
                    }
                }
            };
            let progressed = report.bytes > before;
            if progressed {
                idle = 1;
                retries.progressed();
            } else {
                idle += 1;
            }
            let Some(wait) = retries.wait(idle, &failure) else {
                let elapsed = retries.elapsed();
                return Err(fetch_error(
                    "download",
                    &url,
                    endpoint,
                    report.attempts,
                    elapsed,
                    failure,
                ));
            };
            tracing::debug!(
                target: TARGET,
                url = %url,
                at = report.bytes,
                attempt = report.attempts,
                error = %failure,
                "download interrupted; resuming"
            );
            if !progressed {
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// [`download_async`](Self::download_async), blocking.
    ///
    /// # Errors
    ///
    /// As [`download_async`](Self::download_async), and [`block_on`]'s.
    pub fn download(
        &self,
        shard: &ShardInfo,
        dest: &std::path::Path,
    ) -> Result<DownloadReport, ShardError> {
        block_on(self.download_async(shard, dest))?
    }
}
