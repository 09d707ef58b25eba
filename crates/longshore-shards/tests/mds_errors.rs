//! MDS shards that disagree with their index, or are damaged, give errors naming the shard,
//! the sample and the byte offset — never a panic.

use longshore_shards::ShardError;
use longshore_shards::mds::{
    MdsIndex, MdsShard, MdsShardInfo, MdsWriter, Value, header_len, sample_count, sample_range,
};
use proptest::prelude::*;

/// A one-shard dataset with a fixed-size and two variable-size columns.
fn dataset(n: usize) -> (MdsShardInfo, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let mut w = MdsWriter::new(
        dir.path(),
        &[("label", "int"), ("text", "str"), ("imgs", "list[jpeg]")],
        None,
    )
    .unwrap();
    for i in 0..n {
        w.write(&[
            ("label", Value::Int(i as i64)),
            ("text", Value::Str("x".repeat(i))),
            (
                "imgs",
                Value::List(vec![Value::Image(vec![0xff, 0xd8, i as u8]); i % 3]),
            ),
        ])
        .unwrap();
    }
    let index = w.finish().unwrap();
    let info = index.shards[0].clone();
    let bytes = std::fs::read(dir.path().join(&info.raw_data.basename)).unwrap();
    (info, bytes)
}

#[test]
fn samples_are_reachable_by_range_from_the_header_alone() {
    let (info, bytes) = dataset(5);
    assert_eq!(sample_count("s", &bytes[..4]).unwrap(), 5);
    let shard = MdsShard::new(&info, &bytes).unwrap();
    for i in 0..5u64 {
        let head = &bytes[..(4 * (i + 3)) as usize];
        let range = sample_range("s", head, i).unwrap();
        assert!(range.start >= header_len(5));
        let sample = shard.sample(i).unwrap();
        assert_eq!(sample.get("label").unwrap(), Value::Int(i as i64));
        assert_eq!(
            sample.get("text").unwrap(),
            Value::Str("x".repeat(i as usize))
        );
        let imgs = sample.get("imgs").unwrap();
        assert_eq!(
            imgs,
            Value::List(vec![
                Value::Image(vec![0xff, 0xd8, i as u8]);
                i as usize % 3
            ])
        );
        // The sample's bytes alone parse the same.
        let alone = &bytes[range.start as usize..range.end as usize];
        let columns = shard.columns();
        let parsed =
            longshore_shards::mds::MdsSample::parse("s", columns, i, range.start, alone).unwrap();
        assert_eq!(parsed.raw_columns(), sample.raw_columns());
    }
    let err = sample_range("s", &bytes[..12], 1).unwrap_err().to_string();
    assert!(err.contains("\"s\"") && err.contains("byte"), "{err}");
    assert!(sample_range("s", &bytes, 5).is_err());
}

#[test]
fn an_index_that_does_not_match_its_shard_is_refused() {
    let (info, bytes) = dataset(4);
    let name = info.raw_data.basename.clone();
    let mut wrong_count = info.clone();
    wrong_count.samples = 5;
    let err = MdsShard::new(&wrong_count, &bytes).unwrap_err();
    assert!(
        matches!(&err, ShardError::Mds { shard, .. } if *shard == name),
        "{err}"
    );
    assert!(err.to_string().contains("5"), "{err}");

    let mut wrong_size = info.clone();
    wrong_size.raw_data.bytes += 1;
    assert!(
        MdsShard::new(&wrong_size, &bytes)
            .unwrap_err()
            .to_string()
            .contains("bytes")
    );

    // An offset past the end: the error names the sample and where its offset is stored.
    let mut bad = bytes.clone();
    bad[4 + 4 * 2..4 + 4 * 3].copy_from_slice(&u32::MAX.to_le_bytes());
    match MdsShard::new(&info, &bad).unwrap_err() {
        ShardError::Mds {
            shard,
            sample,
            offset,
            ..
        } => {
            assert_eq!(shard, name);
            assert_eq!(sample, Some(2));
            assert_eq!(offset, 12);
        }
        other => panic!("{other}"),
    }

    let mut zipped = info.clone();
    zipped.compression = Some("zstd:7".into());
    let err = MdsShard::new(&zipped, &bytes).unwrap_err();
    assert!(
        matches!(&err, ShardError::MdsCompression { codec, .. } if codec == "zstd:7"),
        "{err}"
    );
    assert!(err.to_string().contains(&name));
}

#[test]
fn a_malformed_index_is_refused_with_its_offset() {
    let err = MdsIndex::from_json("{\"shards\": [], \"version\": 3}").unwrap_err();
    assert!(err.to_string().contains("version 3"), "{err}");
    let err = MdsIndex::from_json("{\"shards\": [}").unwrap_err();
    assert!(matches!(err, ShardError::Mds { offset: 12, .. }), "{err}");
    let (info, _) = dataset(1);
    let mut bad = info.clone();
    bad.column_sizes.pop();
    let text = serde_json::json!({"shards": [bad], "version": 2}).to_string();
    assert!(MdsIndex::from_json(&text).is_err());
}

#[test]
fn values_that_do_not_fit_their_encoding_are_refused_by_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = MdsWriter::new(
        dir.path(),
        &[("a", "uint8"), ("b", "ndarray:uint8:2")],
        None,
    )
    .unwrap();
    let arr = Value::Array(longshore_data::Tensor::from_slice(&[2], &[1u8, 2]).unwrap());
    assert!(
        w.write(&[("a", Value::UInt(256)), ("b", arr.clone())])
            .is_err()
    );
    assert!(
        w.write(&[("a", Value::Str("x".into())), ("b", arr.clone())])
            .is_err()
    );
    assert!(w.write(&[("a", Value::UInt(1))]).is_err());
    let wrong = Value::Array(longshore_data::Tensor::from_slice(&[3], &[1u8, 2, 3]).unwrap());
    assert!(w.write(&[("a", Value::UInt(1)), ("b", wrong)]).is_err());
    w.write(&[("a", Value::UInt(255)), ("b", arr)]).unwrap();
    assert!(MdsWriter::new(dir.path(), &[("a", "nope")], None).is_err());
    assert!(MdsWriter::new(dir.path(), &[("a", "int")], Some(1 << 32)).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn damaged_shards_give_located_errors_not_panics(
        n in 1usize..6,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let (info, mut bytes) = dataset(n);
        // Half the flips in the header (count, offsets), half anywhere (sizes, values).
        for (k, (at, byte)) in flips.iter().enumerate() {
            let span = if k % 2 == 0 { bytes.len().min(4 * n + 8) } else { bytes.len() };
            bytes[at.index(span)] = *byte;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let check = |e: &ShardError| match e {
            ShardError::Mds { shard, .. } => assert_eq!(shard, &info.raw_data.basename),
            other => panic!("unexpected error kind: {other}"),
        };
        match MdsShard::new(&info, &bytes) {
            Err(e) => check(&e),
            Ok(shard) => {
                for i in 0..shard.len() {
                    match shard.sample(i) {
                        Ok(s) => {
                            for name in ["label", "text", "imgs"] {
                                if let Err(e) = s.get(name) {
                                    check(&e);
                                }
                            }
                        }
                        Err(e) => check(&e),
                    }
                }
            }
        }
        for i in 0..8 {
            if let Err(e) = sample_range(&info.raw_data.basename, &bytes, i) {
                check(&e);
            }
        }
    }
}
