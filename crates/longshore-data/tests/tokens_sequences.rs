//! `TokenSequences` against a reference built from the concatenated stream: every sequence's
//! inputs, targets, positions and document ids, for random files (empty ones included),
//! token widths, output dtypes, sequence lengths, targets on or off and separators; the count
//! of sequences and of tokens left over; and bad files named.

use std::path::PathBuf;

use longshore_data::formats::tokens::TokenSequences;
use longshore_data::{DType, DataError, Dataset, DirectDataset};
use proptest::prelude::*;

fn write(dir: &std::path::Path, name: &str, tokens: &[u32], width: usize) -> PathBuf {
    let path = dir.join(name);
    let bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|&t| {
            if width == 2 {
                (t as u16).to_le_bytes().to_vec()
            } else {
                t.to_le_bytes().to_vec()
            }
        })
        .collect();
    std::fs::write(&path, bytes).unwrap();
    path
}

fn ints(t: &longshore_data::Tensor, dtype: DType) -> Vec<i64> {
    if dtype == DType::I64 {
        t.as_slice::<i64>().unwrap().to_vec()
    } else {
        t.as_slice::<i32>()
            .unwrap()
            .iter()
            .map(|&v| v.into())
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn sequences_are_slices_of_the_stream(
        files in proptest::collection::vec(proptest::collection::vec(0u32..12, 0..40), 1..5),
        wide in any::<bool>(),
        i32_out in any::<bool>(),
        seq_len in 1usize..9,
        targets in any::<bool>(),
        separator in proptest::option::of(0u32..12),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let width = if wide { 4 } else { 2 };
        let paths: Vec<PathBuf> = files
            .iter()
            .enumerate()
            .map(|(i, f)| write(dir.path(), &format!("{i}.bin"), f, width))
            .collect();
        let out = if i32_out { DType::I32 } else { DType::I64 };
        let mut b = TokenSequences::builder(&paths)
            .seq_len(seq_len)
            .token_dtype(if wide { DType::U32 } else { DType::U16 })
            .output_dtype(out)
            .targets(targets);
        if let Some(sep) = separator {
            b = b.documents(sep);
        }
        let seqs = b.build().unwrap();

        // The reference: the stream, and for each token its document's start.
        let stream: Vec<i64> = files.iter().flatten().map(|&t| i64::from(t)).collect();
        let mut doc_start = Vec::with_capacity(stream.len());
        let mut doc_index = Vec::with_capacity(stream.len());
        let (mut start, mut index) = (0usize, 0i64);
        let mut at = 0usize;
        for f in &files {
            for (j, &t) in f.iter().enumerate() {
                if j == 0 && at > 0 && at != start {
                    // A file's first token starts a document.
                    start = at;
                    index += 1;
                }
                doc_start.push(start);
                doc_index.push(index);
                at += 1;
                if Some(t) == separator {
                    start = at;
                    index += 1;
                }
            }
        }
        let extra = usize::from(targets);
        let want_len = if stream.len() >= seq_len + extra { (stream.len() - extra) / seq_len } else { 0 };
        prop_assert_eq!(seqs.len(), want_len);
        prop_assert_eq!(seqs.total_tokens(), stream.len() as u64);
        let read = if want_len == 0 { 0 } else { want_len * seq_len + extra };
        prop_assert_eq!(seqs.dropped_tokens(), (stream.len() - read) as u64);
        let names = seqs.field_names().to_vec();
        prop_assert_eq!(names.len(), seqs.fields().len());
        for k in 0..seqs.len() {
            let s = seqs.get(k).unwrap();
            let from = k * seq_len;
            for (name, t) in names.iter().zip(&s) {
                prop_assert_eq!(t.dtype(), out);
                prop_assert_eq!(t.shape(), &[seq_len]);
                let got = ints(t, out);
                let want: Vec<i64> = match *name {
                    "input_ids" => stream[from..from + seq_len].to_vec(),
                    "targets" => stream[from + 1..from + 1 + seq_len].to_vec(),
                    "position_ids" => (from..from + seq_len).map(|i| (i - doc_start[i]) as i64).collect(),
                    "document_ids" => (from..from + seq_len).map(|i| doc_index[i] - doc_index[from]).collect(),
                    other => panic!("unknown field {other}"),
                };
                prop_assert_eq!(got, want, "field {} of sequence {}", name, k);
            }
        }
        prop_assert!(seqs.get(seqs.len()).is_err());
    }
}

#[test]
fn a_file_of_a_partial_token_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "a.bin", &[1, 2, 3], 2);
    let bad = dir.path().join("b.bin");
    std::fs::write(&bad, [1u8, 0, 2]).unwrap();
    let e = TokenSequences::builder([&good, &bad])
        .seq_len(2)
        .build()
        .unwrap_err();
    match &e {
        DataError::InvalidFile { path, reason } => {
            assert_eq!(path, &bad);
            assert!(
                reason.contains("3 bytes") && reason.contains("byte 2"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let missing = dir.path().join("missing.bin");
    let e = TokenSequences::builder([&missing]).build().unwrap_err();
    assert!(
        matches!(&e, DataError::Io { path, .. } if *path == missing),
        "{e:?}"
    );
}

#[test]
fn arguments_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "a.bin", &[1, 2, 3], 2);
    let err = |b: longshore_data::formats::tokens::TokenSequencesBuilder| {
        b.build().unwrap_err().to_string()
    };
    assert!(err(TokenSequences::builder(Vec::<PathBuf>::new())).contains("no token files"));
    assert!(err(TokenSequences::builder([&p]).seq_len(0)).contains("seq_len"));
    assert!(err(TokenSequences::builder([&p]).token_dtype(DType::I64)).contains("u16 or u32"));
    assert!(err(TokenSequences::builder([&p]).output_dtype(DType::F32)).contains("i64 or i32"));
    assert!(err(TokenSequences::builder([&p]).documents(70_000)).contains("u16"));
}

#[test]
fn u32_tokens_past_i32_need_i64_output() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "a.bin", &[1, u32::MAX, 3, 4, 5], 4);
    let seqs = TokenSequences::builder([&p])
        .seq_len(2)
        .token_dtype(DType::U32)
        .output_dtype(DType::I32)
        .build()
        .unwrap();
    let e = seqs.get(0).unwrap_err().to_string();
    assert!(e.contains("4294967295") && e.contains("i64"), "{e}");
    assert!(seqs.get(1).is_ok());
}
