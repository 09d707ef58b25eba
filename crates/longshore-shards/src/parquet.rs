//! Parquet shards (what Hugging Face datasets store): each file a shard, each row a sample.
//!
//! A dataset of Parquet files is resolved like WebDataset shards (URL patterns, one listing
//! per directory), and each file's row count is read from its footer by the `parquet`
//! crate's metadata reader over the store's range requests (with the store's retries: a
//! suffix of the file, then the rest of the metadata if it is larger), so no file is
//! downloaded at build. Workers read a file through
//! the node's shard cache and decode its row groups with the `parquet` crate's Arrow reader;
//! each row becomes a sample whose fields are its columns, by column name:
//!
//! | Parquet / Arrow column | field bytes |
//! | --- | --- |
//! | binary, large binary, binary view, fixed-size binary | the value |
//! | string (utf8, large, view) | the UTF-8 text |
//! | integers, floats, booleans | the value as decimal text (`ShardSample::int` reads it) |
//! | a struct with a binary `bytes` child (Hugging Face's `Image` and `Audio` features) | that child's value |
//!
//! A null value leaves the field out of its sample; columns of other types (lists, maps,
//! dates, ...) are not read into samples (a `require`d one is then reported missing). The
//! sample's key is its row number in the file, and its "offset" (in errors) is the row
//! number too. Compression: snappy, gzip, LZ4, zstd (pyarrow's and Hugging Face's codecs);
//! brotli-compressed files are refused with the codec named.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::async_reader::MetadataFetch;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaDataReader;

use crate::ShardError;
use crate::store::{ShardInfo, ShardStore};

/// One row's fields by column name.
pub type Row = BTreeMap<String, Vec<u8>>;

fn error(url: &str, row: Option<u64>, reason: String) -> ShardError {
    ShardError::Parquet {
        shard: url.to_owned(),
        row,
        reason,
    }
}

/// Range reads of one object through the store (its retries and resumption), for the
/// `parquet` crate's metadata reader.
struct Fetch<'a> {
    store: &'a ShardStore,
    url: &'a str,
}

impl MetadataFetch for Fetch<'_> {
    fn fetch(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.store
                .get_range_async(self.url, range)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }
}

/// The number of rows of Parquet file `shard`, from its footer (read with range requests).
pub(crate) async fn row_count(store: &ShardStore, shard: &ShardInfo) -> Result<u64, ShardError> {
    let fetch = Fetch {
        store,
        url: &shard.url,
    };
    let metadata = ParquetMetaDataReader::new()
        .load_and_finish(fetch, shard.size)
        .await
        .map_err(|e| match e {
            // The store's own error (the URL, the attempts) as it is.
            ParquetError::External(inner) => match inner.downcast::<ShardError>() {
                Ok(e) => *e,
                Err(other) => error(&shard.url, None, format!("reading the footer: {other}")),
            },
            other => error(&shard.url, None, format!("reading the footer: {other}")),
        })?;
    u64::try_from(metadata.file_metadata().num_rows()).map_err(|_| {
        error(
            &shard.url,
            None,
            "a negative row count in the footer".into(),
        )
    })
}

/// Every row of the Parquet file `file` (the cached copy of `url`), in file order.
///
/// # Errors
/// [`ShardError::Parquet`] naming the file (and the row where a batch failed) for a file
/// that is not Parquet, a codec this build lacks, or damaged pages.
pub fn read_rows(url: &str, file: File) -> Result<Vec<Row>, ShardError> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| error(url, None, format!("not a readable Parquet file: {e}")))?;
    let expected = usize::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    let reader = builder
        .with_batch_size(1024)
        .build()
        .map_err(|e| error(url, None, e.to_string()))?;
    let mut rows = Vec::with_capacity(expected);
    for batch in reader {
        let first = rows.len() as u64;
        let batch = batch.map_err(|e| error(url, Some(first), e.to_string()))?;
        append_rows(&batch, &mut rows);
    }
    Ok(rows)
}

/// Appends `batch`'s rows to `rows`.
fn append_rows(batch: &RecordBatch, rows: &mut Vec<Row>) {
    let start = rows.len();
    rows.resize_with(start + batch.num_rows(), Row::new);
    let schema = batch.schema();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let Some(values) = column_bytes(column) else {
            continue;
        };
        for (i, value) in values.into_iter().enumerate() {
            if let Some(v) = value {
                rows[start + i].insert(field.name().clone(), v);
            }
        }
    }
}

/// Each value of `column` as field bytes (`None` for a null), or `None` for a column type
/// that is not read into samples.
fn column_bytes(column: &ArrayRef) -> Option<Vec<Option<Vec<u8>>>> {
    fn each<T>(
        a: &dyn Array,
        len: usize,
        f: impl Fn(usize) -> T,
        to: impl Fn(T) -> Vec<u8>,
    ) -> Vec<Option<Vec<u8>>> {
        (0..len)
            .map(|i| (!a.is_null(i)).then(|| to(f(i))))
            .collect()
    }
    let a = column.as_ref();
    let n = a.len();
    let text = |s: String| s.into_bytes();
    Some(match a.data_type() {
        DataType::Binary => {
            let c = a.as_binary::<i32>();
            each(a, n, |i| c.value(i).to_vec(), |v| v)
        }
        DataType::LargeBinary => {
            let c = a.as_binary::<i64>();
            each(a, n, |i| c.value(i).to_vec(), |v| v)
        }
        DataType::BinaryView => {
            let c = a.as_binary_view();
            each(a, n, |i| c.value(i).to_vec(), |v| v)
        }
        DataType::FixedSizeBinary(_) => {
            let c = a.as_fixed_size_binary();
            each(a, n, |i| c.value(i).to_vec(), |v| v)
        }
        DataType::Utf8 => {
            let c = a.as_string::<i32>();
            each(a, n, |i| c.value(i).as_bytes().to_vec(), |v| v)
        }
        DataType::LargeUtf8 => {
            let c = a.as_string::<i64>();
            each(a, n, |i| c.value(i).as_bytes().to_vec(), |v| v)
        }
        DataType::Utf8View => {
            let c = a.as_string_view();
            each(a, n, |i| c.value(i).as_bytes().to_vec(), |v| v)
        }
        DataType::Boolean => {
            let c = a.as_boolean();
            each(a, n, |i| u8::from(c.value(i)).to_string(), text)
        }
        DataType::Int8 => {
            let c = a.as_primitive::<Int8Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::Int16 => {
            let c = a.as_primitive::<Int16Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::Int32 => {
            let c = a.as_primitive::<Int32Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::Int64 => {
            let c = a.as_primitive::<Int64Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::UInt8 => {
            let c = a.as_primitive::<UInt8Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::UInt16 => {
            let c = a.as_primitive::<UInt16Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::UInt32 => {
            let c = a.as_primitive::<UInt32Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::UInt64 => {
            let c = a.as_primitive::<UInt64Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::Float16 => {
            let c = a.as_primitive::<Float16Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::Float32 => {
            let c = a.as_primitive::<Float32Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        DataType::Float64 => {
            let c = a.as_primitive::<Float64Type>();
            each(a, n, |i| c.value(i).to_string(), text)
        }
        // Hugging Face's Image / Audio features: struct<bytes: binary, path: string>.
        DataType::Struct(_) => {
            let s = a.as_struct();
            let child = s.column_by_name("bytes")?;
            let values = column_bytes(child)?;
            values
                .into_iter()
                .enumerate()
                .map(|(i, v)| if s.is_null(i) { None } else { v })
                .collect()
        }
        _ => return None,
    })
}

/// Rows of a cached shard, shared by the samples read from it.
pub(crate) type Rows = Arc<Vec<Row>>;
