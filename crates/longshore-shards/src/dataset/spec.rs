//! A dataset's resolved description ([`DatasetSpec`]) and how it is made at build: the shard
//! list and per-shard sample counts, read once, on a runtime of its own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::TARGET;
use longshore_data::dataset::mixture::Stop;

use crate::ShardError;
use crate::mds::{MdsIndex, MdsShardInfo};
use crate::order::{EpochOrder, MixtureConfig, OrderConfig};
use crate::store::{ShardInfo, ShardList, ShardStore};
use crate::webdataset::{ShardIndex, ShardReader};

/// The format of a dataset's shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ShardFormat {
    /// WebDataset tar shards ([`crate::webdataset`]).
    WebDataset,
    /// MosaicML MDS shards ([`crate::mds`]), uncompressed.
    Mds,
    /// Parquet files, a row per sample ([`crate::parquet`]).
    Parquet,
}

/// Where a shard's sample count came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CountSource {
    /// A wids shard index (`index.json`, `shard-index.json`, ...) at this URL.
    WidsIndex(String),
    /// An MDS `index.json` at this URL.
    MdsIndex(String),
    /// The shard was downloaded once at build and its tar headers were scanned.
    Scan,
    /// A Parquet file's footer (read with range requests).
    ParquetFooter,
}

/// What every rank and worker needs to know of a dataset, resolved once per job: the shards
/// (URLs, sizes, entity tags), their sample counts, and for MDS each shard's index entry.
///
/// It is `Serialize`/`Deserialize` ([`to_json`](Self::to_json)): resolve it on one rank,
/// hand it to the others (a broadcast, a file), and build their datasets with
/// [`ShardedDataset::from_spec`](super::ShardedDataset::from_spec), so the job lists the
/// bucket once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetSpec {
    /// The shards' format.
    pub format: ShardFormat,
    /// The shards, in order.
    pub shards: ShardList,
    /// Samples per shard, in the same order.
    pub counts: Vec<u64>,
    /// Where each count came from, in the same order.
    pub counted_by: Vec<CountSource>,
    /// For MDS, each shard's entry of its `index.json` (columns, encodings, sizes); empty for
    /// WebDataset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mds: Vec<MdsShardInfo>,
    /// Damage found while resolving (empty when every shard is whole): a shard whose scan
    /// stopped early (only its whole samples before the damage are counted) or whose size
    /// disagrees with its index (the index's count is kept; the samples the file lacks fail
    /// when read). A dataset built from such a spec is refused unless it skips failed samples
    /// (see [`OnSampleError`](super::OnSampleError)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub damaged: Vec<ShardDamage>,
    /// A mixture of datasets ([`DatasetSpec::mixture`]): the members' shards, member after
    /// member, and how they are drawn; `None` for one dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixture: Option<MixtureConfig>,
}

/// A damaged shard found while resolving a dataset (see [`DatasetSpec::damaged`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardDamage {
    /// The shard's place in [`DatasetSpec::shards`].
    pub shard: usize,
    /// Its URL.
    pub url: String,
    /// The tar member at fault, when known.
    pub member: Option<String>,
    /// Byte offset in the shard where the damage starts.
    pub offset: u64,
    /// What is wrong, and what it costs.
    pub reason: String,
}

impl std::fmt::Display for ShardDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {}: {} (at byte {}",
            self.url, self.reason, self.offset
        )?;
        if let Some(m) = &self.member {
            write!(f, ", member {m:?}")?;
        }
        write!(f, ")")
    }
}

impl DatasetSpec {
    /// Samples in the dataset's shards (a mixture's epoch has its own length:
    /// [`ShardedDataset::len`](super::ShardedDataset::len)).
    pub fn total_samples(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The spec of a mixture of datasets: `members`' shards, member after member, drawn in
    /// proportion to `weights` until `stop` (see [`MixtureConfig`] and
    /// [`EpochOrder::mixed`](crate::order::EpochOrder::mixed)). Members of a mixture share
    /// one format; a member that is itself a mixture is refused.
    ///
    /// # Errors
    /// [`ShardError::Order`] (option `mixture`) for no member, members of other formats, a
    /// nested mixture, weights that are not one per member or cannot be scheduled, or an
    /// empty member with weight.
    pub fn mixture(
        members: &[&DatasetSpec],
        weights: &[f64],
        stop: Stop,
    ) -> Result<DatasetSpec, ShardError> {
        let bad = |reason: String| ShardError::Order {
            option: "mixture",
            reason,
        };
        let first = members
            .first()
            .ok_or_else(|| bad("a mixture needs a member".into()))?;
        if let Some((i, m)) = members
            .iter()
            .enumerate()
            .find(|(_, m)| m.format != first.format)
        {
            return Err(bad(format!(
                "member {i} is {:?}, member 0 {:?}: the members of a mixture share a format",
                m.format, first.format
            )));
        }
        if let Some(i) = members.iter().position(|m| m.mixture.is_some()) {
            return Err(bad(format!(
                "member {i} is a mixture: mix its members into one mixture instead"
            )));
        }
        let mixture = MixtureConfig {
            shards: members.iter().map(|m| m.shards.len()).collect(),
            weights: weights.to_vec(),
            stop,
        };
        let mut spec = DatasetSpec {
            format: first.format,
            shards: ShardList { shards: Vec::new() },
            counts: Vec::new(),
            counted_by: Vec::new(),
            mds: Vec::new(),
            damaged: Vec::new(),
            mixture: None,
        };
        for m in members {
            let offset = spec.shards.len();
            spec.shards.shards.extend(m.shards.shards.iter().cloned());
            spec.counts.extend(&m.counts);
            spec.counted_by.extend(m.counted_by.iter().cloned());
            spec.mds.extend(m.mds.iter().cloned());
            spec.damaged.extend(m.damaged.iter().map(|d| ShardDamage {
                shard: d.shard + offset,
                ..d.clone()
            }));
        }
        // The schedule's own checks (weights, empty members), now rather than at the first
        // epoch.
        EpochOrder::mixed(&spec.counts, &mixture, OrderConfig::default(), 0)?;
        spec.mixture = Some(mixture);
        spec.check()?;
        Ok(spec)
    }

    /// The positions of an epoch: the shards' samples, or a mixture's positions by its stop
    /// rule.
    ///
    /// # Errors
    /// As [`DatasetSpec::mixture`], for a mixture whose members or weights do not fit.
    pub fn epoch_len(&self) -> Result<u64, ShardError> {
        match &self.mixture {
            None => Ok(self.total_samples()),
            Some(m) => Ok(EpochOrder::mixed(&self.counts, m, OrderConfig::default(), 0)?.len()),
        }
    }

    /// The spec as JSON.
    pub fn to_json(&self) -> String {
        // Strings, integers and lists always serialise.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A spec from [`to_json`](Self::to_json)'s output, checked as [`check`](Self::check)
    /// does.
    ///
    /// # Errors
    /// [`ShardError::Json`] if the text is not a spec; as [`check`](Self::check).
    pub fn from_json(json: &str) -> Result<DatasetSpec, ShardError> {
        let spec: DatasetSpec = serde_json::from_str(json).map_err(|source| ShardError::Json {
            what: "dataset spec",
            source,
        })?;
        spec.check()?;
        Ok(spec)
    }

    /// Checks that the lists agree in length and MDS entries are uncompressed.
    ///
    /// # Errors
    /// [`ShardError::Order`] (option `spec`) naming the lengths;
    /// [`ShardError::MdsCompression`] for a compressed MDS shard.
    pub fn check(&self) -> Result<(), ShardError> {
        let n = self.shards.len();
        let mds = match self.format {
            ShardFormat::Mds => n,
            ShardFormat::WebDataset | ShardFormat::Parquet => 0,
        };
        if self.counts.len() != n || self.counted_by.len() != n || self.mds.len() != mds {
            return Err(ShardError::Order {
                option: "spec",
                reason: format!(
                    "{n} shards, {} counts, {} count sources, {} mds entries (expected {mds})",
                    self.counts.len(),
                    self.counted_by.len(),
                    self.mds.len()
                ),
            });
        }
        if let Some(d) = self.damaged.iter().find(|d| d.shard >= n) {
            return Err(ShardError::Order {
                option: "spec",
                reason: format!("damage recorded for shard {} of {n}", d.shard),
            });
        }
        for info in &self.mds {
            if let Some(codec) = &info.compression {
                return Err(ShardError::MdsCompression {
                    shard: info
                        .zip_data
                        .as_ref()
                        .map_or_else(|| info.raw_data.basename.clone(), |z| z.basename.clone()),
                    codec: codec.clone(),
                });
            }
        }
        Ok(())
    }

    /// A name for the dataset: a hash of its shards' URLs, sizes and entity tags (the default
    /// cache directory's name).
    pub fn fingerprint(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
            h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
        };
        for s in &self.shards.shards {
            eat(s.url.as_bytes());
            eat(&s.size.to_le_bytes());
            eat(s.etag.as_deref().unwrap_or_default().as_bytes());
        }
        format!("{h:016x}")
    }
}

/// What a builder resolves a spec from.
#[derive(Debug, Clone)]
pub(super) enum Source {
    /// WebDataset shard URL patterns, and a wids index URL if given.
    WebDataset {
        patterns: Vec<String>,
        index: Option<String>,
    },
    /// MDS dataset roots (each holding an `index.json`).
    Mds { roots: Vec<String> },
    /// Parquet file URL patterns.
    Parquet { patterns: Vec<String> },
    /// A spec resolved elsewhere.
    Spec(Box<DatasetSpec>),
}

/// Resolves `source` on a current-thread runtime made for it and dropped before this returns,
/// with a copy of `store` that builds its own clients (dropped with the runtime): after this,
/// no runtime, I/O thread or pooled connection is left behind in the process (see the
/// [module docs](super) on fork safety).
pub(super) fn resolve(store: &ShardStore, source: &Source) -> Result<DatasetSpec, ShardError> {
    if let Source::Spec(spec) = source {
        spec.check()?;
        return Ok((**spec).clone());
    }
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(ShardError::Runtime {
            reason: "a sharded dataset is built with blocking I/O; build it outside the async \
                     runtime (for instance in spawn_blocking)"
                .into(),
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ShardError::Runtime {
            reason: format!("cannot build the runtime that resolves the dataset: {e}"),
        })?;
    let store = store.unshared();
    let spec = runtime.block_on(async {
        match source {
            Source::WebDataset { patterns, index } => {
                webdataset(&store, patterns, index.as_deref()).await
            }
            Source::Mds { roots } => mds(&store, roots).await,
            Source::Parquet { patterns } => parquet(&store, patterns).await,
            Source::Spec(_) => unreachable!("returned above"),
        }
    })?;
    drop(store);
    drop(runtime);
    spec.check()?;
    tracing::info!(
        target: TARGET,
        format = ?spec.format,
        shards = spec.shards.len(),
        samples = spec.total_samples(),
        scanned = spec.counted_by.iter().filter(|c| **c == CountSource::Scan).count(),
        "dataset resolved"
    );
    Ok(spec)
}

/// The directory part of a URL (without the trailing `/`).
fn dir_of(url: &str) -> &str {
    url.rsplit_once('/').map_or("", |(d, _)| d)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// The index a [`crate::webdataset::ShardWriter`] with this shard's prefix writes:
/// `shard-000012.tar` -> `shard-index.json`.
fn writer_index_name(file_name: &str) -> Option<String> {
    let stem = file_name.strip_suffix(".tar").unwrap_or(file_name);
    let prefix = stem.trim_end_matches(|c: char| c.is_ascii_digit());
    (prefix.len() < stem.len()).then(|| format!("{prefix}index.json"))
}

/// Whether a failed request failed because the object does not exist.
fn not_found(e: &ShardError) -> bool {
    match e {
        ShardError::Fetch { source, .. } => source
            .downcast_ref::<object_store::Error>()
            .is_some_and(|e| matches!(e, object_store::Error::NotFound { .. })),
        _ => false,
    }
}

/// Reads a small object whole (a `HEAD`, then one range read); `None` if it does not exist.
async fn read_small(store: &ShardStore, url: &str) -> Result<Option<Vec<u8>>, ShardError> {
    let info = match store.head_async(url).await {
        Ok(info) => info,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(
        store.get_range_async(url, 0..info.size).await?.to_vec(),
    ))
}

async fn webdataset(
    store: &ShardStore,
    patterns: &[String],
    index: Option<&str>,
) -> Result<DatasetSpec, ShardError> {
    let shards = store.resolve_async(patterns).await?;
    // Index candidates: the one given, else per directory the index a ShardWriter would have
    // written for each shard name prefix, and `index.json`.
    let mut candidates: Vec<String> = Vec::new();
    match index {
        Some(url) => candidates.push(url.to_owned()),
        None => {
            for s in &shards.shards {
                let dir = dir_of(&s.url);
                let names = writer_index_name(s.name())
                    .into_iter()
                    .chain(["index.json".to_owned()]);
                for name in names {
                    let url = join(dir, &name);
                    if !candidates.contains(&url) {
                        candidates.push(url);
                    }
                }
            }
        }
    }
    // URL -> (count, index URL), from every index found.
    let mut known: HashMap<String, (u64, Option<u64>, String)> = HashMap::new();
    for url in &candidates {
        let text = match read_small(store, url).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) if index.is_none() => continue,
            Ok(None) => {
                return Err(ShardError::Url {
                    url: url.clone(),
                    reason: "the shard index does not exist".into(),
                });
            }
            Err(e) if index.is_none() => {
                tracing::warn!(target: TARGET, index = %url, error = %e, "cannot read a shard index; shards it would count are scanned");
                continue;
            }
            Err(e) => return Err(e),
        };
        let parsed = std::str::from_utf8(&text)
            .map_err(|e| ShardError::Tar {
                shard: url.clone(),
                member: None,
                offset: e.valid_up_to() as u64,
                reason: "the shard index is not UTF-8".into(),
            })
            .and_then(|t| ShardIndex::from_json(url, t));
        let parsed = match parsed {
            Ok(p) => p,
            Err(e) if index.is_none() => {
                tracing::debug!(target: TARGET, index = %url, error = %e, "not a wids shard index; ignored");
                continue;
            }
            Err(e) => return Err(e),
        };
        let dir = dir_of(url);
        for entry in parsed.shardlist {
            let full = if entry.url.contains("://") || entry.url.starts_with('/') {
                entry.url.clone()
            } else {
                join(dir, &entry.url)
            };
            known
                .entry(full)
                .or_insert((entry.nsamples, entry.filesize, url.clone()));
        }
    }
    let mut counts = Vec::with_capacity(shards.len());
    let mut counted_by = Vec::with_capacity(shards.len());
    let mut damaged = Vec::new();
    for (i, s) in shards.shards.iter().enumerate() {
        match known.get(&s.url) {
            Some((n, size, from)) => {
                if let Some(size) = size.filter(|&size| size != s.size) {
                    // The index's count stays the dataset's: a shard cut short is damage (the
                    // samples it lacks fail when read), never a smaller dataset.
                    tracing::warn!(target: TARGET, shard = %s.url, index = %from, index_size = size, size = s.size, "the shard's size disagrees with its index");
                    damaged.push(ShardDamage {
                        shard: i,
                        url: s.url.clone(),
                        member: None,
                        offset: size.min(s.size),
                        reason: format!(
                            "the shard holds {} bytes, its index ({from}) says {size}: the \
                             samples past byte {} cannot be read as indexed",
                            s.size,
                            size.min(s.size)
                        ),
                    });
                }
                counts.push(*n);
                counted_by.push(CountSource::WidsIndex(from.clone()));
            }
            None => {
                let (n, damage) = scan(store, s).await?;
                if let Some(mut d) = damage {
                    d.shard = i;
                    damaged.push(d);
                }
                counts.push(n);
                counted_by.push(CountSource::Scan);
            }
        }
    }
    Ok(DatasetSpec {
        format: ShardFormat::WebDataset,
        shards,
        counts,
        counted_by,
        mds: Vec::new(),
        damaged,
        mixture: None,
    })
}

static SCAN_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Counts a tar shard's samples: downloads it to a temporary file and scans its headers. A
/// damaged shard counts the whole samples before the damage, and says where the damage is.
async fn scan(
    store: &ShardStore,
    shard: &ShardInfo,
) -> Result<(u64, Option<ShardDamage>), ShardError> {
    let n = SCAN_COUNTER.fetch_add(1, Ordering::Relaxed);
    let path: PathBuf = std::env::temp_dir().join(format!(
        "longshore-scan-{}-{n}-{}",
        std::process::id(),
        shard.name()
    ));
    tracing::info!(target: TARGET, shard = %shard.url, bytes = shard.size, "no shard index counts this shard; downloading it once to count its samples");
    let result = async {
        store.download_async(shard, &path).await?;
        let (spans, error) = ShardReader::open(&path)?.scan_partial();
        let damage = error.map(|e| {
            tracing::warn!(target: TARGET, shard = %shard.url, error = %e, samples = spans.len(), "damaged shard: its samples past the damage cannot be read");
            let (member, offset, reason) = match e {
                ShardError::Tar {
                    member,
                    offset,
                    reason,
                    ..
                } => (member, offset, reason),
                ShardError::Sample {
                    key,
                    offset,
                    reason,
                    ..
                } => (Some(key), offset, reason),
                other => (None, 0, other.to_string()),
            };
            ShardDamage {
                shard: 0,
                url: shard.url.clone(),
                member,
                offset,
                reason: format!(
                    "{reason}; no index counts this shard, so its samples past the damage are \
                     unknown: {} whole samples before it are counted",
                    spans.len()
                ),
            }
        });
        Ok((spans.len() as u64, damage))
    }
    .await;
    let _ = std::fs::remove_file(&path);
    result
}

/// Parquet files: the listing, then each file's row count from its footer (at most 16 files'
/// footers read at once).
async fn parquet(store: &ShardStore, patterns: &[String]) -> Result<DatasetSpec, ShardError> {
    use futures_util::{StreamExt, TryStreamExt};
    let shards = store.resolve_async(patterns).await?;
    let counts: Vec<u64> = futures_util::stream::iter(&shards.shards)
        .map(|s| crate::parquet::row_count(store, s))
        .buffered(16)
        .try_collect()
        .await?;
    let n = shards.len();
    Ok(DatasetSpec {
        format: ShardFormat::Parquet,
        shards,
        counts,
        counted_by: vec![CountSource::ParquetFooter; n],
        mds: Vec::new(),
        damaged: Vec::new(),
        mixture: None,
    })
}

async fn mds(store: &ShardStore, roots: &[String]) -> Result<DatasetSpec, ShardError> {
    let mut spec = DatasetSpec {
        format: ShardFormat::Mds,
        shards: ShardList::default(),
        counts: Vec::new(),
        counted_by: Vec::new(),
        mds: Vec::new(),
        damaged: Vec::new(),
        mixture: None,
    };
    for root in roots {
        let root = root.trim_end_matches('/');
        let url = join(root, "index.json");
        let bytes = read_small(store, &url)
            .await?
            .ok_or_else(|| ShardError::Url {
                url: url.clone(),
                reason: "the MDS dataset has no index.json".into(),
            })?;
        let text = String::from_utf8_lossy(&bytes);
        let index = MdsIndex::from_json(&text)?;
        for info in index.shards {
            spec.shards.shards.push(ShardInfo {
                url: join(root, &info.raw_data.basename),
                size: info.raw_data.bytes,
                etag: None,
            });
            spec.counts.push(info.samples);
            spec.counted_by.push(CountSource::MdsIndex(url.clone()));
            spec.mds.push(info);
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_index_names() {
        assert_eq!(
            writer_index_name("shard-000012.tar").as_deref(),
            Some("shard-index.json")
        );
        assert_eq!(
            writer_index_name("train-07.tar").as_deref(),
            Some("train-index.json")
        );
        assert_eq!(writer_index_name("a.tar"), None);
        assert_eq!(join("s3://b/d", "x"), "s3://b/d/x");
        assert_eq!(dir_of("s3://b/d/x.tar"), "s3://b/d");
    }
}
