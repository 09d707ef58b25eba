//! [`Timeouts`]: how long the store waits for a server, and the `timeout` option's values.

use std::time::Duration;

/// How long the store waits for a server, and for how long an operation goes on retrying.
///
/// With a [`RetryPolicy`](super::RetryPolicy)'s `stall_timeout` (a body that stops), these
/// bound every request of the HTTP-based stores (S3, GCS, Azure, HTTP): see the
/// [module docs](crate::store#timeouts) for the defaults and what a failing operation costs at
/// most. The `timeout` option of [`ShardStoreBuilder::option`](super::ShardStoreBuilder::option)
/// sets them all at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to the store (TCP and TLS). Default 5 s.
    pub connect: Duration,
    /// From sending a request to the first byte of its response (its status line): how long
    /// a server that accepted the connection may think. Default 30 s.
    pub first_byte: Duration,
    /// How long an operation goes on retrying: no retry starts later than this after its first
    /// request (for a download, after its last new byte), and a `Retry-After` longer than
    /// what is left of it ends the operation at once. Default 60 s.
    pub retry_timeout: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(30),
            retry_timeout: Duration::from_secs(60),
        }
    }
}

/// Keep-alive connections idle for longer than this are closed, before a server closes
/// them under a request (S3 drops idle connections after about 20 s).
pub(super) const POOL_IDLE: Duration = Duration::from_secs(15);

/// A duration as the `timeout` option is written: a number of seconds (`"10"`, `"2.5"`) or a
/// number with a unit: `ms`, `s`, `m` or `min`, `h` (`"500ms"`, `"10s"`, `"1m"`).
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" | "seconds" => 1.0,
        "ms" => 1e-3,
        "m" | "min" | "mins" | "minutes" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} (write seconds, or a number with ms, s, m or h)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (write \"10s\", \"500ms\" or \"10\")"))?;
    let secs = value * scale;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{text:?} is out of range (above 0, at most a day)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration as object_store's configuration values are written (humantime), rounded up to
/// whole milliseconds.
pub(super) fn config_value(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000).max(1);
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = |t, ms| assert_eq!(parse_duration(t), Ok(Duration::from_millis(ms)), "{t}");
        ok("10", 10_000);
        ok("2.5", 2_500);
        ok("10s", 10_000);
        ok(" 500ms ", 500);
        ok("1m", 60_000);
        ok("1 min", 60_000);
        ok("0.25h", 900_000);
        for bad in ["", "0", "-1", "10 parsecs", "s", "1e3", "2d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(config_value(Duration::from_micros(1500)), "2ms");
        assert_eq!(config_value(Duration::from_secs(5)), "5000ms");
    }
}
