//! Random truncations and byte mutations of a valid shard never panic the reader or the scan,
//! and every error names the shard and a byte offset inside it; the seeking scan of a shard
//! file finds exactly what reading it front to back finds.

use longshore_shards::ShardError;
use longshore_shards::webdataset::{SampleWriter, ShardReader};
use proptest::prelude::*;
use std::io::Write;

fn valid_shard(sizes: &[(u8, usize)]) -> Vec<u8> {
    let mut w = SampleWriter::new("fuzz.tar", Vec::new());
    for (i, &(fill, n)) in sizes.iter().enumerate() {
        let key = if i % 3 == 0 {
            format!("k{i}")
        } else {
            format!("dir/{}/k{i}", "d".repeat(i * 20))
        };
        w.write(
            &key,
            &[("bin", &vec![fill; n]), ("cls", i.to_string().as_bytes())],
        )
        .unwrap();
    }
    w.finish().unwrap()
}

fn check_error(err: &ShardError, len: usize) {
    let (shard, offset) = match err {
        ShardError::Tar { shard, offset, .. } | ShardError::Sample { shard, offset, .. } => {
            (shard, *offset)
        }
        other => panic!("unexpected error kind: {other}"),
    };
    assert_eq!(shard, "fuzz.tar");
    assert!(
        offset <= len as u64 + 512,
        "offset {offset} past a {len}-byte shard"
    );
    assert!(err.to_string().contains("fuzz.tar"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mutated_shards_give_located_errors_not_panics(
        sizes in prop::collection::vec((any::<u8>(), 0usize..1500), 1..6),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0usize..512, any::<u8>()), 0..8),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let original = valid_shard(&sizes);
        let mut tar = original.clone();
        // Mostly header bytes: pick a 512-byte block, then a byte in it.
        for (block, offset, byte) in &flips {
            let i = block.index(tar.len() / 512) * 512 + offset;
            tar[i] = *byte;
        }
        if let Some(cut) = cut {
            tar.truncate(cut.index(tar.len()));
        }
        let results: Vec<_> = ShardReader::new("fuzz.tar", tar.as_slice()).samples().unwrap().collect();
        let mut errors = 0;
        for r in &results {
            if let Err(e) = r {
                check_error(e, tar.len());
                errors += 1;
            }
        }
        prop_assert!(errors <= 1, "iteration goes on after an error");
        if let Err(e) = ShardReader::new("fuzz.tar", tar.as_slice()).scan() {
            check_error(&e, tar.len());
        }
        // Seeking over member data finds what reading it finds, damage included.
        let (spans, error) = ShardReader::new("fuzz.tar", tar.as_slice()).scan_partial();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&tar).unwrap();
        let (seek_spans, seek_error) = ShardReader::scan_file("fuzz.tar", &file).unwrap();
        prop_assert_eq!(seek_spans, spans);
        prop_assert_eq!(
            seek_error.map(|e| e.to_string()),
            error.map(|e| e.to_string())
        );
        if tar == original {
            prop_assert_eq!(results.len(), sizes.len());
            prop_assert!(results.iter().all(Result::is_ok));
        }
    }
}
