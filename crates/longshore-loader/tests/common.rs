//! Test datasets shared by the loader's tests (included with `mod common;`).
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use longshore_data::{DataError, Dataset};

/// Sample `i` is `([i as u32], [i as f32 * 0.5; 3])`; optional jitter, failures, panics, sleeps.
#[derive(Debug, Default)]
pub struct Probe {
    pub len: usize,
    pub jitter_us: u64,
    pub fail: HashSet<usize>,
    pub panic_on: HashSet<usize>,
    pub sleep_on: HashSet<usize>,
    pub sleep: Duration,
    pub gets: Mutex<Vec<usize>>,
}

impl Probe {
    pub fn new(len: usize) -> Self {
        Self {
            len,
            ..Self::default()
        }
    }
}

impl Dataset for Probe {
    type Item = ([u32; 1], [f32; 3]);
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Self::Item, DataError> {
        if index >= self.len {
            return Err(DataError::IndexOutOfRange {
                index,
                len: self.len,
                what: "probe",
            });
        }
        if self.jitter_us > 0 {
            let h = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            std::thread::sleep(Duration::from_micros(h % self.jitter_us));
        }
        if self.sleep_on.contains(&index) {
            std::thread::sleep(self.sleep);
        }
        if self.panic_on.contains(&index) {
            panic!("probe panics on sample {index}");
        }
        if self.fail.contains(&index) {
            return Err(DataError::InvalidArgument {
                name: "index",
                reason: format!("sample {index} is corrupt"),
            });
        }
        Ok(([index as u32], [index as f32 * 0.5; 3]))
    }
}

/// The sample indices of a batch from a Probe.
pub fn ids(batch: &longshore_data::Batch<longshore_host::PoolBuffer>) -> Vec<usize> {
    let ids = batch.tensor::<u32>(0).expect("u32 ids");
    let feats = batch.tensor::<f32>(1).expect("f32 features");
    assert_eq!(feats.len(), ids.len() * 3);
    for (k, &i) in ids.iter().enumerate() {
        assert!(
            feats[3 * k..3 * k + 3].iter().all(|&v| v == i as f32 * 0.5),
            "features of sample {i} corrupted"
        );
    }
    ids.iter().map(|&i| i as usize).collect()
}

/// Number of threads of this process (Linux).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}
