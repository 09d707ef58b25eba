//! Fixed-size record files: layouts, byte order, and bad files.

use longshore_data::AccessPattern;
use longshore_data::{
    ByteOrder, DType, DataError, Dataset, DirectDataset, RecordDataset, RecordLayout,
};

#[test]
fn header_skip_big_endian_and_advice() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.bin");
    // 16-byte file header, then records of [u16 big-endian x2, pad 4, f64 big-endian].
    let mut bytes = vec![0xEEu8; 16];
    for i in 0..5u16 {
        bytes.extend_from_slice(&(i * 3).to_be_bytes());
        bytes.extend_from_slice(&(i * 3 + 1).to_be_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&(f64::from(i) / 4.0).to_be_bytes());
    }
    std::fs::write(&p, &bytes).unwrap();
    let layout = RecordLayout::new(16)
        .unwrap()
        .header_bytes(16)
        .byte_order(ByteOrder::Big)
        .field("pair", DType::U16, &[2], 0)
        .unwrap()
        .field("value", DType::F64, &[], 8)
        .unwrap();
    let ds = RecordDataset::open(&p, layout).unwrap();
    ds.advise(AccessPattern::Random).unwrap();
    ds.advise(AccessPattern::Sequential).unwrap();
    ds.advise(AccessPattern::WillNeed).unwrap();
    assert_eq!(ds.len(), 5);
    let r = ds.get(4).unwrap();
    assert_eq!(r[0].as_slice::<u16>().unwrap(), &[12, 13]);
    assert_eq!(r[1].as_slice::<f64>().unwrap(), &[1.0]);
    let mut out = [0u8; 8];
    ds.get_field_into(2, 1, &mut out).unwrap();
    assert_eq!(f64::from_ne_bytes(out), 0.5);
    assert!(matches!(
        ds.get_field_into(2, 2, &mut out),
        Err(DataError::IndexOutOfRange { .. })
    ));
    assert!(matches!(
        ds.get(5),
        Err(DataError::IndexOutOfRange {
            index: 5,
            len: 5,
            ..
        })
    ));
}

#[test]
fn bad_layouts_and_files() {
    assert!(RecordLayout::new(0).is_err());
    let err = RecordLayout::new(8)
        .unwrap()
        .field("x", DType::F64, &[2], 0)
        .unwrap_err();
    assert!(
        err.to_string().contains("field 'x' spans bytes 0..16"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("odd.bin");
    std::fs::write(&p, [0u8; 21]).unwrap();
    let layout = RecordLayout::packed(&[("x", DType::F32, &[2])]).unwrap();
    let err = RecordDataset::open(&p, layout.clone()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("odd.bin") && msg.contains("5 trailing bytes at offset 16"),
        "{msg}"
    );

    let e = dir.path().join("empty.bin");
    std::fs::write(&e, []).unwrap();
    let ds = RecordDataset::open(&e, layout.clone()).unwrap();
    assert!(ds.is_empty());
    assert!(ds.get(0).is_err());
    let err = RecordDataset::open(&e, layout.header_bytes(4)).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                expected: 4,
                actual: 0,
                ..
            }
        ),
        "{err}"
    );
}
