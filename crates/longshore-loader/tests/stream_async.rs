//! The async stream delivers the same batches as the iterator, never blocks the runtime, and
//! dropping it mid-epoch returns every lease.

#![cfg(feature = "stream")]

mod common;

use std::time::{Duration, Instant};

use common::{Probe, ids};
use futures_util::StreamExt;
use longshore_loader::DataLoader;

#[tokio::test(flavor = "current_thread")]
async fn stream_matches_the_iterator_and_drop_releases_leases() {
    let build = || {
        DataLoader::builder(Probe::new(300))
            .batch_size(32)
            .shuffle(true)
            .seed(3)
            .num_workers(2)
            .build()
            .unwrap()
    };
    let expected: Vec<Vec<usize>> = build().iter().map(|b| ids(&b.unwrap())).collect();
    let loader = build();
    let mut got = Vec::new();
    let mut s = loader.stream().unwrap();
    // A timer on the same single-threaded runtime keeps ticking: nothing blocks it.
    let ticker = tokio::spawn(async {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    while let Some(b) = s.next().await {
        got.push(ids(&b.unwrap()));
    }
    ticker.await.unwrap();
    assert_eq!(got, expected);

    let loader = build();
    let mut s = loader.stream().unwrap();
    let first = s.next().await.unwrap().unwrap();
    drop(first);
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    while loader.pool().stats().bytes_in_use != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(loader.pool().stats().bytes_in_use, 0);
}
