//! Helpers shared by the shard tests (included with `mod support;`): an in-process S3 server
//! ([`s3`]) and small data makers.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod s3;

/// `len` bytes that differ per shard `seed` and per offset, so a misplaced byte shows.
pub fn shard_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

use std::path::Path;
use std::sync::{Arc, Mutex};

use longshore_shards::store::{FaultStats, FaultyStore, ShardList, ShardStore, ShardStoreBuilder};

/// The fault wrapper a store built by [`faulty`] put around its client.
#[derive(Clone, Default)]
pub struct FaultySlot(Arc<Mutex<Option<Arc<FaultyStore>>>>);

impl FaultySlot {
    /// The wrapper (the store must have built its client).
    pub fn get(&self) -> Arc<FaultyStore> {
        Arc::clone(self.0.lock().unwrap().as_ref().expect("client built"))
    }

    /// The wrapper's counts; all zero before the client is built.
    pub fn stats(&self) -> FaultStats {
        self.0
            .lock()
            .unwrap()
            .as_ref()
            .map(|f| f.stats())
            .unwrap_or_default()
    }
}

/// A store whose clients are wrapped in a `FaultyStore` made by `make` (kept in the slot).
pub fn faulty(
    builder: ShardStoreBuilder,
    make: impl Fn(Arc<dyn object_store::ObjectStore>) -> FaultyStore + Send + Sync + 'static,
) -> (ShardStore, FaultySlot) {
    let slot = FaultySlot::default();
    let keep = slot.clone();
    let store = builder
        .wrap_stores(move |_, inner| {
            let f = Arc::new(make(inner));
            *keep.0.lock().unwrap() = Some(Arc::clone(&f));
            f
        })
        .build();
    (store, slot)
}

/// What every object-store backend must do with a pattern naming `shards` (their bytes, in
/// order), through a store built from `builder`: one listing and no HEAD for the whole pattern,
/// each object's size as listed, a range read and a download returning the objects' bytes.
/// Returns the store and the resolved list for the backend's own checks.
pub fn check_resolve_read_download(
    builder: ShardStoreBuilder,
    pattern: &str,
    shards: &[Vec<u8>],
) -> (ShardStore, ShardList) {
    let (store, slot) = faulty(builder, |inner| FaultyStore::with_plan(inner, []));
    let list = store.resolve(&[pattern.to_owned()]).unwrap();
    assert_eq!(
        list.shards.iter().map(|s| s.size).collect::<Vec<_>>(),
        shards.iter().map(|b| b.len() as u64).collect::<Vec<_>>()
    );
    let st = slot.stats();
    assert_eq!((st.lists, st.heads), (1, 0), "{st:?}");
    assert_eq!(
        &store.get_range(&list.shards[0].url, 100..300).unwrap()[..],
        &shards[0][100..300]
    );
    let last = list.shards.len() - 1;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("s");
    store.download(&list.shards[last], &dest).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), shards[last]);
    (store, list)
}

/// Writes `shard-{i:04}.bin` files of the given sizes into `dir`; returns their bytes.
pub fn write_local_shards(dir: &Path, sizes: &[usize]) -> Vec<Vec<u8>> {
    std::fs::create_dir_all(dir).unwrap();
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let bytes = shard_bytes(i as u64 + 1, n);
            std::fs::write(dir.join(format!("shard-{i:04}.bin")), &bytes).unwrap();
            bytes
        })
        .collect()
}

/// The list of the local shards written by [`write_local_shards`].
pub fn local_list(store: &ShardStore, dir: &Path, count: usize) -> ShardList {
    assert!(count > 0);
    let pattern = format!("{}/shard-{{0000..{:04}}}.bin", dir.display(), count - 1);
    if count == 1 {
        return store
            .resolve(&[format!("{}/shard-0000.bin", dir.display())])
            .unwrap();
    }
    store.resolve(&[pattern]).unwrap()
}

/// The bytes of regular files under `dir` (not descending), 0 if it does not exist.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The bytes of a cache directory's shard files (`data/` and `tmp/`), read while holding the
/// cache's index lock: files are created, renamed and removed only under that lock, so the
/// view is of one instant (temporary files grow outside it, within their reservations).
pub fn cache_disk_bytes(cache_dir: &Path) -> u64 {
    let Ok(lock) = std::fs::File::open(cache_dir.join("index.lock")) else {
        return 0;
    };
    lock.lock().unwrap();
    dir_bytes(&cache_dir.join("data")) + dir_bytes(&cache_dir.join("tmp"))
}

pub mod data;
