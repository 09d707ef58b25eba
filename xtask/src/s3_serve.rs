//! `cargo xtask s3-serve --dir D [--port P] [--bucket B] [--signed-only]`: serves directory
//! `D` as S3 bucket `B` on 127.0.0.1 until killed, for benchmarks and manual tests of
//! sharded datasets "from object storage" without a cloud account.
//!
//! The server is `s3s` (the S3 protocol, with real SigV4 checking) over `s3s-fs` (a directory
//! per bucket), as in longshore-shards' test server, with two changes for benchmarks:
//!
//! * **Reads are cheap.** s3s-fs computes an object's MD5 on every `GET` and `HEAD` of a file
//!   it did not upload itself (a 64 MiB shard read in 8 ranges is hashed 8 times) and streams
//!   bodies in 4 KiB chunks. `GetObject` and `HeadObject` are answered here instead: an ETag
//!   from the file's size and modification time (as nginx does; S3 clients do not check it
//!   against the body), bodies read in 1 MiB chunks with positioned reads, ranges, and
//!   `If-Match` / `If-None-Match`. Everything else (listing, uploads) is s3s-fs's.
//! * **Anyone may read** (unless `--signed-only`): unsigned `GET`, `HEAD` and listing requests
//!   are allowed, so `curl http://127.0.0.1:P/B/key` and webdataset's `pipe:curl` URLs work,
//!   while signed requests must carry the fixed test credentials (a wrong secret is refused)
//!   and writes must be signed.
//!
//! `D` is linked into a temporary root as `B` (s3s-fs serves a root's folders as buckets), so
//! the server's own metadata files stay out of `D`.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::access::{S3Access, S3AccessContext};
use s3s::dto::{
    AcceptRanges, ETag, ETagCondition, GetObjectInput, GetObjectOutput, HeadObjectInput,
    HeadObjectOutput, StreamingBlob, Timestamp,
};
use s3s::{S3, S3Request, S3Response, S3Result, s3_error};

/// The access key id the server accepts.
pub(crate) const ACCESS_KEY: &str = "longshore-test-key";
/// The secret key the server accepts.
pub(crate) const SECRET_KEY: &str = "longshore-test-secret-0123456789";
/// The region clients sign for (the server accepts any).
pub(crate) const REGION: &str = "us-east-1";

/// Bytes read from a file per body chunk.
const CHUNK: u64 = 1 << 20;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The directory to serve; its files are the bucket's objects (`D/a/b.tar` is key `a/b.tar`).
    #[arg(long)]
    dir: PathBuf,
    /// The port on 127.0.0.1 (0: any free port; the endpoint line says which).
    #[arg(long, default_value_t = 9000)]
    port: u16,
    /// The bucket's name.
    #[arg(long, default_value = "shards")]
    bucket: String,
    /// Refuse unsigned requests (by default anyone may GET, HEAD and list).
    #[arg(long)]
    signed_only: bool,
    /// Delay every `GET` by this many milliseconds before answering (an object store's
    /// first-byte latency, for benchmarks).
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
}

/// Runs the server until the process is killed.
pub(crate) fn run(args: Args) -> Result<()> {
    let bucket = args.bucket;
    anyhow::ensure!(
        (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'),
        "bucket name {bucket:?}: 3 to 63 lowercase letters, digits, '-' or '.'"
    );
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("--dir {}", args.dir.display()))?;
    anyhow::ensure!(dir.is_dir(), "--dir {} is not a directory", dir.display());
    let root = tempfile::Builder::new()
        .prefix("longshore-s3-serve-")
        .tempdir()
        .context("creating the server's root")?;
    link_dir(&dir, &root.path().join(&bucket))?;
    let fs = s3s_fs::FileSystem::new(root.path())
        .map_err(|e| anyhow::anyhow!("s3s-fs over the server's root: {e:?}"))?;
    let service = {
        let mut b = s3s::service::S3ServiceBuilder::new(Served {
            fs,
            root: root.path().to_owned(),
            latency: std::time::Duration::from_millis(args.latency_ms),
        });
        b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        b.set_access(ReadAccess {
            anonymous_reads: !args.signed_only,
        });
        b.build()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("s3-serve")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
            .await
            .with_context(|| format!("binding 127.0.0.1:{}", args.port))?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        // The first line is for programs that start the server (the port may be chosen here).
        println!("endpoint: {endpoint}");
        println!("bucket: {bucket} (serving {})", dir.display());
        println!("credentials: access key {ACCESS_KEY}, secret key {SECRET_KEY}");
        if args.signed_only {
            println!("unsigned requests are refused");
        } else {
            println!("anonymous reads: curl {endpoint}/{bucket}/KEY");
        }
        println!("export AWS_ENDPOINT_URL={endpoint} S3_ENDPOINT_URL={endpoint}");
        println!("export AWS_ACCESS_KEY_ID={ACCESS_KEY} AWS_SECRET_ACCESS_KEY={SECRET_KEY}");
        println!("export AWS_REGION={REGION} AWS_DEFAULT_REGION={REGION} AWS_ALLOW_HTTP=true");
        println!("serving s3://{bucket}/ until killed");
        let http = ConnBuilder::new(TokioExecutor::new());
        let mut stop = std::pin::pin!(stopped());
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = &mut stop => return Ok::<_, anyhow::Error>(()),
            };
            let (socket, _) = match accepted {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("s3-serve: accept failed: {e}");
                    continue;
                }
            };
            let _ = socket.set_nodelay(true);
            let conn = http
                .serve_connection(TokioIo::new(socket), service.clone())
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    })
}

/// Resolves on Ctrl-C or SIGTERM, so that the server returns and its temporary root (the
/// link to the directory, s3s-fs's metadata) is removed.
async fn stopped() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(unix)]
fn link_dir(dir: &Path, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(dir, link)
        .with_context(|| format!("linking {} to {}", link.display(), dir.display()))
}

#[cfg(not(unix))]
fn link_dir(_: &Path, _: &Path) -> Result<()> {
    anyhow::bail!("s3-serve links the directory into its root: unix only")
}

/// Signed requests may do anything; unsigned ones may only read, when allowed.
#[derive(Debug)]
struct ReadAccess {
    anonymous_reads: bool,
}

#[async_trait::async_trait]
impl S3Access for ReadAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_some() {
            return Ok(());
        }
        let read = matches!(
            cx.s3_op().name(),
            "GetObject"
                | "HeadObject"
                | "HeadBucket"
                | "ListObjects"
                | "ListObjectsV2"
                | "ListBuckets"
                | "GetBucketLocation"
        );
        if self.anonymous_reads && read {
            Ok(())
        } else {
            Err(s3_error!(AccessDenied, "Signature is required"))
        }
    }
}

/// s3s-fs with `GetObject` and `HeadObject` answered from the file directly.
struct Served {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
    /// The delay before each `GET` is answered.
    latency: std::time::Duration,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// What a read needs to know about an object.
struct Object {
    path: PathBuf,
    len: u64,
    modified: std::time::SystemTime,
    etag: ETag,
}

impl Served {
    /// The object's file, refusing keys that leave the bucket.
    async fn object(&self, bucket: &str, key: &str) -> S3Result<Object> {
        let bucket_dir = self.root.join(bucket);
        if bucket.contains('/') || !bucket_dir.is_dir() {
            return Err(s3_error!(NoSuchBucket));
        }
        let rel = Path::new(key);
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(s3_error!(NoSuchKey));
        }
        let path = bucket_dir.join(rel);
        let meta = match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_file() => m,
            _ => return Err(s3_error!(NoSuchKey)),
        };
        let modified = meta.modified().unwrap_or(UNIX_EPOCH);
        let nanos = modified
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Ok(Object {
            path,
            len: meta.len(),
            modified,
            etag: ETag::Strong(format!("{nanos:x}-{:x}", meta.len())),
        })
    }
}

/// `If-Match` / `If-None-Match` against the object's ETag.
fn preconditions(
    etag: &ETag,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    let matches = |c: &ETagCondition| match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == etag.value(),
    };
    if if_match.is_some_and(|c| !matches(c)) {
        return Err(s3_error!(PreconditionFailed));
    }
    if if_none_match.is_some_and(matches) {
        return Err(s3_error!(NotModified));
    }
    Ok(())
}

/// `path`'s bytes `start..end`, in chunks of [`CHUNK`] read on the blocking pool.
#[cfg(unix)]
fn body(path: PathBuf, start: u64, end: u64) -> S3Result<StreamingBlob> {
    use std::os::unix::fs::FileExt;
    let file = Arc::new(std::fs::File::open(&path).map_err(|e| s3_error!(e, NoSuchKey))?);
    let stream = futures_util::stream::try_unfold(start, move |pos| {
        let file = Arc::clone(&file);
        async move {
            if pos >= end {
                return Ok(None);
            }
            let n = (end - pos).min(CHUNK);
            let chunk = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0; n as usize];
                file.read_exact_at(&mut buf, pos).map(|()| Bytes::from(buf))
            })
            .await
            .map_err(std::io::Error::other)??;
            Ok::<_, std::io::Error>(Some((chunk, pos + n)))
        }
    });
    Ok(StreamingBlob::wrap(stream))
}

#[cfg(not(unix))]
fn body(_: PathBuf, _: u64, _: u64) -> S3Result<StreamingBlob> {
    Err(s3_error!(NotImplemented))
}

/// `impl S3 for Served`: reads answered here, the listed operations delegated to s3s-fs.
/// (One macro around the whole impl, so that `async_trait` sees the generated methods.)
macro_rules! impl_s3 {
    ($($op:ident: $input:ident => $output:ident),* $(,)?) => {
        #[async_trait::async_trait]
        impl S3 for Served {
            async fn get_object(
                &self,
                req: S3Request<GetObjectInput>,
            ) -> S3Result<S3Response<GetObjectOutput>> {
                self.get(req.input).await
            }

            async fn head_object(
                &self,
                req: S3Request<HeadObjectInput>,
            ) -> S3Result<S3Response<HeadObjectOutput>> {
                self.head(req.input).await
            }

            $(
                async fn $op(
                    &self,
                    req: S3Request<s3s::dto::$input>,
                ) -> S3Result<S3Response<s3s::dto::$output>> {
                    self.fs.$op(req).await
                }
            )*
        }
    };
}

impl_s3! {
    list_buckets: ListBucketsInput => ListBucketsOutput,
    head_bucket: HeadBucketInput => HeadBucketOutput,
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput,
    list_objects: ListObjectsInput => ListObjectsOutput,
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output,
    put_object: PutObjectInput => PutObjectOutput,
    copy_object: CopyObjectInput => CopyObjectOutput,
    delete_object: DeleteObjectInput => DeleteObjectOutput,
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput,
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput,
    upload_part: UploadPartInput => UploadPartOutput,
    list_parts: ListPartsInput => ListPartsOutput,
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput,
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput,
}

impl Served {
    async fn get(&self, input: GetObjectInput) -> S3Result<S3Response<GetObjectOutput>> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let obj = self.object(&input.bucket, &input.key).await?;
        preconditions(
            &obj.etag,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
        )?;
        let range = match &input.range {
            Some(r) => r.check(obj.len)?,
            None => 0..obj.len,
        };
        let content_range = input.range.as_ref().map(|_| {
            format!(
                "bytes {}-{}/{}",
                range.start,
                range.end.saturating_sub(1),
                obj.len
            )
        });
        let output = GetObjectOutput {
            body: Some(body(obj.path, range.start, range.end)?),
            content_length: Some(i64::try_from(range.end - range.start).unwrap_or(i64::MAX)),
            content_range,
            accept_ranges: Some(AcceptRanges::from("bytes".to_owned())),
            last_modified: Some(Timestamp::from(obj.modified)),
            e_tag: Some(obj.etag),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn head(&self, input: HeadObjectInput) -> S3Result<S3Response<HeadObjectOutput>> {
        let obj = self.object(&input.bucket, &input.key).await?;
        preconditions(
            &obj.etag,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
        )?;
        let output = HeadObjectOutput {
            content_length: Some(i64::try_from(obj.len).unwrap_or(i64::MAX)),
            accept_ranges: Some(AcceptRanges::from("bytes".to_owned())),
            last_modified: Some(Timestamp::from(obj.modified)),
            e_tag: Some(obj.etag),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }
}
