//! Bad `.npy` and record files give clear errors naming the file, never a panic.

use std::path::Path;

use longshore_data::formats::npy::{encode_header, encode_npy};
use longshore_data::{
    DType, DataError, Dataset, NpyArray, NpyDataset, NpyError, NpyShards, write_npy,
};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn missing_file_names_the_path() {
    let err = NpyArray::open("/nonexistent/longshore/x.npy").unwrap_err();
    assert!(matches!(err, DataError::Io { .. }));
    assert!(
        err.to_string().contains("/nonexistent/longshore/x.npy"),
        "{err}"
    );
}

#[test]
fn truncated_data_reports_expected_and_actual() {
    let dir = tempfile::tempdir().unwrap();
    let full = encode_npy(DType::F32, &[10, 4], &[0u8; 160]).unwrap();
    let p = write(dir.path(), "trunc.npy", &full[..full.len() - 7]);
    let err = NpyArray::open(&p).unwrap_err();
    match &err {
        DataError::Truncated {
            expected, actual, ..
        } => {
            assert_eq!(*expected, full.len() as u64);
            assert_eq!(*actual, full.len() as u64 - 7);
        }
        other => panic!("expected Truncated, got {other}"),
    }
    assert!(err.to_string().contains("trunc.npy"), "{err}");
}

#[test]
fn header_that_lies_about_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    // The header claims (1000, 4) f32 but only 16 rows follow.
    let mut bytes = encode_header(DType::F32, &[1000, 4]);
    let header_len = bytes.len() as u64;
    bytes.extend_from_slice(&[0u8; 16 * 16]);
    let p = write(dir.path(), "liar.npy", &bytes);
    let err = NpyArray::open(&p).unwrap_err();
    assert!(
        matches!(err, DataError::Truncated { expected, actual, .. } if expected == header_len + 16000 && actual == header_len + 256),
        "{err}"
    );
}

#[test]
fn truncated_header() {
    let dir = tempfile::tempdir().unwrap();
    let full = encode_header(DType::U8, &[3]);
    for cut in [0, 3, 7, 9, 20, full.len() - 1] {
        let p = write(dir.path(), "h.npy", &full[..cut]);
        let err = NpyArray::open(&p).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::Npy {
                    source: NpyError::Truncated { .. } | NpyError::BadMagic,
                    ..
                } | DataError::Io { .. }
            ),
            "cut {cut}: {err}"
        );
    }
}

#[test]
fn unknown_dtype_and_bad_magic_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let good = encode_header(DType::F32, &[2]);
    let text = String::from_utf8_lossy(&good[10..]).replace("<f4", "<q9");
    let mut bad = good[..10].to_vec();
    bad.extend_from_slice(text.as_bytes());
    bad.extend_from_slice(&[0; 8]);
    let p = write(dir.path(), "dt.npy", &bad);
    let err = NpyArray::open(&p).unwrap_err();
    assert!(report(&err).contains("'<q9'"), "{err}");

    let mut magic = good.clone();
    magic[1] = b'X';
    let p = write(dir.path(), "magic.npy", &magic);
    assert!(matches!(
        NpyArray::open(&p),
        Err(DataError::Npy {
            source: NpyError::BadMagic,
            ..
        })
    ));

    let mut version = good.clone();
    version[6] = 9;
    let p = write(dir.path(), "ver.npy", &version);
    let err = NpyArray::open(&p).unwrap_err();
    assert!(report(&err).contains("version 9.0"), "{err}");
}

#[test]
fn misaligned_data_is_an_error_not_ub() {
    // A hand-made v1 header whose data starts at offset 11 + header: not 4-byte aligned.
    let mut dict = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }".to_vec();
    while (10 + dict.len() + 1) % 4 != 1 {
        dict.push(b' ');
    }
    dict.push(b'\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&dict);
    assert_ne!(bytes.len() % 4, 0);
    bytes.extend_from_slice(bytemuck::cast_slice(&[1.5f32, 2.5]));
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "mis.npy", &bytes);
    let a = NpyArray::open(&p).unwrap();
    let err = a.as_slice::<f32>().unwrap_err();
    assert!(
        matches!(err, DataError::Misaligned { align: 4, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("mis.npy"), "{err}");
    // Copying reads still work.
    assert_eq!(
        a.to_tensor().unwrap().as_slice::<f32>().unwrap(),
        &[1.5, 2.5]
    );
    assert_eq!(
        NpyDataset::open(&p)
            .unwrap()
            .get(1)
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
        &[2.5]
    );
}

#[test]
fn dtype_mismatch_and_index_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    write_npy(&p, &[3, 2], &[1i32, 2, 3, 4, 5, 6]).unwrap();
    let a = NpyArray::open(&p).unwrap();
    let err = a.as_slice::<f32>().unwrap_err();
    assert!(matches!(
        err,
        DataError::DTypeMismatch {
            actual: DType::I32,
            requested: DType::F32,
            ..
        }
    ));
    let ds = NpyDataset::open(&p).unwrap();
    let err = ds.get(3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "index 3 out of range for npy dataset of length 3"
    );
}

#[test]
fn shards_must_agree_and_concatenate() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.npy");
    let b = dir.path().join("b.npy");
    let c = dir.path().join("c.npy");
    write_npy(&a, &[2, 2], &[0f32, 1., 2., 3.]).unwrap();
    write_npy(&b, &[3, 2], &[4f32, 5., 6., 7., 8., 9.]).unwrap();
    write_npy(&c, &[1, 3], &[0f32, 0., 0.]).unwrap();
    let s = NpyShards::open([&a, &b]).unwrap();
    assert_eq!(s.len(), 5);
    for i in 0..5 {
        let row = s.get(i).unwrap();
        assert_eq!(
            row.as_slice::<f32>().unwrap(),
            &[2.0 * i as f32, 2.0 * i as f32 + 1.0]
        );
    }
    assert!(matches!(
        s.get(5),
        Err(DataError::IndexOutOfRange {
            index: 5,
            len: 5,
            ..
        })
    ));
    let err = NpyShards::open([&a, &c]).unwrap_err();
    assert!(err.to_string().contains("c.npy"), "{err}");
    assert!(matches!(
        NpyShards::open(Vec::<&Path>::new()),
        Err(DataError::Empty { .. })
    ));
}

/// The error and its causes as a chain-walking report prints them (`anyhow`'s `{:#}`).
fn report(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out = format!("{out}: {e}");
        cur = e.source();
    }
    out
}
