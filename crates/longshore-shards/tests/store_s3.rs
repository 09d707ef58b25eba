//! `ShardStore` against a real S3 server (s3s-fs on 127.0.0.1, signatures checked): one
//! listing per job, heads, range reads, whole downloads, downloads resumed after cut bodies
//! (the fault wrapper around the real S3 client), and errors that name the URL, the shard
//! and the attempts.

mod support;

use std::time::Duration;

use longshore_shards::ShardError;
use longshore_shards::store::{Fault, FaultRates, FaultyStore, RetryPolicy, ShardList, ShardStore};
use support::{faulty, shard_bytes};

fn quick_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        stall_timeout: Duration::from_millis(300),
    }
}

#[test]
fn a_pattern_resolves_with_one_listing() {
    let server = support::s3::start();
    let mut want = Vec::new();
    for i in 0..12u64 {
        let bytes = shard_bytes(i, 100 + 37 * i as usize);
        server.put(&format!("train/shard-{i:06}.tar"), &bytes);
        want.push(bytes.len() as u64);
    }
    server.put("train/README", b"not a shard");
    server.put("train/sub/deeper.tar", b"below the prefix");
    let (store, slot) = faulty(server.store_builder(), |inner| {
        FaultyStore::with_plan(inner, [])
    });

    let list = store
        .resolve(&[server.url("train/shard-{000000..000009}.tar")])
        .unwrap();
    assert_eq!(list.len(), 10);
    for (i, s) in list.shards.iter().enumerate() {
        assert_eq!(s.url, server.url(&format!("train/shard-{i:06}.tar")));
        assert_eq!(s.size, want[i]);
        // (s3s-fs's listings carry no ETag, unlike S3's; HEADs do.)
    }
    let st = slot.stats();
    assert_eq!((st.lists, st.heads, st.gets), (1, 0, 0), "{st:?}");

    // The list travels to workers as a value; they make no request.
    let copy = ShardList::from_json(&list.to_json()).unwrap();
    assert_eq!(copy, list);

    // URLs of one directory share one listing, across patterns; a lone shard elsewhere is
    // one HEAD.
    server.put("other/lone.tar", b"lone");
    let list = store
        .resolve(&[
            server.url("train/shard-{000010,000011}.tar"),
            server.url("other/lone.tar"),
            server.url("train/README"),
        ])
        .unwrap();
    let sizes: Vec<u64> = list.shards.iter().map(|s| s.size).collect();
    assert_eq!(sizes, [want[10], want[11], 4, 11]);
    let st = slot.stats();
    assert_eq!((st.lists, st.heads), (2, 1), "{st:?}");

    // A prefix: everything directly under it, by name.
    let all = store.list(&server.url("train/")).unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.name()).collect();
    assert_eq!(names.len(), 13);
    assert_eq!(names[0], "README");
    assert_eq!(names[12], "shard-000011.tar");
    assert_eq!(all[1].url, server.url("train/shard-000000.tar"));
}

#[test]
fn a_missing_shard_is_named() {
    let server = support::s3::start();
    server.put("d/a-0.tar", b"0");
    server.put("d/a-1.tar", b"1");
    let store = server.store_builder().build();
    let err = store.resolve(&[server.url("d/a-{0..2}.tar")]).unwrap_err();
    assert!(
        matches!(&err, ShardError::MissingShard { url, .. } if url == &server.url("d/a-2.tar")),
        "{err}"
    );
    assert!(err.to_string().contains("a-2.tar"), "{err}");
}

#[test]
fn heads_and_range_reads() {
    let server = support::s3::start();
    let bytes = shard_bytes(7, 10_000);
    server.put("r/obj.tar", &bytes);
    let store = server.store_builder().build();
    let url = server.url("r/obj.tar");
    assert_eq!(store.head(&url).unwrap().size, 10_000);
    for range in [0..1, 0..10_000, 123..4567, 9_999..10_000, 5000..5000 + 1] {
        let got = store.get_range(&url, range.clone()).unwrap();
        assert_eq!(&got[..], &bytes[range.start as usize..range.end as usize]);
    }
    assert!(
        store.get_range(&url, 20_000..20_010).is_err(),
        "past the end"
    );
}

#[test]
fn a_whole_download_streams_to_a_file() {
    let server = support::s3::start();
    let bytes = shard_bytes(3, 3 << 20);
    server.put("big/shard.tar", &bytes);
    let store = server.store_builder().build();
    let info = store.head(&server.url("big/shard.tar")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("shard.tar");
    let report = store.download(&info, &dest).unwrap();
    assert_eq!(report.bytes, bytes.len() as u64);
    assert_eq!((report.attempts, report.resumes), (1, 0));
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
}

#[test]
fn a_cut_body_is_resumed_without_losing_or_repeating_bytes() {
    let server = support::s3::start();
    let bytes = shard_bytes(11, 200_000);
    server.put("cut/shard.tar", &bytes);
    let plan = [
        Some(Fault::CutBody { after: 1_000 }),
        Some(Fault::Unavailable),
        Some(Fault::CutBody { after: 50_001 }),
        Some(Fault::SlowDown),
        Some(Fault::Timeout),
        Some(Fault::InternalError),
        Some(Fault::CutBody { after: 7 }),
    ];
    let (store, slot) = faulty(server.store_builder().retry(quick_retries(5)), |inner| {
        FaultyStore::with_plan(inner, [])
    });
    let info = store.head(&server.url("cut/shard.tar")).unwrap();
    assert!(info.etag.is_some());
    slot.get().push(plan);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("shard.tar");
    let report = store.download(&info, &dest).unwrap();
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        bytes,
        "every byte once, in place"
    );
    assert_eq!(report.attempts, 8, "{report:?}");
    assert_eq!(report.resumes, 7, "{report:?}");
    assert_eq!(
        report.etag, info.etag,
        "resumes were conditional on this tag"
    );
    assert_eq!(slot.stats().gets, 8);
}

#[test]
fn a_stalled_body_is_resumed() {
    let server = support::s3::start();
    let bytes = shard_bytes(5, 30_000);
    server.put("stall/shard.tar", &bytes);
    let (store, _slot) = faulty(server.store_builder().retry(quick_retries(3)), |inner| {
        FaultyStore::with_plan(inner, [None, Some(Fault::StallBody { after: 4096 })])
    });
    let info = store.head(&server.url("stall/shard.tar")).unwrap();
    let dest = tempfile::tempdir().unwrap();
    let dest = dest.path().join("s");
    let report = store.download(&info, &dest).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
    assert_eq!(report.resumes, 1);
}

#[test]
fn seeded_faults_never_corrupt_a_download() {
    let server = support::s3::start();
    let shards: Vec<Vec<u8>> = (0..4)
        .map(|i| shard_bytes(i, 20_000 + 999 * i as usize))
        .collect();
    for (i, b) in shards.iter().enumerate() {
        server.put(&format!("seeded/{i}.tar"), b);
    }
    let plain = server.store_builder().build();
    let list = plain.resolve(&[server.url("seeded/{0..3}.tar")]).unwrap();
    for seed in 0..6u64 {
        let rates = FaultRates {
            server_error: 0.15,
            slow_down: 0.1,
            timeout: 0.05,
            cut_body: 0.4,
            stall_body: 0.0,
        };
        let (store, slot) = faulty(
            server.store_builder().retry(quick_retries(30)),
            move |inner| FaultyStore::seeded(inner, seed, rates),
        );
        let dir = tempfile::tempdir().unwrap();
        for (i, info) in list.shards.iter().enumerate() {
            let dest = dir.path().join(format!("{i}"));
            store.download(info, &dest).unwrap();
            assert_eq!(
                std::fs::read(&dest).unwrap(),
                shards[i],
                "seed {seed} shard {i}"
            );
        }
        assert!(slot.stats().injected > 0, "seed {seed} injected nothing");
    }
}

#[test]
fn a_persistent_error_names_the_url_the_shard_and_the_attempts() {
    let server = support::s3::start();
    server.put("p/shard-000042.tar", &shard_bytes(42, 5000));
    let plain = server.store_builder().build();
    let info = plain.head(&server.url("p/shard-000042.tar")).unwrap();
    let (store, slot) = faulty(server.store_builder().retry(quick_retries(3)), |inner| {
        FaultyStore::always(inner, Fault::Unavailable)
    });
    let dest = tempfile::tempdir().unwrap();
    let err = store.download(&info, &dest.path().join("x")).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, ShardError::Fetch { attempts: 3, shard, url, .. }
            if shard == "shard-000042.tar" && url == &info.url),
        "{err:?}"
    );
    assert!(
        msg.contains(&info.url) && msg.contains("3 attempt"),
        "{msg}"
    );
    assert!(msg.contains("503"), "the cause is kept: {msg}");
    assert_eq!(slot.stats().gets, 3);

    let err = store.get_range(&info.url, 0..10).unwrap_err();
    assert!(
        matches!(
            err,
            ShardError::Fetch {
                op: "get",
                attempts: 3,
                ..
            }
        ),
        "{err:?}"
    );
    let err = store.head(&info.url).unwrap_err();
    assert!(
        matches!(
            err,
            ShardError::Fetch {
                op: "head",
                attempts: 3,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_missing_object_is_not_retried() {
    let server = support::s3::start();
    let store = server.store_builder().retry(quick_retries(5)).build();
    let err = store.head(&server.url("nope.tar")).unwrap_err();
    assert!(
        matches!(err, ShardError::Fetch { attempts: 1, .. }),
        "{err:?}"
    );
}

#[test]
fn signatures_are_checked() {
    let server = support::s3::start();
    server.put("auth/a.tar", b"abc");
    let store = ShardStore::builder()
        .s3_endpoint(server.endpoint())
        .s3_credentials(support::s3::ACCESS_KEY, "not-the-secret")
        .s3_region(support::s3::REGION)
        .retry(quick_retries(1))
        .build();
    let err = store.head(&server.url("auth/a.tar")).unwrap_err();
    assert!(matches!(err, ShardError::Fetch { .. }), "{err:?}");
    assert!(
        server
            .store_builder()
            .build()
            .head(&server.url("auth/a.tar"))
            .is_ok()
    );
}

/// Run by the test below in a child process, whose environment names the server.
#[test]
fn child_reads_through_the_environment() {
    let Ok(url) = std::env::var("LONGSHORE_TEST_URL") else {
        return; // not a child
    };
    let info = ShardStore::from_env().head(&url).unwrap();
    assert_eq!(info.size, 1234);
}

#[test]
fn the_endpoint_and_credentials_come_from_the_environment() {
    let server = support::s3::start();
    server.put("env/shard.tar", &shard_bytes(1, 1234));
    let run = |secret: &str| {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_reads_through_the_environment",
                "--test-threads=1",
            ])
            .env("LONGSHORE_TEST_URL", server.url("env/shard.tar"))
            .env("AWS_ENDPOINT_URL", server.endpoint()) // loopback: plain http allowed
            .env("AWS_ACCESS_KEY_ID", support::s3::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("AWS_REGION", support::s3::REGION)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(
        run(support::s3::SECRET_KEY),
        "the child reads with the environment's settings"
    );
    assert!(
        !run("wrong"),
        "and they are really used: a wrong secret fails"
    );
}
