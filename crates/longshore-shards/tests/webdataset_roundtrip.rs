//! WebDataset shards: written, read back, scanned, and their errors located.

use std::io::Cursor;

use longshore_shards::ShardError;
use longshore_shards::webdataset::{
    SampleWriter, ShardIndex, ShardReader, ShardWriter, pack_image_folder, pack_npy,
};

/// A sample to write: key and (extension, bytes) fields.
type Spec<'a> = (&'a str, Vec<(&'a str, Vec<u8>)>);

fn shard(samples: &[Spec<'_>]) -> Vec<u8> {
    let mut w = SampleWriter::new("t.tar", Vec::new());
    for (key, fields) in samples {
        let fields: Vec<(&str, &[u8])> = fields.iter().map(|(e, d)| (*e, d.as_slice())).collect();
        w.write(key, &fields).unwrap();
    }
    w.finish().unwrap()
}

fn read(name: &str, tar: &[u8]) -> Result<Vec<longshore_shards::webdataset::Sample>, ShardError> {
    ShardReader::new(name, tar).samples()?.collect()
}

#[test]
fn samples_read_back_with_keys_fields_and_spans() {
    let long = format!("deep/{}/img", "d".repeat(120));
    let tar = shard(&[
        ("a/0", vec![("jpg", vec![1, 2, 3]), ("cls", b"7".to_vec())]),
        (
            &long,
            vec![("seg.png", vec![9; 700]), ("json", b"{\"x\": 1}".to_vec())],
        ),
        ("c", vec![("txt", b"hello".to_vec())]),
    ]);
    let samples = read("s3://bucket/t.tar", &tar).unwrap();
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].key, "a/0");
    assert_eq!(samples[0].url, "s3://bucket/t.tar");
    assert_eq!(samples[0].int("cls").unwrap(), 7);
    assert_eq!(samples[0].image(), Some(("jpg", [1u8, 2, 3].as_slice())));
    assert_eq!(samples[1].key, long);
    assert_eq!(samples[1].get("seg.png"), Some(vec![9u8; 700].as_slice()));
    assert_eq!(samples[1].json("json").unwrap()["x"], 1);
    assert_eq!(samples[2].text("txt").unwrap(), "hello");

    // The scan finds the same samples, and each span reads alone as that sample.
    let spans = ShardReader::new("t.tar", tar.as_slice()).scan().unwrap();
    assert_eq!(spans.len(), 3);
    for (span, sample) in spans.iter().zip(&samples) {
        assert_eq!(span.key, sample.key);
        assert_eq!(span.offset, sample.offset);
        let alone = read("t.tar", &tar[span.offset as usize..span.end as usize]).unwrap();
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].fields, sample.fields);
    }
}

#[test]
fn the_same_samples_give_the_same_bytes() {
    let make = || {
        shard(&[
            ("k", vec![("bin", vec![5; 1000])]),
            ("l", vec![("bin", vec![])]),
        ])
    };
    assert_eq!(make(), make());
}

/// Appends a raw member (any entry type) to a tar being built by hand.
fn member(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_path(name).unwrap();
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

#[test]
fn other_entries_meta_files_and_pax_names_are_handled_like_webdataset() {
    let mut tar = Vec::new();
    member(&mut tar, "dir/", tar::EntryType::Directory, b"");
    member(&mut tar, "__meta__", tar::EntryType::Regular, b"skip me");
    member(&mut tar, "noext", tar::EntryType::Regular, b"skip me");
    member(&mut tar, "dir/x.JPG", tar::EntryType::Regular, b"jpeg");
    member(&mut tar, "dir/x.cls", tar::EntryType::Regular, b" 3\n");
    member(&mut tar, "dir/link.jpg", tar::EntryType::Symlink, b"");
    // A pax header giving the next member a long name.
    let path = format!("p/{}.txt", "y".repeat(150));
    let record = format!(" path={path}\n");
    let record = format!(
        "{}{record}",
        record.len() + (record.len() + 3).to_string().len()
    );
    member(&mut tar, "pax", tar::EntryType::XHeader, record.as_bytes());
    member(
        &mut tar,
        "short.txt",
        tar::EntryType::Regular,
        b"long-named",
    );
    tar.extend_from_slice(&[0; 1024]);

    let samples = read("hand.tar", &tar).unwrap();
    assert_eq!(samples.len(), 2, "{samples:?}");
    assert_eq!(samples[0].key, "dir/x");
    assert_eq!(samples[0].get("jpg"), Some(b"jpeg".as_slice()));
    assert_eq!(samples[0].int("cls").unwrap(), 3);
    assert_eq!(samples[1].key, format!("p/{}", "y".repeat(150)));
    assert_eq!(samples[1].text("txt").unwrap(), "long-named");
    // The pax header belongs to the sample's span.
    let spans = ShardReader::new("hand.tar", tar.as_slice()).scan().unwrap();
    assert_eq!(spans[1].offset, samples[1].offset);
    let alone = read(
        "hand.tar",
        &tar[spans[1].offset as usize..spans[1].end as usize],
    )
    .unwrap();
    assert_eq!(alone[0].key, samples[1].key);
}

#[test]
fn a_duplicate_field_is_an_error_naming_shard_key_and_offset() {
    let mut tar = Vec::new();
    member(&mut tar, "k.txt", tar::EntryType::Regular, b"a");
    member(&mut tar, "k.TXT", tar::EntryType::Regular, b"b");
    tar.extend_from_slice(&[0; 1024]);
    let err = read("dup.tar", &tar).unwrap_err();
    assert!(
        matches!(&err, ShardError::Sample { shard, key, offset: 0, .. } if shard == "dup.tar" && key == "k"),
        "{err}"
    );
    assert!(ShardReader::new("dup.tar", tar.as_slice()).scan().is_err());
}

#[test]
fn a_missing_or_undecodable_field_names_the_sample() {
    let tar = shard(&[("x/1", vec![("jpg", vec![1]), ("txt", vec![0xff])])]);
    let sample = &read("u.tar", &tar).unwrap()[0];
    let err = sample.field("cls").unwrap_err().to_string();
    assert!(
        err.contains("u.tar")
            && err.contains("x/1")
            && err.contains(".cls")
            && err.contains("jpg, txt"),
        "{err}"
    );
    assert!(sample.require(&["jpg", "txt"]).is_ok());
    assert!(sample.text("txt").is_err());
    assert!(sample.int("jpg").is_err());
    assert!(sample.npy("jpg").is_err());
}

#[test]
fn a_truncated_member_names_the_member_and_its_offset() {
    let tar = shard(&[
        ("a", vec![("bin", vec![1; 100])]),
        ("b", vec![("bin", vec![2; 3000])]),
    ]);
    let cut = &tar[..512 + 512 + 512 + 1000];
    let results: Vec<_> = ShardReader::new("cut.tar", cut)
        .samples()
        .unwrap()
        .collect();
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("an error");
    match err {
        ShardError::Tar {
            shard,
            member,
            offset,
            ..
        } => {
            assert_eq!(shard, "cut.tar");
            assert_eq!(member.as_deref(), Some("b.bin"));
            assert_eq!(*offset, 1024);
        }
        other => panic!("{other}"),
    }
    assert!(ShardReader::new("cut.tar", cut).scan().is_err());
}

#[test]
fn npy_fields_decode_through_longshore_data() {
    let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let npy = longshore_data::formats::npy::encode_npy(
        longshore_data::DType::F32,
        &[2, 3],
        as_bytes(&data),
    )
    .unwrap();
    let tar = shard(&[("a", vec![("npy", npy)])]);
    let t = read("n.tar", &tar).unwrap()[0].npy("npy").unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.as_slice::<f32>().unwrap(), data.as_slice());
}

/// The bytes of a float slice (through longshore-data's typed views; no unsafe here).
fn as_bytes(v: &[f32]) -> &[u8] {
    let shape = longshore_data::Shape::new(&[v.len()]).unwrap();
    longshore_data::TensorRef::from_slice(shape, v)
        .unwrap()
        .bytes()
}

#[test]
fn shard_writer_splits_by_size_and_writes_a_wids_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = ShardWriter::new(dir.path(), 10_000).unwrap();
    for i in 0..40 {
        w.write(
            &format!("{i:04}"),
            &[("bin", &[i as u8; 1500]), ("cls", b"1")],
        )
        .unwrap();
    }
    let index = w.finish().unwrap();
    assert!(index.shardlist.len() > 1);
    assert_eq!(index.counts().iter().sum::<u64>(), 40);
    let on_disk = ShardIndex::read(dir.path().join("shard-index.json")).unwrap();
    assert_eq!(on_disk, index);
    let json: serde_json::Value = serde_json::from_str(&index.to_json()).unwrap();
    assert_eq!(json["__kind__"], "wids-shard-index-v1");
    assert_eq!(json["wids_version"], 1);
    let mut key = 0;
    for (i, entry) in index.shardlist.iter().enumerate() {
        assert_eq!(entry.url, format!("shard-{i:06}.tar"));
        let path = dir.path().join(&entry.url);
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(entry.filesize, Some(size));
        assert!(size <= 10_000);
        let samples = ShardReader::open(&path).unwrap().scan().unwrap();
        assert_eq!(samples.len() as u64, entry.nsamples);
        for s in samples {
            assert_eq!(s.key, format!("{key:04}"));
            key += 1;
        }
    }
    assert!(
        ShardIndex::from_json(
            "x.json",
            "{\"__kind__\": \"other\", \"wids_version\": 1, \"shardlist\": []}"
        )
        .is_err()
    );
}

#[test]
fn an_image_folder_packs_into_jpg_and_cls_samples() {
    let root = tempfile::tempdir().unwrap();
    for (class, files) in [
        ("cat", &["b.jpg", "a.JPEG", "notes.txt"][..]),
        ("dog", &["c.png"][..]),
    ] {
        std::fs::create_dir(root.path().join(class)).unwrap();
        for f in files {
            std::fs::write(root.path().join(class).join(f), f.as_bytes()).unwrap();
        }
    }
    let out = tempfile::tempdir().unwrap();
    let index = pack_image_folder(root.path(), out.path(), 1 << 20, None).unwrap();
    assert_eq!(index.counts(), [3]);
    let samples = read(
        "s",
        &std::fs::read(out.path().join("shard-000000.tar")).unwrap(),
    )
    .unwrap();
    let got: Vec<(String, i64, Vec<u8>)> = samples
        .iter()
        .map(|s| {
            let (_, bytes) = s.image().unwrap();
            (s.key.clone(), s.int("cls").unwrap(), bytes.to_vec())
        })
        .collect();
    assert_eq!(
        got,
        [
            ("000000000".to_owned(), 0, b"a.JPEG".to_vec()),
            ("000000001".to_owned(), 0, b"b.jpg".to_vec()),
            ("000000002".to_owned(), 1, b"c.png".to_vec()),
        ]
    );
    // A seeded shuffle is deterministic.
    let (o1, o2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    pack_image_folder(root.path(), o1.path(), 1 << 20, Some(3)).unwrap();
    pack_image_folder(root.path(), o2.path(), 1 << 20, Some(3)).unwrap();
    assert_eq!(
        std::fs::read(o1.path().join("shard-000000.tar")).unwrap(),
        std::fs::read(o2.path().join("shard-000000.tar")).unwrap()
    );
}

#[test]
fn npy_rows_pack_into_npy_members() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = (dir.path().join("x.npy"), dir.path().join("y.npy"));
    let xs: Vec<u16> = (0..12).collect();
    longshore_data::write_npy(&x, &[4, 3], &xs).unwrap();
    longshore_data::write_npy(&y, &[4], &[10i64, 11, 12, 13]).unwrap();
    let out = dir.path().join("shards");
    let index = pack_npy(&[("x", &x), ("y", &y)], &out, 4096).unwrap();
    assert_eq!(index.counts().iter().sum::<u64>(), 4);
    let mut row = 0;
    for entry in &index.shardlist {
        let tar = std::fs::read(out.join(&entry.url)).unwrap();
        for s in read(&entry.url, &tar).unwrap() {
            assert_eq!(
                s.npy("x.npy").unwrap().as_slice::<u16>().unwrap(),
                &xs[row * 3..row * 3 + 3]
            );
            assert_eq!(
                s.npy("y.npy").unwrap().as_slice::<i64>().unwrap(),
                &[10 + row as i64]
            );
            row += 1;
        }
    }
    assert_eq!(row, 4);
    let short = dir.path().join("short.npy");
    longshore_data::write_npy(&short, &[3], &[1i64, 2, 3]).unwrap();
    assert!(pack_npy(&[("x", &x), ("s", &short)], dir.path().join("bad"), 4096).is_err());
}

#[test]
fn the_writer_refuses_samples_that_would_not_read_back() {
    let mut w = SampleWriter::new("w.tar", Cursor::new(Vec::new()));
    assert!(w.write("a.b", &[("jpg", b"")]).is_err());
    assert!(w.write("a", &[("JPG", b"")]).is_err());
    assert!(w.write("a", &[("jpg", b""), ("jpg", b"")]).is_err());
    assert!(w.write("a", &[]).is_err());
    assert!(w.write("__meta__/x", &[("json", b"")]).is_err());
    w.write("a", &[("jpg", b"")]).unwrap();
    assert!(w.write("a", &[("cls", b"1")]).is_err());
    assert_eq!(w.samples(), 1);
}
