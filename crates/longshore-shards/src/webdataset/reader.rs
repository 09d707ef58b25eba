//! Reading a tar shard: samples, or a header-only scan.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tar::EntryType;

use super::{Sample, is_meta, split_name};
use crate::ShardError;

/// Counts the bytes read through it, so errors can say where reading stopped.
#[derive(Debug)]
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        let at = self.inner.seek(pos)?;
        self.read.store(at, Ordering::Relaxed);
        Ok(at)
    }
}

/// A WebDataset shard read from any [`Read`] (a file, a cached download, an HTTP body), front
/// to back.
pub struct ShardReader<R: Read> {
    shard: String,
    archive: tar::Archive<Counting<R>>,
    read: Arc<AtomicU64>,
}

impl<R: Read> std::fmt::Debug for ShardReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReader")
            .field("shard", &self.shard)
            .field("read", &self.read.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ShardReader<BufReader<File>> {
    /// Opens a shard file; its path names it in errors.
    ///
    /// # Errors
    /// [`ShardError::ShardFile`] when it cannot be opened.
    pub fn open(path: impl AsRef<Path>) -> Result<ShardReader<BufReader<File>>, ShardError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| ShardError::ShardFile {
            path: path.to_owned(),
            source,
        })?;
        Ok(ShardReader::new(
            path.display().to_string(),
            BufReader::new(file),
        ))
    }
}

impl<R: Read> ShardReader<R> {
    /// Reads the tar from `reader`; `shard` (a name or URL) names it in errors and becomes
    /// the samples' [`Sample::url`].
    pub fn new(shard: impl Into<String>, reader: R) -> ShardReader<R> {
        let read = Arc::new(AtomicU64::new(0));
        ShardReader {
            shard: shard.into(),
            archive: tar::Archive::new(Counting {
                inner: reader,
                read: read.clone(),
            }),
            read,
        }
    }

    /// The shard's name.
    pub fn shard(&self) -> &str {
        &self.shard
    }

    fn members(&mut self) -> Result<Members<'_, R>, ShardError> {
        let ShardReader {
            shard,
            archive,
            read,
        } = self;
        let entries = archive.entries().map_err(|e| ShardError::Tar {
            shard: shard.clone(),
            member: None,
            offset: read.load(Ordering::Relaxed),
            reason: format!("cannot read the tar: {e}"),
        })?;
        Ok(Members {
            shard,
            read,
            entries,
            prev_end: 0,
            last: None,
        })
    }

    /// The shard's samples, in order. Iteration ends after the first error.
    ///
    /// # Errors
    /// [`ShardError::Tar`] when the tar cannot be started (it was already read).
    pub fn samples(&mut self) -> Result<Samples<'_, R>, ShardError> {
        Ok(Samples {
            members: self.members()?,
            pending: None,
            done: false,
        })
    }

    /// Finds the samples by reading headers only (member data is skipped, never held): their
    /// keys and byte ranges, for a shard index. `scan()?.len()` counts the samples.
    ///
    /// # Errors
    /// As reading the samples would (a truncated tar, a corrupt header, a duplicate field).
    pub fn scan(&mut self) -> Result<Vec<SampleSpan>, ShardError> {
        match self.scan_partial() {
            (spans, None) => Ok(spans),
            (_, Some(e)) => Err(e),
        }
    }

    /// [`scan`](Self::scan) that keeps what it found before an error: the samples that lie
    /// wholly before the damage, and the error (naming the shard, member and offset), if
    /// any. A reader of a damaged shard can still read those samples.
    pub fn scan_partial(&mut self) -> (Vec<SampleSpan>, Option<ShardError>) {
        let (spans, error, _) = match self.members() {
            Ok(mut m) => scan_members(&mut m),
            Err(e) => (Vec::new(), Some(e), 0),
        };
        tracing::debug!(target: "longshore::shards", shard = %self.shard, samples = spans.len(), damaged = error.is_some(), "scanned shard");
        (spans, error)
    }
}

impl ShardReader<BufReader<&File>> {
    /// [`ShardReader::scan_partial`] of a shard file, seeking over member data instead of
    /// reading it: a 64 MiB shard of 100 KiB images costs ~1,300 header reads, not 64 MiB.
    /// A member that runs past the end of the file (a truncated shard), which a seek does not
    /// see, makes it scan again front to back, so damage is reported as `scan_partial` does.
    ///
    /// # Errors
    /// [`std::io::Error`] when the file's length cannot be read or it cannot be rewound.
    pub fn scan_file(
        shard: impl Into<String>,
        file: &File,
    ) -> std::io::Result<(Vec<SampleSpan>, Option<ShardError>)> {
        let shard = shard.into();
        let len = file.metadata()?.len();
        let mut file = file;
        file.seek(SeekFrom::Start(0))?;
        let mut reader = ShardReader::new(shard.clone(), BufReader::with_capacity(4096, file));
        let seeking = reader
            .archive
            .entries_with_seek()
            .map_err(std::io::Error::other)
            .map(|entries| {
                let mut members = Members {
                    shard: &reader.shard,
                    read: &reader.read,
                    entries,
                    prev_end: 0,
                    last: None,
                };
                scan_members(&mut members)
            });
        if let Ok((spans, error, end)) = seeking
            && end <= len
        {
            tracing::debug!(target: "longshore::shards", shard = %shard, samples = spans.len(), damaged = error.is_some(), "scanned shard (seeking)");
            return Ok((spans, error));
        }
        file.seek(SeekFrom::Start(0))?;
        Ok(ShardReader::new(shard, BufReader::new(file)).scan_partial())
    }
}

/// The samples of `members` by their headers (see [`ShardReader::scan_partial`]), and the end
/// of the last member read.
fn scan_members<R: Read>(
    members: &mut Members<'_, R>,
) -> (Vec<SampleSpan>, Option<ShardError>, u64) {
    let mut spans: Vec<SampleSpan> = Vec::new();
    let mut exts: Vec<String> = Vec::new();
    let mut error = None;
    while let Some(member) = members.next_member(false) {
        let f = match member {
            Ok(Member::Field(f)) => f,
            Ok(Member::Skip) => continue,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        match spans.last_mut() {
            Some(last) if last.key == f.key => {
                if exts.contains(&f.ext) {
                    error = Some(duplicate(members.shard, last.offset, &f));
                    break;
                }
                last.end = f.end;
                last.members += 1;
                exts.push(f.ext);
            }
            _ => {
                spans.push(SampleSpan {
                    key: f.key,
                    offset: f.start,
                    end: f.end,
                    members: 1,
                });
                exts = vec![f.ext];
            }
        }
    }
    if error.is_some() {
        // The last sample may have more members in the damaged part: it is not whole.
        spans.pop();
    }
    (spans, error, members.prev_end)
}

/// Where a sample lies in its tar, from [`ShardReader::scan`]: `offset..end` holds all its
/// members (their headers, GNU long-name and pax headers included), so those bytes alone read
/// as a tar holding just this sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleSpan {
    /// The sample's key.
    pub key: String,
    /// Byte offset of its first member's first header.
    pub offset: u64,
    /// Byte offset just past its last member's data (padded to 512 bytes).
    pub end: u64,
    /// Members (fields) in the sample.
    pub members: u32,
}

struct Field {
    key: String,
    ext: String,
    name: String,
    header: u64,
    start: u64,
    end: u64,
    data: Vec<u8>,
}

enum Member {
    Skip,
    Field(Field),
}

fn duplicate(shard: &str, offset: u64, f: &Field) -> ShardError {
    ShardError::Sample {
        shard: shard.to_owned(),
        key: f.key.clone(),
        offset,
        reason: format!(
            "duplicate field .{} (member {:?} at byte {})",
            f.ext, f.name, f.header
        ),
    }
}

struct Members<'a, R: Read> {
    shard: &'a str,
    read: &'a AtomicU64,
    entries: tar::Entries<'a, Counting<R>>,
    prev_end: u64,
    /// The name of the last member read.
    last: Option<String>,
}

impl<R: Read> Members<'_, R> {
    fn next_member(&mut self, read_data: bool) -> Option<Result<Member, ShardError>> {
        let entry = match self.entries.next()? {
            Ok(entry) => entry,
            Err(e) => {
                // The header after the last member read is at fault (or that member's data
                // runs past the end): name that member.
                return Some(Err(ShardError::Tar {
                    shard: self.shard.to_owned(),
                    member: self.last.as_ref().map(|m| format!("after {m}")),
                    offset: self.read.load(Ordering::Relaxed),
                    reason: format!("corrupt or truncated tar: {e}"),
                }));
            }
        };
        let mut entry = entry;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        self.last = Some(name.clone());
        let header = entry.raw_header_position();
        let size = entry.size();
        let end = entry
            .raw_file_position()
            .saturating_add(size.div_ceil(512).saturating_mul(512));
        let start = std::mem::replace(&mut self.prev_end, end);
        let regular = matches!(
            entry.header().entry_type(),
            EntryType::Regular | EntryType::Continuous
        );
        let Some((key, ext)) = split_name(&name).filter(|_| regular && !is_meta(&name)) else {
            return Some(Ok(Member::Skip));
        };
        let (key, ext) = (key.to_owned(), ext.to_lowercase());
        let mut data = Vec::new();
        if read_data {
            data.reserve(size.min(1 << 20) as usize);
            let ended = |got: String| ShardError::Tar {
                shard: self.shard.to_owned(),
                member: Some(name.clone()),
                offset: header,
                reason: got,
            };
            match entry.read_to_end(&mut data) {
                Ok(n) if n as u64 == size => {}
                Ok(n) => {
                    return Some(Err(ended(format!(
                        "member ends early: {n} of {size} bytes"
                    ))));
                }
                Err(e) => return Some(Err(ended(format!("cannot read member data: {e}")))),
            }
        }
        Some(Ok(Member::Field(Field {
            key,
            ext,
            name,
            header,
            start,
            end,
            data,
        })))
    }
}

/// The samples of a shard, from [`ShardReader::samples`].
pub struct Samples<'a, R: Read> {
    members: Members<'a, R>,
    pending: Option<Sample>,
    done: bool,
}

impl<R: Read> std::fmt::Debug for Samples<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Samples")
            .field("shard", &self.members.shard)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<R: Read> Iterator for Samples<'_, R> {
    type Item = Result<Sample, ShardError>;

    fn next(&mut self) -> Option<Result<Sample, ShardError>> {
        while !self.done {
            let field = match self.members.next_member(true) {
                None => {
                    self.done = true;
                    return self.pending.take().map(Ok);
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Some(Ok(Member::Skip)) => continue,
                Some(Ok(Member::Field(f))) => f,
            };
            if let Some(p) = self.pending.as_mut()
                && p.key == field.key
            {
                if p.fields.contains_key(&field.ext) {
                    self.done = true;
                    return Some(Err(duplicate(self.members.shard, p.offset, &field)));
                }
                p.fields.insert(field.ext, field.data);
                continue;
            }
            let next = Sample {
                key: field.key,
                url: self.members.shard.to_owned(),
                offset: field.start,
                fields: BTreeMap::from([(field.ext, field.data)]),
            };
            if let Some(done) = self.pending.replace(next) {
                return Some(Ok(done));
            }
        }
        None
    }
}
