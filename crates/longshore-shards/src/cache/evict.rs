//! Making room in the cache: reservations, and eviction by the node's schedule (Belady's
//! rule) or, without one, by the index's order.

use super::*;

/// Why room is reserved: a shard needed now (a `get`), or one fetched ahead (prefetch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    Now,
    Ahead,
}

/// A reservation: the temporary file, locked exclusively while the download runs.
pub(super) struct Reserved {
    pub(super) key: String,
    pub(super) temp: PathBuf,
    pub(super) file: File,
}

impl Inner {
    /// Evicts one shard if no reader holds it; `true` if it is gone.
    pub(super) fn try_evict(&self, l: &mut Locked, key: &str) -> Result<bool, ShardError> {
        let path = self.data_path(key);
        match File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("open", &path, e)),
            Ok(f) => match f.try_lock() {
                Ok(()) => fs::remove_file(&path).map_err(|e| io("remove", &path, e))?,
                Err(TryLockError::WouldBlock) => return Ok(false),
                Err(TryLockError::Error(e)) => return Err(io("lock", &path, e)),
            },
        }
        if let Some(e) = l.index.entries.remove(key) {
            tracing::debug!(target: TARGET, url = %e.url, bytes = e.size, "evicted");
        }
        self.evictions.fetch_add(1, Ordering::Relaxed);
        self.schedule.count(|e| e.evictions += 1);
        self.save(l)?;
        Ok(true)
    }

    /// Makes room for `shard` and reserves it with a new locked temporary file; `None` if it
    /// does not fit. With a schedule (see [`View`]), by Belady's rule: the unleased shards read
    /// furthest ahead on the node are evicted first (those never read again this epoch before
    /// any), and a shard fetched ahead evicts only shards read later than it; when the budget
    /// holds the schedule's working set it evicts only shards no reader needs again, and takes
    /// free room only where the schedule leaves it free until the shard's first read. Without
    /// a schedule: unleased shards, consumed first, then least recently used (a shard fetched
    /// ahead evicts only consumed ones).
    pub(super) fn reserve(
        &self,
        l: &mut Locked,
        key: &str,
        shard: &ShardInfo,
        need: Need,
    ) -> Result<Option<Reserved>, ShardError> {
        let budget = self.config.budget_bytes;
        let over = l.index.used() + shard.size > budget;
        let view = (over || need == Need::Ahead)
            .then(|| self.schedule.view(&self.config.dir))
            .filter(View::active);
        match &view {
            None if over => self.evict_without_schedule(l, shard, need == Need::Ahead)?,
            None => {}
            Some(view) if !self.evict_by_schedule(l, key, shard, need, view, over)? => {
                return Ok(None);
            }
            Some(_) => {}
        }
        if l.index.used() + shard.size > budget {
            return Ok(None);
        }
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{key}.{}.{n}.part", std::process::id());
        let temp = self.config.dir.join("tmp").join(&name);
        let file = File::create_new(&temp).map_err(|e| io("create", &temp, e))?;
        file.lock().map_err(|e| io("lock", &temp, e))?;
        let last_used = l.index.tick();
        l.index.entries.insert(
            key.to_owned(),
            Entry {
                url: shard.url.clone(),
                size: shard.size,
                etag: shard.etag.clone(),
                last_used,
                done: false,
                downloading: Some(name),
            },
        );
        self.save(l)?;
        Ok(Some(Reserved {
            key: key.to_owned(),
            temp,
            file,
        }))
    }

    /// Evicts unleased shards, consumed first, then least recently used (only consumed ones if
    /// `only_done`), until `shard` fits.
    pub(super) fn evict_without_schedule(
        &self,
        l: &mut Locked,
        shard: &ShardInfo,
        only_done: bool,
    ) -> Result<(), ShardError> {
        let budget = self.config.budget_bytes;
        let mut victims: Vec<(bool, u64, String)> = l
            .index
            .entries
            .iter()
            .filter(|(_, e)| e.downloading.is_none() && (e.done || !only_done))
            .map(|(k, e)| (!e.done, e.last_used, k.clone()))
            .collect();
        victims.sort();
        for (_, _, victim) in victims {
            if l.index.used() + shard.size <= budget {
                break;
            }
            self.try_evict(l, &victim)?;
        }
        Ok(())
    }

    /// Belady's rule (see [`reserve`](Self::reserve)); `false` when a shard fetched ahead
    /// must wait (the schedule needs the room before its first read).
    pub(super) fn evict_by_schedule(
        &self,
        l: &mut Locked,
        key: &str,
        shard: &ShardInfo,
        need: Need,
        view: &View,
        over: bool,
    ) -> Result<bool, ShardError> {
        let budget = self.config.budget_bytes;
        let next_of = |k: &str| self.schedule.shard_of(k).and_then(|s| view.next_use(s));
        // How far ahead the shard asked for is read: now for a `get`.
        let at = match need {
            Need::Now => 0,
            Need::Ahead => match next_of(key) {
                Some(t) => t,
                None => return Ok(false), // no reader needs it
            },
        };
        // Computed once, and only where asked (it walks every reader's schedule).
        let working_set = std::cell::OnceCell::new();
        let sufficient = || {
            let ws = *working_set.get_or_init(|| view.working_set());
            (ws.0 <= budget, ws)
        };
        // A shard fetched ahead may displace the shards not read again until it is read for
        // the last time (Belady's rule evicts them for it), so that a worker's next shards
        // are on disk when it starts them rather than missed one by one as the shards before
        // are read for the last time. Below the working set (where shards are downloaded
        // again anyway) any such shard: the one straddling two workers' runs, read by one at
        // the start and by the other at the end, is the usual one. When the budget holds the
        // working set, only shards the epoch has not read or downloaded yet (the last
        // epoch's, kept): evicting one moves its download of the epoch later, it does not add
        // a second.
        // Its last read.
        let after = (need == Need::Ahead).then(|| {
            self.schedule
                .shard_of(key)
                .and_then(|s| view.last_use(s))
                .unwrap_or(at)
        });
        let displaceable = |k: &str| {
            after.is_some_and(|last| {
                self.schedule.shard_of(k).is_some_and(|s| {
                    view.next_use(s).is_some_and(|n| n > last)
                        && !((self.schedule.had(k) || view.started(s)) && sufficient().0)
                })
            })
        };
        if need == Need::Ahead {
            // Room the schedule keeps live before the shard's read, or that shards fetched
            // ahead hold, is not its to take but where displaceable: taking it would have a
            // shard still needed evicted and downloaded again (more downloads than Belady's
            // rule makes).
            let cached = l
                .index
                .entries
                .keys()
                .filter_map(|k| self.schedule.shard_of(k));
            let needed = view.needed_until(at, cached);
            if needed + shard.size > budget {
                let spare: u64 = l
                    .index
                    .entries
                    .iter()
                    .filter(|(k, e)| e.downloading.is_none() && displaceable(k))
                    .map(|(_, e)| e.size)
                    .sum();
                if needed.saturating_sub(spare) + shard.size > budget {
                    return Ok(false);
                }
            }
        }
        if !over {
            return Ok(true);
        }
        let mut victims: Vec<(u64, bool, u64, String)> = l
            .index
            .entries
            .iter()
            .filter(|(_, e)| e.downloading.is_none())
            .filter_map(|(k, e)| {
                let next = next_of(k).unwrap_or(u64::MAX);
                // A shard fetched ahead displaces only shards no reader needs again, or
                // displaceable ones (see above).
                let eligible = need == Need::Now || next == u64::MAX || displaceable(k);
                eligible.then(|| (next, !e.done, e.last_used, k.clone()))
            })
            .collect();
        // Furthest next read first; among shards never read again, consumed first, then least
        // recently used.
        victims.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| (a.1, a.2).cmp(&(b.1, b.2))));
        for (next, _, _, victim) in victims {
            if l.index.used() + shard.size <= budget {
                break;
            }
            if self.try_evict(l, &victim)? && next != u64::MAX {
                self.schedule.count(|e| e.forced_evictions += 1);
                let (enough, (ws, shards)) = sufficient();
                if !enough && self.schedule.first_warning() {
                    warn_below_working_set(budget, ws, shards);
                }
            }
        }
        Ok(true)
    }
}

/// The warning, once per cache handle, that the budget is below the working set.
pub(super) fn warn_below_working_set(budget: u64, ws: u64, shards: usize) {
    tracing::warn!(
        target: TARGET,
        budget,
        working_set = ws,
        working_set_shards = shards,
        "the shard cache's budget of {budget} bytes is smaller than the working set of the \
         node's readers ({ws} bytes: {shards} shards live at once), so shards are downloaded \
         again within the epoch (the fewest Belady's rule allows) or samples of shards not on \
         disk read by range GETs; a budget of {ws} bytes would download each shard once per \
         epoch"
    );
}
