//! How the store's operations are retried: which failures are worth another request
//! ([`verdict`]), how long to wait before it ([`RetryPolicy`]'s backoff, or the server's
//! `Retry-After`), and when to stop ([`Retries`]: attempts and the retry time budget).

use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use super::fault::InjectedFault;
use super::http::ServerError;

/// How operations are retried (see the [module docs](crate::store#retries)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts an operation gets before its error is returned (at least 1). For a download,
    /// the attempts in a row that received no new byte.
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles per retry, with jitter.
    pub initial_backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// A response body that delivers no byte for this long is treated as cut: a download
    /// resumes, a range read is retried. Default 30 s; the `timeout` option sets it.
    pub stall_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based): `initial_backoff` doubled per retry,
    /// capped at `max_backoff`, with jitter in `[1/2, 1]` of it.
    pub(super) fn backoff(&self, retry: u32) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
            .min(self.max_backoff);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        exp.mul_f64(0.5 + f64::from(nanos % 1000) / 2000.0)
    }
}

/// What a failed request says about repeating it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Repeating it will not help: not found, denied, invalid, an HTTP status of 4xx other
    /// than 408 and 429, or a failure this module does not know to be passing.
    Permanent,
    /// It may pass when repeated: a 408, 429 or 5xx answer, a connection that failed, timed
    /// out or was cut, a body that stalled.
    Transient {
        /// How long the server asked to wait (`Retry-After`), if it did.
        retry_after: Option<Duration>,
    },
}

/// Whether `e` may pass on another request, read from its variant and its chain of sources.
///
/// The answers of HTTP servers reach here through the store's HTTP layer
/// ([`super::http`]), which turns a 408, 429 or 5xx answer into a [`ServerError`] and leaves
/// other statuses to object_store (404 becomes `NotFound`, 403 `PermissionDenied`, and any
/// other status an error carrying no mark of being transient, hence permanent).
pub(super) fn verdict(e: &object_store::Error) -> Verdict {
    use object_store::Error as E;
    if matches!(
        e,
        E::NotFound { .. }
            | E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotImplemented { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::UnknownConfigurationKey { .. }
    ) {
        return Verdict::Permanent;
    }
    let transient = Verdict::Transient { retry_after: None };
    let mut transport = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(s) = err.downcast_ref::<ServerError>() {
            return Verdict::Transient {
                retry_after: s.retry_after,
            };
        }
        // A fault a `FaultyStore` injected, as the server's error it stands for.
        #[cfg(feature = "testing")]
        if let Some(f) = err.downcast_ref::<InjectedFault>() {
            return match f.status {
                Some(s) if !super::http::retryable_status(s) => Verdict::Permanent,
                _ => transient,
            };
        }
        if err.is::<Interrupted>() {
            return transient;
        }
        if err.is::<object_store::client::HttpError>() {
            transport = true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            transport |= matches!(
                io.kind(),
                K::TimedOut
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::ConnectionRefused
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::Interrupted
            );
        }
        next = err.source();
    }
    if transport {
        transient
    } else {
        Verdict::Permanent
    }
}

/// A response body that stopped before its end: cut, stalled or short. Always transient.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Interrupted(pub(super) String);

impl Interrupted {
    /// As object_store's error, the form the store's retry loops handle.
    pub(super) fn error(reason: String) -> object_store::Error {
        object_store::Error::Generic {
            store: "longshore",
            source: Box::new(Self(reason)),
        }
    }
}

/// The retry state of one operation: its policy, its time budget and when that started.
#[derive(Debug)]
pub(super) struct Retries {
    policy: RetryPolicy,
    budget: Duration,
    since: Instant,
}

impl Retries {
    /// Retries by `policy`, none starting later than `budget` after now.
    pub(super) fn new(policy: RetryPolicy, budget: Duration) -> Self {
        Self {
            policy,
            budget,
            since: Instant::now(),
        }
    }

    /// Starts the budget again (a download that received new bytes).
    pub(super) fn progressed(&mut self) {
        self.since = Instant::now();
    }

    /// Time since the operation (or its last progress) started.
    pub(super) fn elapsed(&self) -> Duration {
        self.since.elapsed()
    }

    /// The wait before retry number `retry` (1-based) after `error`, or `None` when the error
    /// is to be returned: it is permanent, the attempts are used up, the budget is spent, or
    /// the server asked for a wait longer than what is left of it.
    pub(super) fn wait(&self, retry: u32, error: &object_store::Error) -> Option<Duration> {
        let Verdict::Transient { retry_after } = verdict(error) else {
            return None;
        };
        if retry >= self.policy.max_attempts.max(1) {
            return None;
        }
        let left = self.budget.checked_sub(self.since.elapsed())?;
        match retry_after {
            Some(after) if after > left => None,
            Some(after) => Some(after.max(self.policy.backoff(retry)).min(left)),
            None => Some(self.policy.backoff(retry).min(left)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Fault;

    fn generic(source: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
        object_store::Error::Generic {
            store: "test",
            source: Box::new(source),
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        assert!(p.backoff(1) <= Duration::from_millis(100));
        assert!(p.backoff(1) >= Duration::from_millis(50));
        assert!(p.backoff(30) <= p.max_backoff);
    }

    #[test]
    fn verdicts() {
        let not_found = object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        };
        assert_eq!(verdict(&not_found), Verdict::Permanent);
        let injected = |fault, status| {
            generic(InjectedFault {
                fault,
                request: "get x".into(),
                status,
            })
        };
        let t = Verdict::Transient { retry_after: None };
        assert_eq!(verdict(&injected(Fault::Unavailable, Some(503))), t);
        assert_eq!(verdict(&injected(Fault::Timeout, None)), t);
        assert_eq!(
            verdict(&injected(Fault::InternalError, Some(403))),
            Verdict::Permanent
        );
        let server = generic(ServerError {
            status: 429,
            retry_after: Some(Duration::from_secs(2)),
            body: String::new(),
        });
        assert_eq!(
            verdict(&server),
            Verdict::Transient {
                retry_after: Some(Duration::from_secs(2))
            }
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(verdict(&generic(reset)), t);
        assert_eq!(
            verdict(&generic(std::io::Error::other("unexplained"))),
            Verdict::Permanent
        );
        assert_eq!(verdict(&Interrupted::error("stalled".into())), t);
    }

    #[test]
    fn the_budget_bounds_retries_and_retry_after() {
        let policy = RetryPolicy {
            max_attempts: 100,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
            stall_timeout: Duration::from_secs(1),
        };
        let e = Interrupted::error("cut".into());
        let r = Retries::new(policy, Duration::from_secs(10));
        assert!(r.wait(1, &e).is_some());
        assert!(r.wait(100, &e).is_none(), "attempts used up");
        let busy = |secs| {
            generic(ServerError {
                status: 503,
                retry_after: Some(Duration::from_secs(secs)),
                body: String::new(),
            })
        };
        assert_eq!(r.wait(1, &busy(3)), Some(Duration::from_secs(3)));
        assert_eq!(r.wait(1, &busy(30)), None, "longer than the budget left");
        let spent = Retries::new(policy, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert!(spent.wait(1, &e).is_none(), "budget spent");
    }
}
