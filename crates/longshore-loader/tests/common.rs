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

/// Runs `f` on its own thread and fails the test if it has not finished within `secs`
/// seconds, instead of hanging the test binary. A panic inside `f` is re-raised here.
pub fn watchdog<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    watchdog_with(secs, what, f, String::new)
}

/// [`watchdog`], adding `diag()` (the state of what hung: a pool's counters, a loader's stats)
/// to the failure.
pub fn watchdog_with<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
    diag: impl FnOnce() -> String,
) -> T {
    // Under Miri everything runs some hundred times slower: the bound is for hangs, not speed.
    let secs = if cfg!(miri) { secs * 30 } else { secs };
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("watchdog-{what}"))
        .spawn(move || {
            let out = f();
            let _ = tx.send(());
            out
        })
        .expect("spawn the watched thread");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {secs} s (hang){}", diag())
        }
    }
}

/// Waits up to `within` for `cond`, polling; returns whether it became true.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Like [`Probe`], plus samples of the wrong shape: sample `i` is
/// `([i as u32], vec![i as f32 * 0.5; 3])`, except that samples in `ragged` carry 4 features,
/// so a batch holding one of them cannot be stacked.
#[derive(Debug, Default)]
pub struct Chaos {
    pub len: usize,
    /// Upper bound of a per-sample pseudo-random sleep, in microseconds.
    pub jitter_us: u64,
    /// Seed of the jitter (so different runs sleep differently).
    pub jitter_seed: u64,
    pub fail: HashSet<usize>,
    pub panic_on: HashSet<usize>,
    pub ragged: HashSet<usize>,
    pub sleep_on: HashSet<usize>,
    pub sleep: Duration,
}

impl Chaos {
    pub fn new(len: usize) -> Self {
        Self {
            len,
            ..Self::default()
        }
    }
}

impl Dataset for Chaos {
    type Item = ([u32; 1], Vec<f32>);
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Self::Item, DataError> {
        if index >= self.len {
            return Err(DataError::IndexOutOfRange {
                index,
                len: self.len,
                what: "chaos",
            });
        }
        if self.jitter_us > 0 {
            let h = (index as u64 ^ self.jitter_seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            std::thread::sleep(Duration::from_micros(h % self.jitter_us));
        }
        if self.sleep_on.contains(&index) {
            std::thread::sleep(self.sleep);
        }
        if self.panic_on.contains(&index) {
            panic!("chaos panics on sample {index}");
        }
        if self.fail.contains(&index) {
            return Err(DataError::InvalidArgument {
                name: "index",
                reason: format!("sample {index} is corrupt"),
            });
        }
        let n = if self.ragged.contains(&index) { 4 } else { 3 };
        Ok(([index as u32], vec![index as f32 * 0.5; n]))
    }
}

/// The sample indices of a batch from a [`Chaos`] dataset and its feature width, checking
/// every value. The width is 3, or 4 when every sample of the batch is a ragged one (ragged
/// samples agree with each other, so a batch of only them stacks).
pub fn chaos_ids(batch: &longshore_data::Batch<longshore_host::PoolBuffer>) -> (Vec<usize>, usize) {
    let ids = batch.tensor::<u32>(0).expect("u32 ids");
    let feats = batch.tensor::<f32>(1).expect("f32 features");
    let width = feats.len() / ids.len().max(1);
    assert_eq!(feats.len(), ids.len() * width);
    assert!(width == 3 || width == 4, "{width} features per sample");
    for (k, &i) in ids.iter().enumerate() {
        assert!(
            feats[width * k..width * (k + 1)]
                .iter()
                .all(|&v| v == i as f32 * 0.5),
            "features of sample {i} corrupted"
        );
    }
    (ids.iter().map(|&i| i as usize).collect(), width)
}

/// Whether a stacked batch of `ids` with `width` features is consistent with the ragged set:
/// all ragged (width 4) or none (width 3).
pub fn ragged_consistent(ids: &[usize], width: usize, ragged: &HashSet<usize>) -> bool {
    if width == 4 {
        ids.iter().all(|i| ragged.contains(i))
    } else {
        ids.iter().all(|i| !ragged.contains(i))
    }
}
