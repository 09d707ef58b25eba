//! Retries by the book, against the in-process S3 server behind a fault proxy on 127.0.0.1
//! (tests/support/proxy.rs) that answers the next requests with a status of its own and
//! counts every request: 4xx answers other than 408 and 429 are asked once, 429 and 503 are
//! retried after the server's `Retry-After` or with backoff, and retrying stops at the retry
//! time budget.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use std::time::{Duration, Instant};

use longshore_shards::ShardError;
use longshore_shards::store::{RetryPolicy, ShardInfo, ShardStore, Timeouts};
use proxy::{FaultProxy, Mode};
use support::s3::S3Server;
use support::shard_bytes;

struct Setup {
    server: S3Server,
    proxy: FaultProxy,
    shard: ShardInfo,
    bytes: Vec<u8>,
}

fn setup() -> Setup {
    let server = support::s3::start();
    let bytes = shard_bytes(9, 30_000);
    server.put("r/shard-0.tar", &bytes);
    server.put("r/shard-1.tar", b"one");
    let shard = server
        .store_builder()
        .build()
        .head(&server.url("r/shard-0.tar"))
        .unwrap();
    let proxy = proxy::start(server.endpoint());
    Setup {
        server,
        proxy,
        shard,
        bytes,
    }
}

impl Setup {
    /// A store through the proxy with this retry policy and retry budget.
    fn store(&self, retry: RetryPolicy, retry_timeout: Duration) -> ShardStore {
        self.server
            .store_builder()
            .s3_endpoint(self.proxy.endpoint())
            .retry(retry)
            .timeouts(Timeouts {
                retry_timeout,
                ..Timeouts::default()
            })
            .build()
    }

    /// Runs one store operation by name (`list`, `head`, `get`, `download`).
    fn run(&self, store: &ShardStore, op: &str) -> Result<(), ShardError> {
        let dir = tempfile::tempdir().unwrap();
        match op {
            "list" => store
                .resolve(&[self.server.url("r/shard-{0..1}.tar")])
                .map(drop),
            "head" => store.head(&self.shard.url).map(drop),
            "get" => store
                .get_range(&self.shard.url, 100..20_000)
                .map(|b| assert_eq!(&b[..], &self.bytes[100..20_000])),
            "download" => {
                let dest = dir.path().join("s");
                store.download(&self.shard, &dest)?;
                assert_eq!(std::fs::read(&dest).unwrap(), self.bytes);
                Ok(())
            }
            _ => unreachable!(),
        }
    }

    /// The times between the requests the proxy saw.
    fn gaps(&self) -> Vec<Duration> {
        let seen = self.proxy.seen();
        seen.windows(2).map(|w| w[1].at - w[0].at).collect()
    }
}

const OPS: [&str; 4] = ["list", "head", "get", "download"];

fn quick(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(10),
        stall_timeout: Duration::from_secs(5),
    }
}

#[test]
fn a_client_error_is_asked_once() {
    let s = setup();
    let store = s.store(quick(5), Duration::from_secs(30));
    for code in [403, 404, 400] {
        s.proxy.always(Mode::Status {
            code,
            retry_after: None,
        });
        for op in OPS {
            s.proxy.clear();
            let err = s.run(&store, op).expect_err(op);
            assert!(
                matches!(&err, ShardError::Fetch { op: o, attempts: 1, endpoint: Some(e), .. }
                    if *o == op && e == s.proxy.endpoint()),
                "{code} {op}: {err:?}"
            );
            let msg = err.to_string();
            assert!(msg.contains(s.proxy.endpoint()), "{msg}");
            assert!(msg.starts_with(&format!("{op} of s3://shards/r/")), "{msg}");
            assert_eq!(s.proxy.requests(), 1, "{code} {op}: asked once");
        }
    }
}

#[test]
fn too_many_requests_waits_for_retry_after_then_succeeds() {
    let s = setup();
    // Backoff of a few milliseconds: only the server's Retry-After explains a long wait.
    let store = s.store(quick(5), Duration::from_secs(30));
    for (op, code) in [("head", 429), ("download", 503), ("list", 429)] {
        s.proxy.clear();
        s.proxy.fail(
            Mode::Status {
                code,
                retry_after: Some(1),
            },
            1,
        );
        let start = Instant::now();
        s.run(&store, op).unwrap();
        assert!(start.elapsed() >= Duration::from_secs(1), "{op}");
        let gaps = s.gaps();
        assert_eq!(gaps.len(), 1, "{op}: one retry");
        assert!(gaps[0] >= Duration::from_secs(1), "{op}: {gaps:?}");
    }
}

#[test]
fn a_retry_after_beyond_the_budget_fails_at_once() {
    let s = setup();
    let store = s.store(quick(5), Duration::from_secs(10));
    s.proxy.always(Mode::Status {
        code: 429,
        retry_after: Some(120),
    });
    let start = Instant::now();
    let err = s.run(&store, "head").unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2), "{err}");
    assert!(
        matches!(err, ShardError::Fetch { attempts: 1, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("429") && msg.contains("Retry-After 120s"),
        "{msg}"
    );
}

#[test]
fn unavailable_is_retried_with_backoff_then_succeeds() {
    let s = setup();
    let policy = RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(1),
        stall_timeout: Duration::from_secs(5),
    };
    let store = s.store(policy, Duration::from_secs(30));
    s.proxy.fail(
        Mode::Status {
            code: 503,
            retry_after: None,
        },
        2,
    );
    s.run(&store, "get").unwrap();
    let gaps = s.gaps();
    assert_eq!(gaps.len(), 2, "two retries");
    // Jitter keeps each wait within [1/2, 1] of 200 ms, then of 400 ms.
    assert!(gaps[0] >= Duration::from_millis(100), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(200), "{gaps:?}");

    // 500 and 408 are retried too.
    for code in [500, 408] {
        s.proxy.clear();
        s.proxy.fail(
            Mode::Status {
                code,
                retry_after: None,
            },
            1,
        );
        s.run(&store, "head").unwrap();
        assert_eq!(s.proxy.requests(), 2, "{code}");
    }
}

#[test]
fn retries_stop_at_the_retry_budget() {
    let s = setup();
    let policy = RetryPolicy {
        max_attempts: 1000,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(50),
        stall_timeout: Duration::from_secs(5),
    };
    let store = s.store(policy, Duration::from_secs(1));
    s.proxy.always(Mode::Status {
        code: 503,
        retry_after: None,
    });
    for op in OPS {
        s.proxy.clear();
        let start = Instant::now();
        let err = s.run(&store, op).unwrap_err();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_millis(2500),
            "{op}: {took:?}"
        );
        let ShardError::Fetch { attempts, .. } = err else {
            panic!("{op}: {err:?}");
        };
        assert!((5..100).contains(&attempts), "{op}: {attempts}");
        assert_eq!(s.proxy.requests(), attempts as usize, "{op}");
    }
}
