//! The batch's pool lease is held until the last exported tensor is released, in any order and
//! from any thread, and only then goes back to the pool.

mod common;

use common::{batch, pool};
use longshore_dlpack::{ExportOptions, export_host};
use proptest::prelude::*;

#[test]
fn lease_is_held_until_every_deleter_ran() {
    let pool = pool(false);
    let b = batch(&pool, 0, 8);
    let held = pool.stats().bytes_in_use;
    assert!(held > 0);
    let tensors = export_host(b, &ExportOptions::default()).unwrap();
    let mut raws: Vec<_> = tensors.into_iter().map(|t| t.into_raw()).collect();
    assert_eq!(
        pool.stats().bytes_in_use,
        held,
        "export must not release the lease"
    );
    let last = raws.pop().unwrap();
    for r in raws {
        // SAFETY: a live export, deleted once.
        unsafe { ((*r).deleter.unwrap())(r) };
        assert_eq!(
            pool.stats().bytes_in_use,
            held,
            "other tensors still use the batch"
        );
    }
    // SAFETY: as above.
    unsafe { ((*last).deleter.unwrap())(last) };
    let s = pool.stats();
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(
        s.blocks_cached, 1,
        "the block went back to the pool's cache"
    );
    // The next batch reuses it.
    let _again = batch(&pool, 0, 8);
    assert_eq!(pool.stats().hits, 1);
}

#[test]
fn deleter_runs_on_another_thread() {
    let pool = pool(false);
    let tensors = export_host(batch(&pool, 0, 4), &ExportOptions::default()).unwrap();
    // Raw pointers as integers: what a consumer thread receives.
    let raws: Vec<usize> = tensors.into_iter().map(|t| t.into_raw() as usize).collect();
    std::thread::scope(|s| {
        for r in raws {
            s.spawn(move || {
                let r = r as *mut longshore_dlpack::ffi::DLManagedTensorVersioned;
                // SAFETY: a live export, deleted once, on this thread.
                unsafe { ((*r).deleter.unwrap())(r) };
            });
        }
    });
    assert_eq!(pool.stats().bytes_in_use, 0);
    assert_eq!(pool.stats().blocks_cached, 1);
}

#[test]
fn dropping_unexported_tensors_releases_the_lease() {
    let pool = pool(false);
    let tensors = export_host(batch(&pool, 0, 4), &ExportOptions::default()).unwrap();
    std::thread::spawn(move || drop(tensors)).join().unwrap();
    assert_eq!(pool.stats().bytes_in_use, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Several batches, their tensors released in a random order, some by deleter and some by
    /// drop: each lease goes back exactly when its batch's last tensor is released.
    #[test]
    fn any_release_order(
        order in Just((0..6usize).collect::<Vec<_>>()).prop_shuffle(),
        by_drop in proptest::collection::vec(any::<bool>(), 6),
    ) {
        let pool = pool(false);
        // Three batches of two tensors (features, labels) each.
        let mut live: Vec<Option<(usize, longshore_dlpack::DlpackTensor)>> = Vec::new();
        for b in 0..3 {
            for t in export_host(batch(&pool, b * 10, 3 + b), &ExportOptions::default()).unwrap() {
                live.push(Some((b, t)));
            }
        }
        let mut remaining = [2usize; 3];
        prop_assert_eq!(pool.stats().blocks_in_use, 3);
        for &i in &order {
            let (b, t) = live[i].take().unwrap();
            if by_drop[i] {
                drop(t);
            } else {
                let r = t.into_raw();
                // SAFETY: a live export, deleted once.
                unsafe { ((*r).deleter.unwrap())(r) };
            }
            remaining[b] -= 1;
            let live_batches = remaining.iter().filter(|&&n| n > 0).count();
            prop_assert_eq!(pool.stats().blocks_in_use, live_batches);
        }
        prop_assert_eq!(pool.stats().bytes_in_use, 0);
    }
}
