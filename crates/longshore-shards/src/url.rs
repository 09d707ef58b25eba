//! Shard URLs as users write them: brace patterns such as
//! `s3://bucket/train/shard-{000000..000999}.tar` expanded the way WebDataset's
//! `braceexpand` does, then each URL split into the store it lives in ([`StoreLocation`]) and
//! the object's path there.
//!
//! Everything here is pure (no I/O, no environment), so it can be fuzzed and property-tested.
//!
//! Supported forms:
//!
//! | URL | store | object path |
//! | --- | --- | --- |
//! | `s3://bucket/key`, `s3a://bucket/key` | S3 or an S3-compatible store | `key`, verbatim |
//! | `gs://bucket/key`, `gcs://bucket/key` | Google Cloud Storage | `key`, verbatim |
//! | `az://container/key`, `azure://container/key` | Azure Blob Storage (account from the environment) | `key`, verbatim |
//! | `abfs[s]://container@account.dfs.core.windows.net/key` | Azure, that account | `key`, verbatim |
//! | `http://host[:port]/path`, `https://…` | plain HTTP(S) `GET`s | `path`, percent-decoded |
//! | `file:///abs/path` | local files | `/abs/path`, percent-decoded |
//! | `/abs/path`, `rel/path` | local files | the path as written |
//!
//! Several patterns are given as a list (a slice), not joined with `::` as WebDataset does:
//! `::` occurs in IPv6 hosts (`http://[::1]:9000/…`).
//!
//! Brace syntax (as `braceexpand`): `{a,b,c}` lists (which may nest and hold ranges),
//! `{0..9}` and `{000..999}` integer ranges (zero padding kept: if either end has a leading
//! zero, every number is padded to the longer end's width), `{1..9..2}` with a step,
//! `{a..e}` letter ranges, several braces in one URL (the leftmost varies slowest), and `\`
//! escaping the next character. Unlike `braceexpand`, a brace group with neither `,` nor `..`
//! (such as `{x}` or `{}`) is an error rather than kept literally: in a shard URL it is
//! almost certainly a mistake.

use serde::{Deserialize, Serialize};

use crate::ShardError;

/// The most URLs one call to [`expand_braces`] or [`expand_patterns`] may produce. A pattern
/// that would expand to more is an error, found before anything is allocated.
pub const MAX_EXPANSION: usize = 10_000_000;

/// Expands the braces of one URL pattern into the URLs it stands for, in order.
///
/// ```
/// use longshore_shards::url::expand_braces;
/// let urls = expand_braces("s3://b/shard-{008..011}.{tar,idx}").unwrap();
/// assert_eq!(urls[0], "s3://b/shard-008.tar");
/// assert_eq!(urls[1], "s3://b/shard-008.idx");
/// assert_eq!(urls.len(), 8);
/// ```
///
/// # Errors
///
/// [`ShardError::Pattern`] naming the pattern and the byte position of an unbalanced brace, a
/// group that is neither a list nor a range, a number out of range, a trailing `\`, or an
/// expansion larger than [`MAX_EXPANSION`].
pub fn expand_braces(pattern: &str) -> Result<Vec<String>, ShardError> {
    let seq = Parser {
        pattern,
        pos: 0,
        depth: 0,
    }
    .sequence(false)?;
    let count = seq_count(&seq);
    if count > MAX_EXPANSION as u128 {
        return Err(pattern_error(
            pattern,
            0,
            format!("expands to {count} urls, more than the limit of {MAX_EXPANSION}"),
        ));
    }
    let mut out = Vec::with_capacity(count as usize);
    expand_seq(&seq, String::new(), &mut out);
    Ok(out)
}

/// Expands several patterns, one after the other, into one list of URLs.
///
/// # Errors
///
/// The first pattern's error, as [`expand_braces`]; or [`ShardError::Pattern`] if all
/// patterns together expand to more than [`MAX_EXPANSION`] URLs.
pub fn expand_patterns<S: AsRef<str>>(patterns: &[S]) -> Result<Vec<String>, ShardError> {
    let mut out = Vec::new();
    for p in patterns {
        let p = p.as_ref();
        let urls = expand_braces(p)?;
        if out.len() + urls.len() > MAX_EXPANSION {
            return Err(pattern_error(
                p,
                0,
                format!("the patterns together expand to more than {MAX_EXPANSION} urls"),
            ));
        }
        out.extend(urls);
    }
    Ok(out)
}

fn pattern_error(pattern: &str, position: usize, reason: String) -> ShardError {
    ShardError::Pattern {
        pattern: pattern.to_owned(),
        position,
        reason,
    }
}

/// One piece of a parsed pattern.
#[derive(Debug)]
enum Node {
    Literal(String),
    /// Alternatives, each a sequence; one of them stands in the result.
    Alternatives(Vec<Vec<Node>>),
    /// The members of a range, already formatted.
    Range(Vec<String>),
}

/// How deeply brace groups may nest.
const MAX_DEPTH: usize = 32;

struct Parser<'a> {
    pattern: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.pattern[self.pos..]
    }

    /// Parses up to the end of the pattern or, inside a group, up to (not past) the next
    /// top-level `,` or `}`.
    fn sequence(&mut self, in_group: bool) -> Result<Vec<Node>, ShardError> {
        let mut seq = Vec::new();
        let mut lit = String::new();
        while let Some(c) = self.rest().chars().next() {
            match c {
                '\\' => {
                    let start = self.pos;
                    self.pos += 1;
                    let Some(next) = self.rest().chars().next() else {
                        return Err(pattern_error(self.pattern, start, "trailing '\\'".into()));
                    };
                    lit.push(next);
                    self.pos += next.len_utf8();
                }
                '{' => {
                    if !lit.is_empty() {
                        seq.push(Node::Literal(std::mem::take(&mut lit)));
                    }
                    seq.push(self.group()?);
                }
                '}' | ',' if in_group => break,
                '}' => {
                    return Err(pattern_error(
                        self.pattern,
                        self.pos,
                        "'}' without a matching '{'".into(),
                    ));
                }
                _ => {
                    lit.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
        if !lit.is_empty() {
            seq.push(Node::Literal(lit));
        }
        Ok(seq)
    }

    /// Parses a group starting at `{`, through its matching `}`.
    fn group(&mut self) -> Result<Node, ShardError> {
        let open = self.pos;
        if self.depth >= MAX_DEPTH {
            return Err(pattern_error(
                self.pattern,
                open,
                format!("brace groups nest deeper than {MAX_DEPTH}"),
            ));
        }
        self.pos += 1;
        // A range is recognised on the raw text up to the first `}`.
        if let Some(end) = self.rest().find('}') {
            let body = &self.rest()[..end];
            if body.contains("..") && !body.contains([',', '{', '\\']) {
                let members = range(body).map_err(|reason| {
                    pattern_error(self.pattern, open, format!("range {{{body}}}: {reason}"))
                })?;
                self.pos += end + 1;
                return Ok(Node::Range(members));
            }
        }
        self.depth += 1;
        let mut alternatives = vec![self.sequence(true)?];
        loop {
            match self.rest().chars().next() {
                Some(',') => {
                    self.pos += 1;
                    alternatives.push(self.sequence(true)?);
                }
                Some('}') => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    return Err(pattern_error(
                        self.pattern,
                        open,
                        "'{' without a matching '}'".into(),
                    ));
                }
            }
        }
        self.depth -= 1;
        if alternatives.len() < 2 {
            return Err(pattern_error(
                self.pattern,
                open,
                "a brace group needs a ',' list or a '..' range".into(),
            ));
        }
        Ok(Node::Alternatives(alternatives))
    }
}

/// The letters a letter range runs over, in `braceexpand`'s order.
const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Expands the body of a `{left..right[..step]}` group.
fn range(body: &str) -> Result<Vec<String>, String> {
    let parts: Vec<&str> = body.split("..").collect();
    let (left, right, step) = match parts[..] {
        [l, r] => (l, r, None),
        [l, r, s] => (l, r, Some(s)),
        _ => return Err("expected {a..b} or {a..b..step}".into()),
    };
    let step = match step {
        None => 1,
        Some(s) => s
            .parse::<i64>()
            .map_err(|_| format!("step {s:?} is not an integer"))?
            .unsigned_abs()
            .max(1),
    };
    let is_letter = |s: &str| s.len() == 1 && s.chars().all(|c| c.is_ascii_alphabetic());
    if is_letter(left) && is_letter(right) {
        let (a, b) = (ALPHABET.find(left), ALPHABET.find(right));
        let (Some(a), Some(b)) = (a, b) else {
            unreachable!("ascii letters are in the alphabet")
        };
        return Ok(stepped(a as i64, b as i64, step, MAX_EXPANSION as u64)?
            .map(|i| ALPHABET[i as usize..=i as usize].to_owned())
            .collect());
    }
    let number = |s: &str| {
        let digits = s.strip_prefix('-').unwrap_or(s);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{s:?} is neither an integer nor a single letter"));
        }
        s.parse::<i64>()
            .map_err(|_| format!("{s:?} does not fit in 64 bits"))
    };
    let (a, b) = (number(left)?, number(right)?);
    let padded = |s: &str| s != "0" && s != "-0" && (s.starts_with('0') || s.starts_with("-0"));
    let width = if padded(left) || padded(right) {
        left.len().max(right.len())
    } else {
        0
    };
    Ok(stepped(a, b, step, MAX_EXPANSION as u64)?
        .map(|i| format!("{i:0width$}"))
        .collect())
}

/// `a, a±step, …` up to and including `b` when reached exactly, in the direction of `b`.
fn stepped(a: i64, b: i64, step: u64, limit: u64) -> Result<impl Iterator<Item = i64>, String> {
    let span = a.abs_diff(b);
    let count = (span / step).saturating_add(1);
    if count > limit {
        return Err(format!("{count} members, more than the limit of {limit}"));
    }
    let down = b < a;
    Ok((0..count).map(move |k| {
        let off = i128::from(k) * i128::from(step);
        let v = if down {
            i128::from(a) - off
        } else {
            i128::from(a) + off
        };
        // In range: every member lies between a and b.
        v as i64
    }))
}

fn node_count(node: &Node) -> u128 {
    match node {
        Node::Literal(_) => 1,
        Node::Range(m) => m.len() as u128,
        Node::Alternatives(alts) => alts
            .iter()
            .map(|s| seq_count(s))
            .fold(0u128, u128::saturating_add),
    }
}

fn seq_count(seq: &[Node]) -> u128 {
    seq.iter().map(node_count).fold(1u128, |acc, n| {
        acc.saturating_mul(n).min(u128::from(u64::MAX))
    })
}

fn expand_seq(seq: &[Node], prefix: String, out: &mut Vec<String>) {
    let Some((first, rest)) = seq.split_first() else {
        out.push(prefix);
        return;
    };
    match first {
        Node::Literal(s) => expand_seq(rest, prefix + s, out),
        Node::Range(members) => {
            for m in members {
                expand_seq(rest, prefix.clone() + m, out);
            }
        }
        Node::Alternatives(alts) => {
            for alt in alts {
                let mut heads = Vec::new();
                expand_seq(alt, prefix.clone(), &mut heads);
                for head in heads {
                    expand_seq(rest, head, out);
                }
            }
        }
    }
}

/// The store an object lives in. URLs with equal locations share one client.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StoreLocation {
    /// An S3 bucket (or a bucket of an S3-compatible store, given an endpoint override).
    S3 {
        /// The bucket's name.
        bucket: String,
    },
    /// A Google Cloud Storage bucket.
    Gcs {
        /// The bucket's name.
        bucket: String,
    },
    /// An Azure Blob Storage container.
    Azure {
        /// The storage account, when the URL names it (`abfs://container@account.…`);
        /// otherwise the environment's (`AZURE_STORAGE_ACCOUNT_NAME`).
        account: Option<String>,
        /// The container's name.
        container: String,
    },
    /// A plain HTTP(S) server, named by scheme, host and port (`https://host:8443`).
    Http {
        /// `scheme://authority`, without a trailing slash.
        base: String,
    },
    /// The local file system.
    Local,
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::S3 { bucket } => write!(f, "s3://{bucket}"),
            Self::Gcs { bucket } => write!(f, "gs://{bucket}"),
            Self::Azure {
                account: Some(a),
                container,
            } => write!(f, "abfs://{container}@{a}"),
            Self::Azure {
                account: None,
                container,
            } => write!(f, "az://{container}"),
            Self::Http { base } => f.write_str(base),
            Self::Local => f.write_str("file://"),
        }
    }
}

/// One (expanded) shard URL: where the object lives and its path there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardUrl {
    url: String,
    location: StoreLocation,
    path: String,
}

impl ShardUrl {
    /// Parses one URL (with no braces left; see [`expand_braces`]).
    ///
    /// ```
    /// use longshore_shards::url::{ShardUrl, StoreLocation};
    /// let u = ShardUrl::parse("s3://bucket/train/shard-000001.tar").unwrap();
    /// assert_eq!(u.location(), &StoreLocation::S3 { bucket: "bucket".into() });
    /// assert_eq!(u.path(), "train/shard-000001.tar");
    /// ```
    ///
    /// # Errors
    ///
    /// [`ShardError::Url`] naming the URL: an unknown scheme, a missing bucket or host, a
    /// query string or fragment on an HTTP URL, a `file://` URL naming another host, or an
    /// empty URL.
    pub fn parse(url: &str) -> Result<Self, ShardError> {
        let err = |reason: &str| ShardError::Url {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if url.is_empty() {
            return Err(err("the url is empty"));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            // A local path as written.
            return Ok(Self {
                url: url.to_owned(),
                location: StoreLocation::Local,
                path: url.to_owned(),
            });
        };
        let scheme = scheme.to_ascii_lowercase();
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_err = || err("the url names no bucket or container");
        let location = match scheme.as_str() {
            "s3" | "s3a" if !authority.is_empty() => StoreLocation::S3 {
                bucket: authority.to_owned(),
            },
            "gs" | "gcs" if !authority.is_empty() => StoreLocation::Gcs {
                bucket: authority.to_owned(),
            },
            "az" | "azure" if !authority.is_empty() => StoreLocation::Azure {
                account: None,
                container: authority.to_owned(),
            },
            "abfs" | "abfss" => {
                let Some((container, host)) = authority.split_once('@') else {
                    return Err(err(
                        "expected abfs://container@account.dfs.core.windows.net/…",
                    ));
                };
                let account = host.split('.').next().unwrap_or_default();
                if container.is_empty() || account.is_empty() {
                    return Err(bucket_err());
                }
                StoreLocation::Azure {
                    account: Some(account.to_owned()),
                    container: container.to_owned(),
                }
            }
            "http" | "https" => {
                if authority.is_empty() {
                    return Err(err("the url names no host"));
                }
                if url.contains(['?', '#']) {
                    return Err(err("query strings and fragments are not supported"));
                }
                let path = percent_decode(path).map_err(|r| err(&r))?;
                return Ok(Self {
                    url: url.to_owned(),
                    location: StoreLocation::Http {
                        base: format!("{scheme}://{authority}"),
                    },
                    path,
                });
            }
            "file" => {
                if !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost")) {
                    return Err(err("a file:// url must name no host (file:///path)"));
                }
                let path = percent_decode(path).map_err(|r| err(&r))?;
                return Ok(Self {
                    url: url.to_owned(),
                    location: StoreLocation::Local,
                    path: format!("/{path}"),
                });
            }
            "s3" | "s3a" | "gs" | "gcs" | "az" | "azure" => return Err(bucket_err()),
            _ => {
                return Err(err(
                    "unknown scheme (expected s3, gs, az, abfs, http, https or file)",
                ));
            }
        };
        Ok(Self {
            url: url.to_owned(),
            location,
            path: path.to_owned(),
        })
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The store the object lives in.
    pub fn location(&self) -> &StoreLocation {
        &self.location
    }

    /// The object's path in its store: the key in a bucket, the path on an HTTP server
    /// (percent-decoded, without the leading `/`), or the local file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether the URL names a prefix (ends with `/`, or names only a bucket) rather than one
    /// object.
    pub fn is_prefix(&self) -> bool {
        self.path.is_empty() || self.path.ends_with('/')
    }

    /// The last segment of the path: the shard's file name (empty for a prefix).
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }
}

impl std::fmt::Display for ShardUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// Decodes `%XX` escapes; the result must be UTF-8.
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent escapes do not decode to utf-8".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(p: &str) -> Vec<String> {
        expand_braces(p).unwrap()
    }

    #[test]
    fn braceexpand_examples() {
        assert_eq!(ex("plain"), ["plain"]);
        assert_eq!(ex("a{1,2}b"), ["a1b", "a2b"]);
        assert_eq!(ex("{1..3}"), ["1", "2", "3"]);
        assert_eq!(ex("{3..1}"), ["3", "2", "1"]);
        assert_eq!(ex("{08..11}"), ["08", "09", "10", "11"]);
        assert_eq!(ex("{8..011}"), ["008", "009", "010", "011"]);
        assert_eq!(ex("{1..7..3}"), ["1", "4", "7"]);
        assert_eq!(ex("{1..8..3}"), ["1", "4", "7"]);
        assert_eq!(ex("{-1..1}"), ["-1", "0", "1"]);
        assert_eq!(ex("{-01..1}"), ["-01", "000", "001"]);
        assert_eq!(ex("{a..c}"), ["a", "b", "c"]);
        assert_eq!(ex("{Y..b}"), ["Y", "Z", "a", "b"]);
        assert_eq!(ex("{a,b}{1,2}"), ["a1", "a2", "b1", "b2"]);
        assert_eq!(ex("x{a,{1..2}c}y"), ["xay", "x1cy", "x2cy"]);
        assert_eq!(ex("{a,}"), ["a", ""]);
        assert_eq!(ex(r"a\{b\}c\,"), ["a{b}c,"]);
        assert_eq!(ex("a,b"), ["a,b"]);
    }

    #[test]
    fn errors_name_the_position() {
        let pos = |p: &str| match expand_braces(p) {
            Err(ShardError::Pattern { position, .. }) => position,
            other => panic!("{p}: {other:?}"),
        };
        assert_eq!(pos("s3://b/{1..2"), 7);
        assert_eq!(pos("s3://b/x}"), 8);
        assert_eq!(pos("ab{x}"), 2);
        assert_eq!(pos("ab{}"), 2);
        assert_eq!(pos("{1..x}"), 0);
        assert_eq!(pos("ab\\"), 2);
        assert_eq!(pos("{0..99999}{0..99999}"), 0);
        let msg = expand_braces("s3://b/{1..2").unwrap_err().to_string();
        assert!(
            msg.contains("s3://b/{1..2") && msg.contains("byte 7"),
            "{msg}"
        );
    }

    #[test]
    fn parses_each_scheme() {
        let p = |u: &str| ShardUrl::parse(u).unwrap();
        assert_eq!(
            p("gs://b/k").location(),
            &StoreLocation::Gcs { bucket: "b".into() }
        );
        assert_eq!(
            p("abfss://c@acct.dfs.core.windows.net/a/b").location(),
            &StoreLocation::Azure {
                account: Some("acct".into()),
                container: "c".into()
            }
        );
        assert_eq!(p("az://c/k").path(), "k");
        let h = p("http://[::1]:9000/d/a%20b.tar");
        assert_eq!(
            h.location(),
            &StoreLocation::Http {
                base: "http://[::1]:9000".into()
            }
        );
        assert_eq!(h.path(), "d/a b.tar");
        assert_eq!(h.file_name(), "a b.tar");
        assert_eq!(p("file:///tmp/x.tar").path(), "/tmp/x.tar");
        assert_eq!(p("data/x.tar").location(), &StoreLocation::Local);
        assert!(p("s3://b/prefix/").is_prefix());
        assert!(p("s3://b").is_prefix());
        for bad in [
            "",
            "s3:///k",
            "ftp://h/x",
            "http://h/x?sig=1",
            "file://host/x",
        ] {
            assert!(ShardUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
