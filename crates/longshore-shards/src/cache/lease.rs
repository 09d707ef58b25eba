//! Leases: a [`CachedShard`] holds a shared lock on its file, so no eviction removes it; the
//! first lease of a shard in a process goes through the index, later ones of the same file do
//! not ([`Inner::lease_known`]); and a `get` that waits for room announces itself
//! ([`ShardCache::has_waiters`]) so that holders of idle leases can let them go.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::index::{Locked, writer_gone};
use super::{Inner, ShardCache, TARGET, TEMP_COUNTER, io};
use crate::ShardError;
use crate::store::ShardInfo;

/// A cached file this process has verified against the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Known {
    file: FileId,
    consumed: bool,
}

/// What identifies a file (its device and inode), where the platform says.
pub(super) type FileId = (u64, u64);

#[cfg(unix)]
pub(super) fn file_id(m: &fs::Metadata) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
pub(super) fn file_id(_: &fs::Metadata) -> Option<FileId> {
    None
}

/// A leased shard on local disk: it is not evicted while this lives. Dropping it (or
/// [`release`](Self::release)) marks the shard consumed.
#[derive(Debug)]
pub struct CachedShard {
    cache: Arc<Inner>,
    key: String,
    path: PathBuf,
    file: Option<File>,
    info: ShardInfo,
    /// Whether dropping the lease marks the shard consumed.
    consumed: bool,
    /// The file's identity, when the platform gives one.
    id: Option<FileId>,
}

impl CachedShard {
    /// The shard's complete local file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, read-only (it holds the lease's lock; `&File` implements `Read` and
    /// `Seek`).
    pub fn file(&self) -> &File {
        self.file.as_ref().expect("present until drop")
    }

    /// The shard.
    pub fn info(&self) -> &ShardInfo {
        &self.info
    }

    /// The whole shard's bytes.
    ///
    /// # Errors
    ///
    /// [`ShardError::Io`] naming the file.
    pub fn read_all(&self) -> Result<Vec<u8>, ShardError> {
        fs::read(&self.path).map_err(|e| io("read", &self.path, e))
    }

    /// Releases the lease and marks the shard consumed (the same as dropping it).
    pub fn release(self) {}

    /// Releases the lease without marking the shard consumed: for a reader that will come back
    /// to it, but lets it go meanwhile (because [`ShardCache::has_waiters`]). It may be evicted,
    /// after the consumed shards; it costs no write of the index.
    pub fn release_unread(mut self) {
        self.consumed = false;
    }
}

impl Drop for CachedShard {
    fn drop(&mut self) {
        self.let_go();
        // Its room may be what a prefetch waits for.
        self.cache.room_changed();
    }
}

impl CachedShard {
    /// Unlocks the file, and marks the shard consumed when it is.
    fn let_go(&mut self) {
        if !self.consumed {
            drop(self.file.take());
            return;
        }
        // Marked consumed by this process already (a shard is consumed for good until it is
        // evicted, and then its file is another): no write of the index.
        let known = Known {
            file: self.id.unwrap_or_default(),
            consumed: true,
        };
        {
            let mut map = self.cache.known.lock().unwrap_or_else(|p| p.into_inner());
            match map.get_mut(&self.key) {
                Some(k) if self.id.is_some() && *k == known => {
                    drop(map);
                    drop(self.file.take());
                    return;
                }
                Some(k) if self.id.is_some() && k.file == known.file => k.consumed = true,
                _ => {}
            }
        }
        match self.cache.lock_index() {
            Ok(mut l) => {
                let tick = l.index.tick();
                if let Some(e) = l.index.entries.get_mut(&self.key) {
                    e.done = true;
                    e.last_used = tick;
                }
                if let Err(e) = self.cache.save(&l) {
                    tracing::warn!(target: TARGET, error = %e, "cannot mark a shard consumed");
                }
            }
            Err(e) => tracing::warn!(target: TARGET, error = %e, "cannot mark a shard consumed"),
        }
        // Unlocks the lease, after the index says the shard is consumed.
        drop(self.file.take());
    }
}

/// A `get` waiting for room, announced by a file in `waiters/` that it locks exclusively
/// (so that a waiter that died is seen as gone) and deletes when it stops waiting.
pub(super) struct Waiter {
    path: PathBuf,
    _file: File,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

impl ShardCache {
    /// Whether a [`get`](Self::get) somewhere on the node (any process sharing the directory)
    /// is waiting for room now. Cheap (a directory listing): poll it to decide when to
    /// [`release_unread`](CachedShard::release_unread) leases held for later. Announcements
    /// of processes that died are deleted.
    pub fn has_waiters(&self) -> bool {
        let dir = self.inner.config.dir.join("waiters");
        let Ok(entries) = fs::read_dir(&dir) else {
            return false;
        };
        let mut any = false;
        for e in entries.flatten() {
            let path = e.path();
            if writer_gone(&path) {
                let _ = fs::remove_file(&path);
            } else {
                any = true;
            }
        }
        any
    }
}

impl Inner {
    /// Opens a complete shard and takes a lease on it; `None` if its file is gone.
    pub(super) fn lease(
        self: &Arc<Self>,
        l: &mut Locked,
        key: &str,
        shard: &ShardInfo,
    ) -> Result<Option<CachedShard>, ShardError> {
        let path = self.data_path(key);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                l.index.entries.remove(key);
                self.save(l)?;
                return Ok(None);
            }
            Err(e) => return Err(io("open", &path, e)),
        };
        // Evictions hold the index lock, as this does: a shared lock is granted at once.
        file.lock_shared().map_err(|e| io("lock", &path, e))?;
        let tick = l.index.tick();
        let mut consumed = false;
        if let Some(e) = l.index.entries.get_mut(key) {
            e.last_used = tick;
            e.url.clone_from(&shard.url);
            consumed = e.done;
        }
        self.save(l)?;
        self.schedule.saw(key);
        let id = file.metadata().ok().as_ref().and_then(file_id);
        if let Some(file_id) = id {
            self.known.lock().unwrap_or_else(|p| p.into_inner()).insert(
                key.to_owned(),
                Known {
                    file: file_id,
                    consumed,
                },
            );
        }
        Ok(Some(self.leased(key, path, file, shard, id)))
    }

    /// A lease of a shard this process already leased through the index, without the index:
    /// its file is still the one verified then (same device and inode, at its place in
    /// `data/`, of the shard's size), shared-locked first, so that no eviction can remove it
    /// meanwhile (an eviction takes an exclusive lock; one that removed the file before the
    /// lock was taken leaves another file, or none, at the path). `None` sends the caller
    /// through the index.
    pub(super) fn lease_known(
        self: &Arc<Self>,
        key: &str,
        shard: &ShardInfo,
    ) -> Option<CachedShard> {
        let known = *self
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)?;
        let path = self.data_path(key);
        let file = File::open(&path).ok()?;
        file.try_lock_shared().ok()?;
        let held = file.metadata().ok()?;
        let id = file_id(&held)?;
        let at_path = fs::metadata(&path).ok().as_ref().and_then(file_id);
        if id != known.file || at_path != Some(id) || held.len() != shard.size {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.schedule.saw(key);
        Some(self.leased(key, path, file, shard, Some(id)))
    }

    /// The lease of `file` (shared-locked by the caller), marking the shard consumed when it
    /// is dropped.
    fn leased(
        self: &Arc<Self>,
        key: &str,
        path: PathBuf,
        file: File,
        shard: &ShardInfo,
        id: Option<FileId>,
    ) -> CachedShard {
        CachedShard {
            cache: Arc::clone(self),
            key: key.to_owned(),
            path,
            file: Some(file),
            info: shard.clone(),
            consumed: true,
            id,
        }
    }

    /// Announces a wait for room (once per `get`).
    pub(super) fn announce(&self, waiting: &mut Option<Waiter>) -> Result<(), ShardError> {
        if waiting.is_some() {
            return Ok(());
        }
        // Created and locked under `tmp/` (whose unlocked files are deleted as stale), then
        // renamed: `has_waiters` never sees an announcement before it is locked.
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("waiter.{}.{n}", std::process::id());
        let temp = self.config.dir.join("tmp").join(&name);
        let file = File::create_new(&temp).map_err(|e| io("create", &temp, e))?;
        if let Err(e) = file.lock() {
            let _ = fs::remove_file(&temp);
            return Err(io("lock", &temp, e));
        }
        let path = self.config.dir.join("waiters").join(&name);
        if let Err(e) = fs::rename(&temp, &path) {
            let _ = fs::remove_file(&temp);
            return Err(io("rename", &path, e));
        }
        *waiting = Some(Waiter { path, _file: file });
        Ok(())
    }
}
