//! The cache directory's index (`index.json` under the lock of `index.lock`), the names of
//! cached shards, and reconciling the index with the files after a crash.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Inner, TARGET, io};
use crate::ShardError;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Index {
    pub(super) clock: u64,
    pub(super) entries: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Entry {
    /// Empty when rebuilt from a file alone.
    pub(super) url: String,
    pub(super) size: u64,
    pub(super) etag: Option<String>,
    pub(super) last_used: u64,
    /// Released by a reader since it was downloaded.
    pub(super) done: bool,
    /// The temporary file of the download in progress, if any.
    pub(super) downloading: Option<String>,
}

impl Index {
    pub(super) fn used(&self) -> u64 {
        self.entries.values().map(|e| e.size).sum()
    }

    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

/// The index, read under the directory's lock; the lock is held until this is dropped.
pub(super) struct Locked {
    pub(super) index: Index,
    _lock: File,
}
/// The file name a URL is cached under: a hash of the URL and its (sanitised) file name.
pub(super) fn key_for(url: &str) -> String {
    let hash = url.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let name: String = url
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    format!("{hash:016x}-{name}")
}

/// Whether a file that a writer locks exclusively has lost its writer.
pub(super) fn writer_gone(path: &Path) -> bool {
    match File::open(path) {
        Ok(f) => f.try_lock_shared().is_ok(),
        Err(_) => true,
    }
}
impl Inner {
    pub(super) fn index_path(&self) -> PathBuf {
        self.config.dir.join("index.json")
    }

    pub(super) fn lock_index(&self) -> Result<Locked, ShardError> {
        let lock_path = self.config.dir.join("index.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("open", &lock_path, e))?;
        lock.lock().map_err(|e| io("lock", &lock_path, e))?;
        let path = self.index_path();
        let index = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(target: TARGET, path = %path.display(), error = %e, "cache index unreadable; rebuilding");
                Index::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Index::default(),
            Err(e) => return Err(io("read", &path, e)),
        };
        Ok(Locked { index, _lock: lock })
    }

    pub(super) fn save(&self, l: &Locked) -> Result<(), ShardError> {
        let path = self.index_path();
        let tmp = self.config.dir.join("index.json.tmp");
        let json = serde_json::to_vec(&l.index).expect("the index always serialises");
        fs::write(&tmp, json).map_err(|e| io("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| io("rename", &path, e))
    }

    /// Brings the index in line with the files: complete shards kept (and adopted when the
    /// index lacks them), dead writers' temporary files deleted.
    pub(super) fn reconcile(&self) -> Result<(), ShardError> {
        let mut l = self.lock_index()?;
        let tmp_dir = self.config.dir.join("tmp");
        let data_dir = self.config.dir.join("data");
        let mut live_temps = Vec::new();
        let entries = std::mem::take(&mut l.index.entries);
        for (key, e) in entries {
            match &e.downloading {
                Some(t) if writer_gone(&tmp_dir.join(t)) => {
                    tracing::info!(target: TARGET, temp = %t, "deleting a dead download's temp file");
                    let _ = fs::remove_file(tmp_dir.join(t));
                }
                Some(t) => {
                    live_temps.push(t.clone());
                    l.index.entries.insert(key, e);
                }
                None => match fs::metadata(data_dir.join(&key)) {
                    Ok(m) if m.len() == e.size => {
                        l.index.entries.insert(key, e);
                    }
                    _ => {
                        let _ = fs::remove_file(data_dir.join(&key));
                    }
                },
            }
        }
        for f in fs::read_dir(&tmp_dir).map_err(|e| io("list", &tmp_dir, e))? {
            let f = f.map_err(|e| io("list", &tmp_dir, e))?;
            let name = f.file_name().to_string_lossy().into_owned();
            if !live_temps.contains(&name) && writer_gone(&f.path()) {
                tracing::info!(target: TARGET, temp = %name, "deleting a stale temp file");
                let _ = fs::remove_file(f.path());
            }
        }
        for f in fs::read_dir(&data_dir).map_err(|e| io("list", &data_dir, e))? {
            let f = f.map_err(|e| io("list", &data_dir, e))?;
            let key = f.file_name().to_string_lossy().into_owned();
            if let std::collections::btree_map::Entry::Vacant(slot) = l.index.entries.entry(key) {
                let size = f.metadata().map_err(|e| io("stat", &f.path(), e))?.len();
                tracing::debug!(target: TARGET, key = %slot.key(), size, "adopting a complete shard");
                slot.insert(Entry {
                    url: String::new(),
                    size,
                    etag: None,
                    last_used: 0,
                    done: false,
                    downloading: None,
                });
            }
        }
        self.save(&l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_file_names_and_differ_per_url() {
        let a = key_for("s3://b/x/shard-000001.tar");
        let b = key_for("s3://b/y/shard-000001.tar");
        assert_ne!(a, b);
        assert!(a.ends_with("-shard-000001.tar"), "{a}");
        let odd = key_for("http://h/a b/..?/c:d");
        assert!(!odd.contains(['/', ' ', ':', '?']), "{odd}");
    }
}
