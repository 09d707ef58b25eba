//! `FieldRecords` + `RecordCollate`: a WebDataset shard of jpg + txt + json + cls read field by
//! field through the loader, with and without workers, delivers every sample once with the
//! texts, JSON and labels written (decoded from the bytes + offsets tensors) and images shaped
//! by the pipeline; a missing field is an error naming the field.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;

use longshore_data::{Batch, IterableDataset, Storage, WorkerInfo};
use longshore_loader::DataLoader;
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::webdataset::ShardWriter;
use longshore_vision::shards::fields::{FieldKind, FieldRecords, ShardField};
use longshore_vision::synth::{FolderSpec, image_jpeg};
use longshore_vision::{Compose, DecodeOptions, Output};

mod shards_support;

const N: usize = 11;

fn caption(i: usize) -> String {
    // Lengths vary, one is empty, one is not ASCII.
    match i {
        3 => String::new(),
        5 => "café ☕".into(),
        _ => format!("sample {i}: {}", "word ".repeat(i)),
    }
}

fn meta(i: usize) -> String {
    format!(r#"{{"id": {i}, "tags": ["t{i}"]}}"#)
}

/// `N` samples (key `s{i:02}`, label `i`) in two shards; `drop` leaves that sample's field out.
fn shards(root: &Path, drop: Option<(usize, &str)>) -> ShardedDataset {
    let out = root.join("shards");
    let mut w = ShardWriter::new(&out, 4 << 10).unwrap();
    let spec = FolderSpec::tiny();
    for i in 0..N {
        let jpg = image_jpeg(&spec, i % 4, i);
        let (txt, json, cls) = (caption(i), meta(i), i.to_string());
        let fields: Vec<(&str, &[u8])> = [
            ("jpg", jpg.as_slice()),
            ("txt", txt.as_bytes()),
            ("json", json.as_bytes()),
            ("cls", cls.as_bytes()),
        ]
        .into_iter()
        .filter(|(name, _)| drop != Some((i, *name)))
        .collect();
        w.write(&format!("s{i:02}"), &fields).unwrap();
    }
    let index = w.finish().unwrap();
    shards_support::open_shards(root, index.shardlist.len(), 3)
}

fn fields() -> Vec<ShardField> {
    vec![
        ShardField::new("jpg", FieldKind::Image),
        ShardField::new("txt", FieldKind::Text),
        ShardField::new("json", FieldKind::Json),
        ShardField::new("cls", FieldKind::Int),
    ]
}

/// A variable-length field's items, from its bytes and offsets tensors.
fn items(batch: &Batch<impl Storage>, t: usize) -> Vec<String> {
    let bytes = batch.tensor_bytes(t).unwrap();
    let offsets = batch.tensor::<i64>(t + 1).unwrap();
    assert_eq!(offsets[0], 0);
    assert_eq!(*offsets.last().unwrap() as usize, bytes.len());
    offsets
        .windows(2)
        .map(|w| String::from_utf8(bytes[w[0] as usize..w[1] as usize].to_vec()).unwrap())
        .collect()
}

#[test]
fn every_sample_arrives_once_with_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path(), None);
    let records = FieldRecords::new(
        ds,
        fields(),
        Some(Compose::val(28, 24, Output::imagenet())),
        DecodeOptions::default(),
    );
    for workers in [0, 2] {
        let collate = records.collate();
        let loader = DataLoader::iterable(records.clone())
            .collate(collate)
            .batch_size(4)
            .num_workers(workers)
            .build()
            .unwrap();
        let mut seen = BTreeMap::new();
        for batch in loader.iter() {
            let batch = batch.unwrap();
            // jpg, txt + txt.offsets, json + json.offsets, cls.
            assert_eq!(batch.len(), 6);
            let b = batch.batch_size();
            assert_eq!(batch.shape(0).unwrap(), &[b, 3, 24, 24]);
            assert_eq!(batch.shape(2).unwrap(), &[b + 1]);
            assert_eq!(batch.shape(4).unwrap(), &[b + 1]);
            assert_eq!(batch.shape(5).unwrap(), &[b]);
            let labels = batch.tensor::<i64>(5).unwrap().to_vec();
            let (texts, metas) = (items(&batch, 1), items(&batch, 3));
            assert_eq!((texts.len(), metas.len()), (b, b));
            for ((label, text), meta_) in labels.into_iter().zip(texts).zip(metas) {
                let i = label as usize;
                assert_eq!(text, caption(i), "sample {i}");
                assert_eq!(meta_, meta(i), "sample {i}");
                assert!(seen.insert(i, ()).is_none(), "sample {i} twice");
            }
        }
        assert_eq!(seen.len(), N, "{workers} workers: every sample once");
    }
}

#[test]
fn the_records_carry_the_values_read() {
    let dir = tempfile::tempdir().unwrap();
    let records = FieldRecords::new(
        shards(dir.path(), None),
        fields(),
        Some(Compose::val(28, 24, Output::U8Chw)),
        DecodeOptions::default(),
    );
    let all: Vec<_> = records
        .iter(WorkerInfo::single(0))
        .map(Result::unwrap)
        .collect();
    assert_eq!(all.len(), N);
    for r in &all {
        assert_eq!(r.len(), 4);
        let i = r.int(3).unwrap() as usize;
        assert_eq!(r.bytes(1).unwrap(), caption(i).as_bytes());
        assert_eq!(r.bytes(2).unwrap(), meta(i).as_bytes());
        let (path, jpg) = r.image(0).unwrap();
        assert!(
            path.to_string_lossy().ends_with(&format!("#s{i:02}.jpg")),
            "{path:?}"
        );
        assert_eq!(jpg, image_jpeg(&FolderSpec::tiny(), i % 4, i));
    }
}

/// The error and its sources, joined.
fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut s = e.source();
    while let Some(e) = s {
        text += &format!(": {e}");
        s = e.source();
    }
    text
}

#[test]
fn a_missing_field_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let records = FieldRecords::new(
        shards(dir.path(), Some((7, "txt"))),
        fields(),
        Some(Compose::val(28, 24, Output::U8Chw)),
        DecodeOptions::default(),
    );
    let errors: Vec<String> = records
        .iter(WorkerInfo::single(0))
        .filter_map(Result::err)
        .map(|e| chain(&e))
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("s07"), "{}", errors[0]);
    assert!(errors[0].contains("txt"), "{}", errors[0]);

    // Through the loader (with workers), the batch fails naming the field.
    let collate = records.collate();
    let loader = DataLoader::iterable(records)
        .collate(collate)
        .batch_size(4)
        .num_workers(2)
        .build()
        .unwrap();
    let err = loader
        .iter()
        .find_map(Result::err)
        .expect("the sample without its txt fails");
    let text = chain(&err);
    assert!(text.contains("txt"), "{text}");
}

#[test]
fn a_field_that_does_not_read_as_its_kind_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut fields = fields();
    // The captions are not JSON.
    fields[1].kind = FieldKind::Json;
    let records = FieldRecords::new(
        shards(dir.path(), None),
        fields,
        Some(Compose::val(28, 24, Output::U8Chw)),
        DecodeOptions::default(),
    );
    let err = records
        .iter(WorkerInfo::single(0))
        .find_map(Result::err)
        .expect("a caption is not JSON");
    let text = chain(&err);
    assert!(text.contains(r#"field "txt": is not JSON: "#), "{text}");
}

#[test]
fn kinds_have_names() {
    for k in FieldKind::ALL {
        assert_eq!(FieldKind::from_name(k.name()), Some(k));
        assert_eq!(k.to_string(), k.name());
    }
    assert_eq!(FieldKind::from_name("jpeg"), None);
    let variable: Vec<_> = FieldKind::ALL
        .into_iter()
        .filter(|k| k.is_variable())
        .collect();
    assert_eq!(
        variable,
        [FieldKind::Text, FieldKind::Json, FieldKind::Bytes]
    );
}

/// Sample `i`'s tokens: 6 u16 (`ragged`: `i % 3 + 4` of them).
fn tokens(i: usize, ragged: bool) -> Vec<u16> {
    let n = if ragged { i % 3 + 4 } else { 6 };
    (0..n).map(|k| (i * 100 + k) as u16).collect()
}

/// `N` samples with `tok.npy` (u16 tokens, written big-endian for odd samples: numpy's
/// `'>u2'`), `emb.npy` (f32 `[2, 3]`), `bad.npy` (not a .npy) and `cls`.
fn array_shards(root: &Path, ragged: bool) -> ShardedDataset {
    use longshore_data::DType;
    use longshore_data::formats::npy::encode_npy;
    let out = root.join("shards");
    let mut w = ShardWriter::new(&out, 2 << 10).unwrap();
    for i in 0..N {
        let t = tokens(i, ragged);
        let le: Vec<u8> = t.iter().flat_map(|x| x.to_ne_bytes()).collect();
        let mut tok = encode_npy(DType::U16, &[t.len()], &le).unwrap();
        if i % 2 == 1 {
            let at = tok.len() - le.len();
            let mut head = tok[..at].to_vec();
            let d = head.windows(4).position(|w| w == b"'<u2").unwrap();
            head[d + 1] = b'>';
            let be: Vec<u8> = t.iter().flat_map(|x| x.to_be_bytes()).collect();
            tok = [head, be].concat();
        }
        let e: Vec<u8> = (0..6)
            .flat_map(|k| (i as f32 + k as f32 / 10.0).to_ne_bytes())
            .collect();
        let emb = encode_npy(DType::F32, &[2, 3], &e).unwrap();
        let cls = i.to_string();
        w.write(
            &format!("s{i:02}"),
            &[
                ("tok.npy", tok.as_slice()),
                ("emb.npy", emb.as_slice()),
                ("bad.npy", b"not an array".as_slice()),
                ("cls", cls.as_bytes()),
            ],
        )
        .unwrap();
    }
    let index = w.finish().unwrap();
    shards_support::open_shards(root, index.shardlist.len(), 5)
}

#[test]
fn arrays_are_stacked_in_their_dtype_whatever_their_byte_order() {
    let dir = tempfile::tempdir().unwrap();
    let records = FieldRecords::new(
        array_shards(dir.path(), false),
        vec![
            ShardField::new("tok.npy", FieldKind::Array),
            ShardField::new("cls", FieldKind::Int),
            ShardField::new("emb.npy", FieldKind::Array),
        ],
        None,
        DecodeOptions::default(),
    );
    for workers in [0, 2] {
        let loader = DataLoader::iterable(records.clone())
            .collate(records.collate())
            .batch_size(4)
            .num_workers(workers)
            .build()
            .unwrap();
        let mut seen = BTreeMap::new();
        for batch in loader.iter() {
            let batch = batch.unwrap();
            let b = batch.batch_size();
            assert_eq!(batch.len(), 3);
            assert_eq!(batch.shape(0).unwrap(), &[b, 6]);
            assert_eq!(batch.shape(2).unwrap(), &[b, 2, 3]);
            let tok = batch.tensor::<u16>(0).unwrap();
            let emb = batch.tensor::<f32>(2).unwrap();
            for (k, &label) in batch.tensor::<i64>(1).unwrap().iter().enumerate() {
                let i = label as usize;
                assert_eq!(&tok[k * 6..(k + 1) * 6], tokens(i, false), "sample {i}");
                let want: Vec<f32> = (0..6).map(|j| i as f32 + j as f32 / 10.0).collect();
                assert_eq!(&emb[k * 6..(k + 1) * 6], want, "sample {i}");
                assert!(seen.insert(i, ()).is_none(), "sample {i} twice");
            }
        }
        assert_eq!(seen.len(), N, "{workers} workers: every sample once");
    }
}

#[test]
fn arrays_of_other_shapes_and_bytes_that_are_not_npy_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let ragged = FieldRecords::new(
        array_shards(dir.path(), true),
        vec![ShardField::new("tok.npy", FieldKind::Array)],
        None,
        DecodeOptions::default(),
    );
    let loader = DataLoader::iterable(ragged.clone())
        .collate(ragged.collate())
        .batch_size(4)
        .build()
        .unwrap();
    let err = loader
        .iter()
        .find_map(Result::err)
        .expect("a batch of ragged arrays");
    let text = chain(&err);
    assert!(
        text.contains(r#"field "tok.npy": the arrays of a batch are stacked"#)
            && text.contains("shard-0000")
            && text.contains("#s0")
            && text.contains("u16 ["),
        "{text}"
    );
    let bad = FieldRecords::new(
        ragged.dataset().clone(),
        vec![ShardField::new("bad.npy", FieldKind::Array)],
        None,
        DecodeOptions::default(),
    );
    let err = bad
        .iter(WorkerInfo::single(0))
        .find_map(Result::err)
        .expect("not a .npy");
    let text = chain(&err);
    assert!(
        text.contains(r#"field "bad.npy": is not a .npy array"#) && text.contains("s0"),
        "{text}"
    );
}
