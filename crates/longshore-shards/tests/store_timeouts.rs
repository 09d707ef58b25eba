//! Bounded waits, against real servers on 127.0.0.1: the in-process S3 server behind a fault
//! proxy (tests/support/proxy.rs) that never answers, answers late, stalls or resets a body,
//! and a port where nothing listens. Each operation (listing, `HEAD`, range read, download,
//! and the dataset's constructor) fails within the `timeout` option's bound, with an error
//! that names the operation and the endpoint; an answer that comes within it is waited for.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use std::time::{Duration, Instant};

use longshore_shards::ShardError;
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::store::{RetryPolicy, ShardInfo, ShardStore, Timeouts};
use proxy::{FaultProxy, Mode};
use support::s3::S3Server;
use support::shard_bytes;

/// The `timeout` option the tests set, and its value.
const TIMEOUT: &str = "300ms";
const WAIT: Duration = Duration::from_millis(300);
/// What an operation that should end within a few waits may take at most, on a busy machine:
/// far below what the defaults (30 s per request) would take.
const BOUND: Duration = Duration::from_secs(4);

struct Setup {
    server: S3Server,
    proxy: FaultProxy,
    shards: Vec<ShardInfo>,
    bytes: Vec<Vec<u8>>,
}

/// Two shards in `d/` of the S3 server, resolved directly; a proxy in front of the server.
fn setup() -> Setup {
    let server = support::s3::start();
    let bytes: Vec<Vec<u8>> = (0..2).map(|i| shard_bytes(i, 60_000)).collect();
    for (i, b) in bytes.iter().enumerate() {
        server.put(&format!("d/shard-{i}.tar"), b);
    }
    let shards = server
        .store_builder()
        .build()
        .resolve(&[server.url("d/shard-{0..1}.tar")])
        .unwrap()
        .shards;
    let proxy = proxy::start(server.endpoint());
    Setup {
        server,
        proxy,
        shards,
        bytes,
    }
}

impl Setup {
    /// A store that reaches the server through the proxy, with the `timeout` option.
    fn store(&self) -> ShardStore {
        self.server
            .store_builder()
            .s3_endpoint(self.proxy.endpoint())
            .option("timeout", TIMEOUT)
            .build()
    }

    /// As [`store`](Self::store), with `attempts` attempts and quick backoff.
    fn store_with(&self, attempts: u32) -> ShardStore {
        self.server
            .store_builder()
            .s3_endpoint(self.proxy.endpoint())
            .option("timeout", TIMEOUT)
            .retry(RetryPolicy {
                max_attempts: attempts,
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(20),
                stall_timeout: WAIT,
            })
            .build()
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// Each store operation once, with what it returned and how long it took.
fn each_operation(
    s: &Setup,
    store: &ShardStore,
) -> Vec<(&'static str, Result<(), ShardError>, Duration)> {
    let dir = tempfile::tempdir().unwrap();
    let url = &s.shards[0].url;
    let (list, t_list) = timed(|| {
        store
            .resolve(&[s.server.url("d/shard-{0..1}.tar")])
            .map(drop)
    });
    let (head, t_head) = timed(|| store.head(url).map(drop));
    let (get, t_get) = timed(|| store.get_range(url, 1000..50_000).map(drop));
    let (download, t_download) = timed(|| {
        store
            .download(&s.shards[1], &dir.path().join("x"))
            .map(drop)
    });
    vec![
        ("list", list, t_list),
        ("head", head, t_head),
        ("get", get, t_get),
        ("download", download, t_download),
    ]
}

/// `err` is a `Fetch` of `op` that names `endpoint`, after `attempts` attempts.
fn assert_names(err: &ShardError, op: &str, endpoint: &str, attempts: u32) {
    let msg = err.to_string();
    assert!(
        matches!(err, ShardError::Fetch { op: o, endpoint: Some(e), attempts: a, .. }
            if *o == op && e == endpoint && *a == attempts),
        "{err:?}"
    );
    assert!(msg.starts_with(&format!("{op} of s3://shards/d/")), "{msg}");
    assert!(msg.contains(endpoint), "{msg}");
}

#[test]
fn a_silent_endpoint_fails_every_operation_within_the_timeout() {
    let s = setup();
    s.proxy.always(Mode::Silent);
    let store = s.store_with(2);
    for (op, result, took) in each_operation(&s, &store) {
        let err = result.expect_err(op);
        assert_names(&err, op, s.proxy.endpoint(), 2);
        assert!(
            err.to_string().contains("no response within 300ms"),
            "{op}: {err}"
        );
        assert!(
            took >= 2 * WAIT,
            "{op} gave up before the timeout: {took:?}"
        );
        assert!(took < BOUND, "{op} took {took:?}");
    }
    assert_eq!(s.proxy.requests(), 4 * 2, "two attempts per operation");
}

#[test]
fn the_dataset_constructor_fails_within_the_timeout() {
    let s = setup();
    s.proxy.always(Mode::Silent);
    let dir = tempfile::tempdir().unwrap();
    let (result, took) = timed(|| {
        ShardedDataset::webdataset([s.server.url("d/shard-{0..1}.tar")])
            .store(s.store_with(2))
            .cache_dir(dir.path().join("cache"))
            .build()
    });
    let Err(err) = result else {
        panic!("the endpoint never answers, yet the dataset was built");
    };
    let msg = err.to_string();
    assert!(msg.contains(s.proxy.endpoint()), "{msg}");
    assert!(msg.contains("no response within 300ms"), "{msg}");
    assert!(took < BOUND, "{took:?}: {msg}");
}

#[test]
fn nothing_listening_fails_at_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    // The defaults, but for the endpoint: five quick attempts, no object_store retries.
    let store = ShardStore::builder()
        .s3_endpoint(&endpoint)
        .s3_credentials(support::s3::ACCESS_KEY, support::s3::SECRET_KEY)
        .s3_region(support::s3::REGION)
        .build();
    let (result, took) = timed(|| store.head("s3://shards/d/shard-0.tar"));
    let err = result.unwrap_err();
    assert_names(&err, "head", &endpoint, RetryPolicy::default().max_attempts);
    assert!(took < Duration::from_secs(3), "{took:?}: {err}");
}

#[test]
fn an_answer_within_the_timeout_is_waited_for_and_a_later_one_is_retried() {
    let s = setup();
    let store = s.store_with(3);
    let url = &s.shards[0].url;

    s.proxy.fail(Mode::SlowFirstByte(WAIT / 2), 1);
    let (head, took) = timed(|| store.head(url));
    assert_eq!(head.unwrap().size, 60_000);
    assert!(took >= WAIT / 2, "{took:?}");
    assert_eq!(s.proxy.requests(), 1, "not cut: one request");

    s.proxy.clear();
    s.proxy.fail(Mode::SlowFirstByte(Duration::from_secs(5)), 1);
    let (got, took) = timed(|| store.get_range(url, 0..1000));
    assert_eq!(&got.unwrap()[..], &s.bytes[0][..1000]);
    assert!(took >= WAIT && took < BOUND, "{took:?}");
    assert_eq!(s.proxy.requests(), 2, "cut at the timeout, then retried");
}

#[test]
fn a_stalled_body_is_cut_and_resumed() {
    let s = setup();
    // The `timeout` option alone sets the stall timeout (no retry policy given).
    let store = s.store();
    assert_eq!(store.retry_policy().stall_timeout, WAIT);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("s");

    s.proxy.fail(Mode::StallAfter(10_000), 1);
    let (report, took) = timed(|| store.download(&s.shards[1], &dest));
    let report = report.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), s.bytes[1]);
    assert_eq!((report.attempts, report.resumes), (2, 1), "{report:?}");
    assert!(took >= WAIT && took < BOUND, "{took:?}");

    s.proxy.fail(Mode::StallAfter(10_000), 1);
    let (got, took) = timed(|| store.get_range(&s.shards[0].url, 0..50_000));
    assert_eq!(&got.unwrap()[..], &s.bytes[0][..50_000]);
    assert!(took >= WAIT && took < BOUND, "{took:?}");
}

#[test]
fn a_body_that_always_stalls_fails_within_the_bound() {
    let s = setup();
    s.proxy.always(Mode::StallAfter(0));
    let store = s.store_with(2);
    for (op, result, took) in each_operation(&s, &store) {
        if op == "head" {
            // A HEAD has no body: it passes.
            result.unwrap();
            continue;
        }
        let err = result.expect_err(op);
        assert_names(&err, op, s.proxy.endpoint(), 2);
        assert!(took >= 2 * WAIT, "{op}: {took:?}");
        assert!(took < BOUND, "{op} took {took:?}: {err}");
    }
}

#[test]
fn a_reset_mid_body_is_resumed() {
    let s = setup();
    let store = s.store_with(3);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("s");
    s.proxy.fail(Mode::ResetAfter(20_000), 2);
    let report = store.download(&s.shards[1], &dest).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), s.bytes[1]);
    assert_eq!((report.attempts, report.resumes), (3, 2), "{report:?}");

    s.proxy.fail(Mode::ResetAfter(20_000), 1);
    let got = store.get_range(&s.shards[0].url, 0..50_000).unwrap();
    assert_eq!(&got[..], &s.bytes[0][..50_000]);
}

#[test]
fn the_timeout_option_sets_the_waits_and_a_bad_value_is_refused() {
    let store = ShardStore::builder().option("timeout", "10s").build();
    let t = store.timeouts();
    assert_eq!(t.first_byte, Duration::from_secs(10));
    assert_eq!(
        t.connect,
        Timeouts::default().connect,
        "5 s is already below it"
    );
    assert_eq!(store.retry_policy().stall_timeout, Duration::from_secs(10));
    let store = ShardStore::builder().option("timeout", "2.5").build();
    assert_eq!(store.timeouts().connect, Duration::from_millis(2500));

    // Typed setters win, whichever comes first.
    let typed = Timeouts {
        first_byte: Duration::from_secs(7),
        ..Timeouts::default()
    };
    for store in [
        ShardStore::builder()
            .timeouts(typed)
            .option("timeout", "1s")
            .build(),
        ShardStore::builder()
            .option("timeout", "1s")
            .timeouts(typed)
            .build(),
    ] {
        assert_eq!(store.timeouts(), typed);
    }

    let store = ShardStore::builder().option("timeout", "soon").build();
    let err = store.head("s3://shards/x.tar").unwrap_err();
    assert!(matches!(err, ShardError::StoreConfig { .. }), "{err:?}");
    let chain = support::data::chain(&err);
    assert!(
        chain.contains("timeout") && chain.contains("soon"),
        "{chain}"
    );
}
