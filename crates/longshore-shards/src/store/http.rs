//! The HTTP layer under the store's cloud and HTTP clients: object_store's reqwest client
//! with a first-byte timeout on every request, and a 408, 429 or 5xx answer turned into a
//! [`ServerError`] that keeps its `Retry-After`, which object_store's own errors drop.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures_util::StreamExt;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};

use super::TARGET;

/// The most bytes of an error answer's body kept in its [`ServerError`].
const BODY_KEPT: usize = 512;

/// Builds object_store's reqwest client (with the [`ClientOptions`] the backend's builder
/// gives it) inside a [`Bounded`] service.
#[derive(Debug, Clone, Copy)]
pub(super) struct BoundedConnector {
    /// How long a request may wait for its response's first byte.
    pub(super) first_byte: Duration,
}

impl HttpConnector for BoundedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Bounded {
            inner,
            first_byte: self.first_byte,
        }))
    }
}

/// An [`HttpService`] that bounds the wait for a response and marks the answers worth
/// retrying.
#[derive(Debug)]
struct Bounded {
    inner: HttpClient,
    first_byte: Duration,
}

#[async_trait]
impl HttpService for Bounded {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = tokio::time::timeout(self.first_byte, self.inner.execute(request))
            .await
            .map_err(|_| {
                HttpError::new(
                    HttpErrorKind::Timeout,
                    NoResponse {
                        waited: self.first_byte,
                    },
                )
            })??;
        let status = response.status().as_u16();
        if !retryable_status(status) {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        // What the server said, as far as it says it quickly.
        let mut body = Vec::new();
        let mut stream = response.into_body().bytes_stream();
        let _ = tokio::time::timeout(self.first_byte, async {
            while let Some(Ok(chunk)) = stream.next().await {
                body.extend_from_slice(&chunk[..chunk.len().min(BODY_KEPT - body.len())]);
                if body.len() >= BODY_KEPT {
                    break;
                }
            }
        })
        .await;
        tracing::debug!(target: TARGET, status, retry_after = ?retry_after, "server asks to retry");
        // `Unknown`: object_store leaves it alone (were its own retries turned on); the
        // store's retry loop finds the `ServerError` and honours its `Retry-After`.
        Err(HttpError::new(
            HttpErrorKind::Unknown,
            ServerError {
                status,
                retry_after,
                body: String::from_utf8_lossy(&body).trim().to_owned(),
            },
        ))
    }
}

/// A request that got no response within the first-byte timeout.
#[derive(Debug, thiserror::Error)]
#[error("no response within {waited:?} (first-byte timeout)")]
struct NoResponse {
    waited: Duration,
}

/// An HTTP answer worth retrying (408, 429 or 5xx), with the wait the server asked for.
#[derive(Debug, thiserror::Error)]
#[error(
    "server answered {status}{}{}",
    retry_after.map(|d| format!(" (Retry-After {d:?})")).unwrap_or_default(),
    if body.is_empty() { String::new() } else { format!(": {body}") }
)]
pub(super) struct ServerError {
    /// The HTTP status.
    pub(super) status: u16,
    /// The wait its `Retry-After` header asked for.
    pub(super) retry_after: Option<Duration>,
    /// The start of the answer's body.
    pub(super) body: String,
}

/// A `Retry-After` value: a number of seconds, or an HTTP date (a wait of the time until
/// then, none if it is past).
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An HTTP date in its preferred form (RFC 9110's IMF-fixdate: `Sun, 06 Nov 1994 08:49:37
/// GMT`).
fn parse_http_date(value: &str) -> Option<SystemTime> {
    let mut parts = value.split_ascii_whitespace();
    let _weekday = parts.next()?.strip_suffix(',')?;
    let day: u32 = parts.next()?.parse().ok()?;
    let month = parts.next()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == month)? as u32
        + 1;
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':').map(|x| x.parse::<u64>().ok());
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    if parts.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    // Days since 1970-01-01 of a civil date (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days).ok()? * 86_400 + h * 3600 + m * 60 + s;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// Whether an HTTP status is worth another request: 408, 429 and 5xx.
pub(super) fn retryable_status(status: u16) -> bool {
    status == 408 || status == 429 || (500..600).contains(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_values() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_770);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        // 1994-11-06 08:49:37 UTC is 784111777 s after the epoch.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after(
                "Sun, 06 Nov 1994 08:49:37 GMT",
                now + Duration::from_secs(60)
            ),
            Some(Duration::ZERO),
            "a date past"
        );
        assert_eq!(
            parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(SystemTime::UNIX_EPOCH)
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2028 12:00:00 GMT"),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_835_438_400))
        );
        for bad in ["soon", "-3", "Sun, 06 Nov 1994 08:49:37 CET", "06 Nov 1994"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad}");
        }
    }
}
