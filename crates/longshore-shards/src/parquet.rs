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
//! | a list (list, large list, fixed-size list) of integers, floats or booleans (token ids, embeddings) | a 1-D `.npy` array of the list's values, in the column's type |
//!
//! A null value, or a list holding a null, leaves the field out of its sample; columns of
//! other types (lists of other lists or of text, maps, dates, ...) are not read into samples (a `require`d one is then reported missing). The
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

use longshore_data::DType;
use longshore_data::formats::npy::encode_npy;

use crate::ShardError;
use crate::store::{ShardInfo, ShardStore};

/// One row's fields by column name.
pub(crate) type Row = BTreeMap<String, Vec<u8>>;

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
pub(crate) fn read_rows(url: &str, file: File) -> Result<Vec<Row>, ShardError> {
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
        DataType::List(_) => {
            let c = a.as_list::<i32>();
            lists(a, n, |i| c.value(i))?
        }
        DataType::LargeList(_) => {
            let c = a.as_list::<i64>();
            lists(a, n, |i| c.value(i))?
        }
        DataType::FixedSizeList(_, _) => {
            let c = a.as_fixed_size_list();
            lists(a, n, |i| c.value(i))?
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

/// A list column's values as 1-D `.npy` arrays (`None` for a null list or one holding a
/// null: the field is left out of its sample), or `None` when its lists do not hold numbers
/// or booleans (the column is not read).
fn lists(
    a: &dyn Array,
    len: usize,
    value: impl Fn(usize) -> ArrayRef,
) -> Option<Vec<Option<Vec<u8>>>> {
    (0..len)
        .map(|i| {
            if a.is_null(i) {
                Ok(None)
            } else {
                list_npy(value(i).as_ref())
            }
        })
        .collect::<Result<_, ()>>()
        .ok()
}

/// One list's values as a 1-D `.npy`: `Err(())` when they are not numbers or booleans,
/// `Ok(None)` when one is null.
fn list_npy(values: &dyn Array) -> Result<Option<Vec<u8>>, ()> {
    macro_rules! numbers {
        ($t:ty, $d:expr) => {
            (
                $d,
                values
                    .as_primitive::<$t>()
                    .values()
                    .iter()
                    .flat_map(|x| x.to_ne_bytes())
                    .collect::<Vec<u8>>(),
            )
        };
    }
    let (dtype, data) = match values.data_type() {
        DataType::Boolean => (
            DType::Bool,
            values
                .as_boolean()
                .iter()
                .map(|b| u8::from(b.unwrap_or(false)))
                .collect(),
        ),
        DataType::Int8 => numbers!(Int8Type, DType::I8),
        DataType::Int16 => numbers!(Int16Type, DType::I16),
        DataType::Int32 => numbers!(Int32Type, DType::I32),
        DataType::Int64 => numbers!(Int64Type, DType::I64),
        DataType::UInt8 => numbers!(UInt8Type, DType::U8),
        DataType::UInt16 => numbers!(UInt16Type, DType::U16),
        DataType::UInt32 => numbers!(UInt32Type, DType::U32),
        DataType::UInt64 => numbers!(UInt64Type, DType::U64),
        DataType::Float16 => numbers!(Float16Type, DType::F16),
        DataType::Float32 => numbers!(Float32Type, DType::F32),
        DataType::Float64 => numbers!(Float64Type, DType::F64),
        _ => return Err(()),
    };
    if values.null_count() > 0 {
        return Ok(None);
    }
    Ok(encode_npy(dtype, &[values.len()], &data).ok())
}

/// Rows of a cached shard, shared by the samples read from it.
pub(crate) type Rows = Arc<Vec<Row>>;

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{
        FixedSizeListBuilder, Float32Builder, Int32Builder, LargeListBuilder, ListBuilder,
        StringBuilder, UInt16Builder,
    };
    use longshore_data::formats::npy::parse_header;
    use parquet::arrow::ArrowWriter;

    /// A row's field as a `.npy`: its dtype, shape and native-order values.
    fn npy(bytes: &[u8]) -> (DType, Vec<usize>, Vec<u8>) {
        let h = parse_header(bytes).unwrap();
        let data = bytes[h.data_offset..].to_vec();
        assert_eq!(data.len(), h.data_len().unwrap());
        (h.dtype, h.shape, data)
    }

    fn ne<T: Copy, const N: usize>(v: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| to(x)).collect()
    }

    #[test]
    fn lists_of_numbers_are_read_as_npy_arrays_and_other_lists_are_not() {
        // tokens: list<int32> (row 1 null, row 2 empty, row 3 holding a null);
        // ids: large_list<uint16>; emb: fixed_size_list<float32, 3>; words: list<utf8>.
        let mut tokens = ListBuilder::new(Int32Builder::new());
        let mut ids = LargeListBuilder::new(UInt16Builder::new());
        let mut emb = FixedSizeListBuilder::new(Float32Builder::new(), 3);
        let mut words = ListBuilder::new(StringBuilder::new());
        for r in 0..4i32 {
            match r {
                1 => tokens.append_null(),
                2 => tokens.append(true),
                3 => {
                    tokens.values().append_value(7);
                    tokens.values().append_null();
                    tokens.append(true);
                }
                _ => {
                    tokens.values().append_slice(&[-1, 50256, 3]);
                    tokens.append(true);
                }
            }
            ids.values().append_slice(&[r as u16; 5][..r as usize + 1]);
            ids.append(true);
            emb.values().append_slice(&[r as f32, 0.5, -2.0]);
            emb.append(true);
            words.values().append_value("a");
            words.append(true);
        }
        let batch = RecordBatch::try_from_iter([
            ("tokens", Arc::new(tokens.finish()) as ArrayRef),
            ("ids", Arc::new(ids.finish()) as ArrayRef),
            ("emb", Arc::new(emb.finish()) as ArrayRef),
            ("words", Arc::new(words.finish()) as ArrayRef),
        ])
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut w =
            ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let rows = read_rows("t.parquet", File::open(&path).unwrap()).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(
            npy(&rows[0]["tokens"]),
            (
                DType::I32,
                vec![3],
                ne(&[-1i32, 50256, 3], i32::to_ne_bytes)
            )
        );
        // A null list, and a list holding a null, leave the field out; an empty list is read.
        assert!(!rows[1].contains_key("tokens") && !rows[3].contains_key("tokens"));
        assert_eq!(npy(&rows[2]["tokens"]), (DType::I32, vec![0], vec![]));
        for (r, row) in rows.iter().enumerate() {
            assert_eq!(
                npy(&row["ids"]),
                (
                    DType::U16,
                    vec![r + 1],
                    ne(&vec![r as u16; r + 1], u16::to_ne_bytes)
                )
            );
            assert_eq!(
                npy(&row["emb"]),
                (
                    DType::F32,
                    vec![3],
                    ne(&[r as f32, 0.5, -2.0], f32::to_ne_bytes)
                )
            );
            assert!(!row.contains_key("words"), "a list of text is not read");
        }
    }
}
