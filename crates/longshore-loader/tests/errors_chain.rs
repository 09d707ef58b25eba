//! Loader errors print each cause once: `Display` says what failed and where, `source()`
//! gives the cause, so an error-chain printer (`anyhow`'s `{:#}`) shows no repetition.

mod common;

use std::error::Error;

use common::Probe;
use longshore_data::{DataError, VecDataset};
use longshore_host::{MemoryKind, PinnedPool, PoolConfig};
use longshore_loader::{DataLoader, LoaderError};

/// Every message of the chain, outermost first.
fn chain(e: &dyn Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push(c.to_string());
        cause = c.source();
    }
    out
}

/// No message of the chain repeats the one of its cause.
fn assert_each_cause_once(e: &dyn Error) -> Vec<String> {
    let c = chain(e);
    for w in c.windows(2) {
        assert!(
            !w[1].is_empty() && !w[0].contains(&w[1]),
            "{:?} repeats its cause {:?} (chain {c:?})",
            w[0],
            w[1]
        );
    }
    c
}

#[test]
fn a_failing_sample_names_the_sample_and_gives_the_dataset_error_as_source() {
    let mut p = Probe::new(8);
    p.fail.insert(5);
    let loader = DataLoader::builder(p).batch_size(4).build().unwrap();
    let err = loader.iter().find_map(Result::err).unwrap();
    assert!(
        matches!(
            err,
            LoaderError::Sample {
                index: 5,
                batch: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let c = assert_each_cause_once(&err);
    assert_eq!(c[0], "failed to load sample 5 (batch 1)");
    assert!(c[1].contains("sample 5 is corrupt"), "{c:?}");
    let joined = c.join(": ");
    assert_eq!(joined.matches("sample 5 is corrupt").count(), 1, "{joined}");
}

#[test]
fn a_collate_error_names_the_batch_and_gives_the_shape_error_as_source() {
    let rows: Vec<(Vec<f32>,)> = vec![(vec![1.0],), (vec![1.0, 2.0],)];
    let loader = DataLoader::builder(VecDataset::new(rows))
        .batch_size(2)
        .build()
        .unwrap();
    let err = loader.iter().next().unwrap().unwrap_err();
    assert!(
        matches!(err, LoaderError::Collate { batch: 0, .. }),
        "{err:?}"
    );
    let c = assert_each_cause_once(&err);
    assert_eq!(c[0], "failed to collate batch 0");
    assert!(c.len() >= 2);
}

#[test]
fn a_memory_error_names_the_batch_and_gives_the_pool_error_as_source() {
    let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(64)).unwrap();
    let rows: Vec<([f32; 64],)> = vec![([0.0; 64],); 4];
    let loader = DataLoader::builder(VecDataset::new(rows))
        .batch_size(4)
        .pool(pool)
        .build()
        .unwrap();
    let err = loader.iter().next().unwrap().unwrap_err();
    assert!(
        matches!(err, LoaderError::Memory { batch: 0, .. }),
        "{err:?}"
    );
    let c = assert_each_cause_once(&err);
    assert_eq!(c[0], "no host memory for batch 0");
    assert!(c[1].contains("budget"), "{c:?}");
}

#[test]
fn every_wrapping_variant_prints_its_cause_once() {
    let io = || std::io::Error::other("resource temporarily unavailable");
    let data = || DataError::InvalidArgument {
        name: "index",
        reason: "sample 3 is corrupt".into(),
    };
    let errors = [
        LoaderError::Sample {
            index: 3,
            batch: 0,
            source: data(),
        },
        LoaderError::Collate {
            batch: 2,
            source: data(),
        },
        LoaderError::Spawn {
            worker: 1,
            source: io(),
        },
        LoaderError::Data(data()),
        LoaderError::Host(longshore_host::HostError::LargerThanBudget {
            requested: 10,
            block: 16,
            budget: 8,
        }),
    ];
    for e in &errors {
        let c = assert_each_cause_once(e);
        // Wrappers with context have the cause as source; transparent ones are their cause.
        let transparent = matches!(e, LoaderError::Data(_) | LoaderError::Host(_));
        assert!(c.len() >= 2 || transparent, "{e:?}: no source: {c:?}");
    }
}
