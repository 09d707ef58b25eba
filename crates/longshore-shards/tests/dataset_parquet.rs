//! Parquet shards against the in-process S3 server: row counts from the footers (range
//! requests, with faults injected), every row of an epoch exactly once over 2 ranks x 2
//! workers, columns as sample fields (Hugging Face's image struct, integers, text, nulls)
//! across snappy, zstd, gzip and uncompressed files of several row groups, and a file that
//! is not Parquet named in the error.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::builder::{BinaryBuilder, StringBuilder};
use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch, StructArray};
use arrow_schema::{DataType, Field, Fields};
use longshore_data::{IterableDataset, WorkerInfo};
use longshore_loader::DataLoader;
use longshore_shards::ShardError;
use longshore_shards::dataset::{CountSource, ShardSample, ShardedDataset};
use longshore_shards::store::{Fault, FaultyStore, RetryPolicy};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;
use support::s3::S3Server;

/// Rows per file.
const ROWS: [u64; 4] = [23, 17, 1, 30];

/// The image bytes of global row `g` (distinct per row).
fn image(g: u64) -> Vec<u8> {
    let mut v = vec![0xFF, 0xD8];
    v.extend((0..(g % 7 + 3)).map(|k| (g * 31 + k) as u8));
    v
}

/// A file of `rows` rows starting at global row `first`: `image` (struct<bytes, path>, as
/// Hugging Face writes its Image feature), `label` (int64), `text` (utf8) and `score`
/// (float32, null on every third row).
fn parquet_file(first: u64, rows: u64, compression: Compression) -> Vec<u8> {
    let mut bytes = BinaryBuilder::new();
    let mut paths = StringBuilder::new();
    let mut text = StringBuilder::new();
    for g in first..first + rows {
        bytes.append_value(image(g));
        paths.append_value(format!("img{g}.jpg"));
        text.append_value(format!("row {g}"));
    }
    let image_fields = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let image = StructArray::new(
        image_fields,
        vec![
            Arc::new(bytes.finish()) as ArrayRef,
            Arc::new(paths.finish()) as ArrayRef,
        ],
        None,
    );
    let label = Int64Array::from_iter_values((first..first + rows).map(|g| g as i64));
    let score: Float32Array = (first..first + rows)
        .map(|g| (g % 3 != 0).then_some(g as f32 / 2.0))
        .collect();
    let batch = RecordBatch::try_from_iter([
        ("image", Arc::new(image) as ArrayRef),
        ("label", Arc::new(label) as ArrayRef),
        ("text", Arc::new(text.finish()) as ArrayRef),
        ("score", Arc::new(score) as ArrayRef),
    ])
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(8)) // several row groups per file
        .build();
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    out
}

fn upload(server: &S3Server) -> u64 {
    let codecs = [
        Compression::SNAPPY,
        Compression::ZSTD(ZstdLevel::default()),
        Compression::UNCOMPRESSED,
        Compression::GZIP(GzipLevel::default()),
    ];
    let mut first = 0;
    for (i, (&rows, codec)) in ROWS.iter().zip(codecs).enumerate() {
        server.put(
            &format!("hf/train-{i:05}-of-00004.parquet"),
            &parquet_file(first, rows, codec),
        );
        first += rows;
    }
    first
}

fn check_fields(s: &ShardSample) -> u64 {
    let g = s.int("label").unwrap() as u64;
    assert_eq!(s.get("image").unwrap(), image(g).as_slice(), "row {g}");
    assert_eq!(s.sample.text("text").unwrap(), format!("row {g}"));
    match s.get("score") {
        None => assert_eq!(g % 3, 0, "score of row {g} is null"),
        Some(v) => assert_eq!(
            std::str::from_utf8(v).unwrap(),
            (g as f32 / 2.0).to_string()
        ),
    }
    g
}

#[test]
fn every_row_once_over_ranks_and_workers_with_faults_on_the_footers() {
    let server = support::s3::start();
    let total = upload(&server);
    let url = server.url("hf/train-{00000..00003}-of-00004.parquet");
    let cache = tempfile::tempdir().unwrap();
    // Every footer read meets a fault first: 5xx, 429, a timeout, a cut body.
    let wrappers: Arc<std::sync::Mutex<Vec<Arc<FaultyStore>>>> = Arc::default();
    let plan = [
        Fault::InternalError,
        Fault::SlowDown,
        Fault::Timeout,
        Fault::CutBody { after: 3 },
    ];
    let store = server
        .store_builder()
        .retry(RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            stall_timeout: Duration::from_millis(200),
        })
        .wrap_stores({
            let wrappers = Arc::clone(&wrappers);
            move |_, inner| {
                let f = Arc::new(FaultyStore::with_plan(
                    inner,
                    [None].into_iter().chain(plan.map(Some)),
                ));
                wrappers.lock().unwrap().push(Arc::clone(&f));
                f
            }
        })
        .build();
    let spec = ShardedDataset::parquet([url.clone()])
        .store(store)
        .rank(0)
        .world_size(1)
        .cache_dir(cache.path().join("spec"))
        .build()
        .unwrap()
        .spec()
        .clone();
    assert_eq!(spec.counts, ROWS);
    let injected: u64 = wrappers
        .lock()
        .unwrap()
        .iter()
        .map(|f| f.stats().injected)
        .sum();
    assert_eq!(
        injected, 4,
        "every fault of the plan met a footer read and was retried"
    );
    assert!(
        spec.counted_by
            .iter()
            .all(|c| *c == CountSource::ParquetFooter)
    );
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    let mut per_rank = Vec::new();
    for rank in 0..2 {
        let ds = ShardedDataset::from_spec(spec.clone())
            .store(server.store_builder().build())
            .seed(9)
            .shuffle_block(20)
            .rank(rank)
            .world_size(2)
            .cache_dir(cache.path().join("c"))
            .build()
            .unwrap();
        let loader = DataLoader::iterable(
            ds.clone()
                .decode_with(|s| Ok((check_fields(s) as i64, u8::from(s.pad)))),
        )
        .batch_size(3)
        .num_workers(2)
        .build()
        .unwrap();
        loader.set_epoch(1);
        let mut n = 0;
        for batch in loader.iter() {
            let batch = batch.unwrap();
            n += batch.batch_size();
        }
        per_rank.push(n);
        // The same samples, one worker, outside the loader: the fields and the pads.
        for s in ds.iter(WorkerInfo::single(0)) {
            let s = s.unwrap();
            let g = check_fields(&s);
            if !s.pad {
                *seen.entry(g).or_default() += 1;
            }
        }
    }
    assert_eq!(per_rank[0], per_rank[1]);
    assert_eq!(seen.len() as u64, total);
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
}

#[test]
fn a_file_that_is_not_parquet_is_named() {
    let server = support::s3::start();
    upload(&server);
    server.put(
        "hf/train-00004-of-00004.parquet",
        b"not parquet at all, just text....",
    );
    let err = ShardedDataset::parquet([server.url("hf/train-{00000..00004}-of-00004.parquet")])
        .store(server.store_builder().build())
        .rank(0)
        .world_size(1)
        .cache_dir(tempfile::tempdir().unwrap().path())
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ShardError::Parquet { .. }), "{err:?}");
    assert!(text.contains("train-00004-of-00004.parquet"), "{text}");
}

#[test]
fn a_file_replaced_after_resolution_is_an_error_item_naming_it() {
    let server = support::s3::start();
    upload(&server);
    let cache = tempfile::tempdir().unwrap();
    let ds = ShardedDataset::parquet([server.url("hf/train-{00000..00003}-of-00004.parquet")])
        .store(server.store_builder().build())
        .shuffle(false)
        .rank(0)
        .world_size(1)
        .cache_dir(cache.path())
        .build()
        .unwrap();
    // The first file replaced by another one (of other rows and size) after resolution.
    server.put(
        "hf/train-00000-of-00004.parquet",
        &parquet_file(0, 5, Compression::SNAPPY),
    );
    let first = ds.iter(WorkerInfo::single(0)).next().unwrap();
    let err = first.unwrap_err();
    let text = support::data::chain(&err);
    assert!(text.contains("train-00000-of-00004.parquet"), "{text}");
}
