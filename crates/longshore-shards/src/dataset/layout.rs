//! Where a shard's samples lie: the [`Layout`] of a cached file (a tar's sample spans, an MDS
//! header), shared by a dataset's readers ([`SharedLayouts`]), and the reads of one sample
//! from a leased file or from bytes fetched by range.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::{Inner, ShardFormat};
use crate::ShardError;
use crate::cache::CachedShard;
use crate::mds::{Columns, MdsSample, header_len, sample_count, sample_range};
use crate::store::ShardInfo;
use crate::webdataset::{Sample, SampleSpan, ShardReader};

/// The most samples whose layouts [`SharedLayouts`] keeps (~60 MiB of tar spans).
const MAX_SHARED_SAMPLES: usize = 1 << 20;

/// The layouts of the shards' cached files, shared by the dataset's readers in this process
/// and across epochs, so that a shard's headers are scanned once while its file stays in the
/// cache, not once per worker and epoch. A layout is kept with its shard's version (see
/// [`Version`]): a file evicted and downloaded again is scanned again only where the shard
/// list has no ETag for it. Tar and MDS
/// layouts only (a Parquet file's layout is its decoded rows); at most
/// [`MAX_SHARED_SAMPLES`] samples' worth, the oldest dropped first.
#[derive(Debug, Default)]
pub(super) struct SharedLayouts {
    inner: Mutex<LayoutMap>,
}

#[derive(Debug, Default)]
struct LayoutMap {
    by_shard: HashMap<usize, (FileId, Arc<Layout>)>,
    order: VecDeque<usize>,
    samples: usize,
}

/// Which version of a shard a layout was found in, with its length.
pub(super) type FileId = (u64, Version);

/// The version of a shard's bytes: the object's ETag where the shard list has one (the cache
/// leases only a file of that version, so the same object downloaded again has the same
/// layout and is not scanned again), else the cached file's modification time (`None`: bytes
/// read by range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Version {
    Etag(String),
    Modified(Option<SystemTime>),
}

impl Version {
    /// The version of `info`'s object as the store listed it, for bytes not on disk.
    pub(super) fn listed(info: &ShardInfo) -> Version {
        info.etag
            .clone()
            .map_or(Version::Modified(None), Version::Etag)
    }
}

/// The version of the shard `info` a lease of it holds.
pub(super) fn file_id(lease: &CachedShard, info: &ShardInfo) -> Option<FileId> {
    let m = lease.file().metadata().ok()?;
    let version = match &info.etag {
        Some(etag) => Version::Etag(etag.clone()),
        None => Version::Modified(m.modified().ok()),
    };
    Some((m.len(), version))
}

impl SharedLayouts {
    pub(super) fn get(&self, shard: usize, id: &FileId) -> Option<Arc<Layout>> {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        map.by_shard
            .get(&shard)
            .filter(|(have, _)| have == id)
            .map(|(_, layout)| Arc::clone(layout))
    }

    /// The layout of shard `shard` as the object of `size` bytes it was found in (a tar or
    /// MDS layout, whether from a cached file or a range read), for range reads of it.
    pub(super) fn for_object(&self, shard: usize, size: u64) -> Option<Arc<Layout>> {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        map.by_shard
            .get(&shard)
            .filter(|((len, _), layout)| {
                *len == size && !matches!(**layout, Layout::Parquet { .. })
            })
            .map(|(_, layout)| Arc::clone(layout))
    }

    pub(super) fn insert(&self, shard: usize, id: FileId, layout: &Arc<Layout>) {
        if matches!(&**layout, Layout::Parquet { .. }) {
            return;
        }
        let samples = layout.samples();
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let map = &mut *map;
        if let Some((_, old)) = map.by_shard.insert(shard, (id, Arc::clone(layout))) {
            map.samples -= old.samples();
            map.order.retain(|&s| s != shard);
        }
        map.order.push_back(shard);
        map.samples += samples;
        while map.samples > MAX_SHARED_SAMPLES
            && let Some(oldest) = map.order.pop_front()
        {
            if let Some((_, old)) = map.by_shard.remove(&oldest) {
                map.samples -= old.samples();
            }
        }
    }
}

/// How a shard's samples are found in its cached file.
#[derive(Debug)]
pub(super) enum Layout {
    /// A tar: each sample's byte span (from a header scan), and the damage that stopped the
    /// scan, if any.
    Tar {
        spans: Vec<SampleSpan>,
        damage: Option<Damage>,
    },
    /// An MDS shard: its count and offsets.
    Mds { head: Vec<u8> },
    /// A Parquet file: its rows, decoded once per lease.
    Parquet { rows: crate::parquet::Rows },
}

impl Layout {
    /// The samples it counts for [`SharedLayouts`]' limit.
    fn samples(&self) -> usize {
        match self {
            Layout::Tar { spans, .. } => spans.len(),
            Layout::Mds { head } => head.len() / 8,
            Layout::Parquet { .. } => 0,
        }
    }
}

/// Where and why a tar's scan stopped.
#[derive(Debug)]
pub(super) struct Damage {
    member: Option<String>,
    offset: u64,
    reason: String,
}

/// The layout of shard `shard`'s leased file: a scan of its tar headers, its MDS header
/// (checked against the index), or its decoded Parquet rows.
pub(super) fn scan(ds: &Inner, shard: usize, lease: &CachedShard) -> Result<Layout, ShardError> {
    let url = &lease.info().url;
    let mut file = lease.file();
    let io = |source| ShardError::Io {
        op: "read",
        path: lease.path().to_owned(),
        source,
    };
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    match ds.spec.format {
        ShardFormat::WebDataset => {
            let (spans, error) = ShardReader::scan_file(url.clone(), file).map_err(io)?;
            let damage = error.map(|e| match e {
                ShardError::Tar {
                    member,
                    offset,
                    reason,
                    ..
                } => Damage {
                    member,
                    offset,
                    reason,
                },
                ShardError::Sample {
                    key,
                    offset,
                    reason,
                    ..
                } => Damage {
                    member: Some(key),
                    offset,
                    reason,
                },
                other => Damage {
                    member: None,
                    offset: 0,
                    reason: other.to_string(),
                },
            });
            Ok(Layout::Tar { spans, damage })
        }
        ShardFormat::Parquet => {
            let rows = crate::parquet::read_rows(url, file.try_clone().map_err(io)?)?;
            let want = ds.spec.counts[shard];
            if rows.len() as u64 != want {
                return Err(ShardError::Parquet {
                    shard: url.clone(),
                    row: None,
                    reason: format!(
                        "the file holds {} rows, its footer said {want} when the dataset \
                         was resolved (the file changed?)",
                        rows.len()
                    ),
                });
            }
            Ok(Layout::Parquet {
                rows: Arc::new(rows),
            })
        }
        ShardFormat::Mds => {
            let info = &ds.spec.mds[shard];
            let size = file.metadata().map_err(io)?.len();
            let mds = |offset, reason| ShardError::Mds {
                shard: url.clone(),
                sample: None,
                offset,
                reason,
            };
            if size != info.raw_data.bytes {
                return Err(mds(
                    0,
                    format!(
                        "the file holds {size} bytes, the index says {}",
                        info.raw_data.bytes
                    ),
                ));
            }
            let mut count = [0u8; 4];
            file.read_exact(&mut count).map_err(io)?;
            let samples = sample_count(url, &count)?;
            if samples != info.samples {
                return Err(mds(
                    0,
                    format!(
                        "the file holds {samples} samples, the index says {}",
                        info.samples
                    ),
                ));
            }
            let len = header_len(samples);
            if len > size {
                return Err(mds(
                    0,
                    format!("the {len}-byte header is longer than the file ({size} bytes)"),
                ));
            }
            let mut head = vec![0u8; len as usize];
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            file.read_exact(&mut head).map_err(io)?;
            Ok(Layout::Mds { head })
        }
    }
}

/// Reads `buf.len()` bytes at `offset` of a leased shard.
fn read_at(lease: &CachedShard, offset: u64, buf: &mut [u8]) -> Result<(), ShardError> {
    let mut file = lease.file();
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(buf))
        .map_err(|source| ShardError::Io {
            op: "read",
            path: lease.path().to_owned(),
            source,
        })
}

/// An error of a reader over bytes that start at `base` in the shard, with shard offsets.
fn shift(e: ShardError, base: u64) -> ShardError {
    match e {
        ShardError::Tar {
            shard,
            member,
            offset,
            reason,
        } => ShardError::Tar {
            shard,
            member,
            offset: base + offset,
            reason,
        },
        ShardError::Sample {
            shard,
            key,
            offset,
            reason,
        } => ShardError::Sample {
            shard,
            key,
            offset: base + offset,
            reason,
        },
        other => other,
    }
}

impl Layout {
    /// The bytes of sample `index` in the shard (`None` for Parquet: rows, not bytes). `size`
    /// is the shard's, `count` the samples the dataset counts in it (named when a tar holds
    /// fewer).
    pub(super) fn range(
        &self,
        url: &str,
        size: u64,
        index: u64,
        count: u64,
    ) -> Result<Option<Range<u64>>, ShardError> {
        match self {
            Layout::Tar { spans, damage } => {
                tar_span(url, size, spans, damage.as_ref(), index, count).map(Some)
            }
            Layout::Mds { head } => sample_range(url, head, index).map(Some),
            Layout::Parquet { .. } => Ok(None),
        }
    }

    /// Sample `index` from `bytes`, its [`range`](Self::range) (an MDS shard's `columns`).
    pub(super) fn parse(
        &self,
        url: &str,
        columns: Option<&Columns>,
        index: u64,
        start: u64,
        bytes: &[u8],
    ) -> Result<Sample, ShardError> {
        match (self, columns) {
            (Layout::Mds { .. }, Some(columns)) => parse_mds(url, columns, index, start, bytes),
            _ => parse_tar(url, start, bytes),
        }
    }

    /// Sample `index` of a tar or MDS shard, read from its leased file.
    pub(super) fn read_leased(
        &self,
        lease: &CachedShard,
        columns: Option<&Columns>,
        index: u64,
        count: u64,
    ) -> Result<Sample, ShardError> {
        let info = lease.info();
        let Some(range) = self.range(&info.url, info.size, index, count)? else {
            unreachable!("a Parquet shard's rows are read by the reader");
        };
        let mut bytes = vec![0u8; (range.end - range.start) as usize];
        read_at(lease, range.start, &mut bytes)?;
        self.parse(&info.url, columns, index, range.start, &bytes)
    }
}

/// A tar's sample `index`, or the error naming why the scan found none.
fn tar_span(
    url: &str,
    size: u64,
    spans: &[SampleSpan],
    damage: Option<&Damage>,
    index: u64,
    count: u64,
) -> Result<Range<u64>, ShardError> {
    let Some(span) = usize::try_from(index).ok().and_then(|i| spans.get(i)) else {
        return Err(match damage {
            Some(d) => ShardError::Tar {
                shard: url.to_owned(),
                member: d.member.clone(),
                offset: d.offset,
                reason: format!(
                    "sample {index} lies in or after a damaged part of the shard ({} whole \
                     samples before it): {}",
                    spans.len(),
                    d.reason
                ),
            },
            None => ShardError::Tar {
                shard: url.to_owned(),
                member: None,
                offset: size,
                reason: format!(
                    "the shard holds {} samples, the dataset counts {count} (sample {index} \
                     asked for)",
                    spans.len()
                ),
            },
        });
    };
    Ok(span.offset..span.end)
}

/// The tar sample in `bytes`, which start at `start` in the shard.
fn parse_tar(url: &str, start: u64, bytes: &[u8]) -> Result<Sample, ShardError> {
    let mut reader = ShardReader::new(url.to_owned(), bytes);
    let mut samples = reader.samples().map_err(|e| shift(e, start))?;
    match samples.next() {
        Some(Ok(mut sample)) => {
            sample.offset = start;
            Ok(sample)
        }
        Some(Err(e)) => Err(shift(e, start)),
        None => Err(ShardError::Tar {
            shard: url.to_owned(),
            member: None,
            offset: start,
            reason: "no sample where the scan found one".to_owned(),
        }),
    }
}

/// The MDS sample `index` in `bytes`, which start at `start` in the shard.
fn parse_mds(
    url: &str,
    columns: &Columns,
    index: u64,
    start: u64,
    bytes: &[u8],
) -> Result<Sample, ShardError> {
    let parsed = MdsSample::parse(url, columns, index, start, bytes)?;
    let fields = columns
        .names()
        .iter()
        .zip(parsed.raw_columns())
        .map(|(name, raw)| (name.clone(), raw.to_vec()))
        .collect();
    Ok(Sample {
        key: index.to_string(),
        url: url.to_owned(),
        offset: start,
        fields,
    })
}
