//! Fuzzing the `.npy` header parser with proptest: arbitrary bytes and mutated valid
//! headers never panic, and whatever parses is self-consistent. Encoded headers
//! always parse back to what was encoded.
//!
//! Case counts per `cargo test` run (also recorded in `docs/benchmarks.md`):
//! 2048 arbitrary inputs, 2048 mutated headers, 512 round trips.

use longshore_data::DType;
use longshore_data::formats::npy::{encode_header, parse_header};
use proptest::prelude::*;

fn dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

fn check_consistent(bytes: &[u8]) {
    if let Ok(h) = parse_header(bytes) {
        assert!(h.data_offset <= bytes.len());
        assert!(h.data_len().is_ok());
        assert!([(1, 0), (2, 0), (3, 0)].contains(&h.version));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..300), magic in any::<bool>()) {
        if magic && bytes.len() >= 10 {
            bytes[..6].copy_from_slice(b"\x93NUMPY");
            bytes[6] = 1 + bytes[6] % 3;
            bytes[7] = 0;
        }
        check_consistent(&bytes);
    }

    #[test]
    fn mutated_headers_never_panic(
        dtype in dtype(),
        shape in proptest::collection::vec(0usize..100_000, 0..5),
        mutations in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut bytes = encode_header(dtype, &shape);
        for (at, value) in mutations {
            let i = at.index(bytes.len());
            // Favour bytes of the dict's syntax so mutations reach deep parser states.
            bytes[i] = match value % 8 {
                0 => b'(',
                1 => b')',
                2 => b',',
                3 => b'\'',
                4 => b'9',
                _ => value,
            };
        }
        if do_cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        check_consistent(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn encoded_headers_parse_back(dtype in dtype(), shape in proptest::collection::vec(0usize..1_000_000, 0..6)) {
        let bytes = encode_header(dtype, &shape);
        prop_assert_eq!(bytes.len() % 64, 0);
        let size = shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d));
        let parsed = parse_header(&bytes);
        if size.is_none() {
            prop_assert!(matches!(parsed, Err(longshore_data::NpyError::ShapeOverflow(_))));
            return Ok(());
        }
        let h = parsed.unwrap();
        prop_assert_eq!(h.dtype, dtype);
        prop_assert_eq!(h.shape, shape);
        prop_assert_eq!(h.data_offset, bytes.len());
    }
}

#[test]
fn deeply_nested_tuples_are_refused_not_overflowed() {
    let mut dict = String::from("{'descr': '<f4', 'fortran_order': False, 'shape': ");
    dict.push_str(&"(".repeat(10_000));
    dict.push('}');
    let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
    bytes.extend_from_slice(&(dict.len() as u32).to_le_bytes());
    bytes.extend_from_slice(dict.as_bytes());
    let err = parse_header(&bytes).unwrap_err();
    assert!(err.to_string().contains("nesting too deep"), "{err}");
}

#[test]
fn python2_long_suffix_and_double_quotes() {
    let dict = "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (3L, 2L), }\n";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    bytes.extend_from_slice(dict.as_bytes());
    let h = parse_header(&bytes).unwrap();
    assert_eq!(h.shape, vec![3, 2]);
    assert_eq!(h.dtype, DType::I64);
}
