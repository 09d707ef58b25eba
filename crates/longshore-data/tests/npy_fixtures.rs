//! Reading `.npy` fixtures written by NumPy (see `fixtures/gen.py`), and a round trip
//! through NumPy itself when it is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use longshore_data::formats::npy::parse_header;
use longshore_data::{
    ByteOrder, DType, DataError, Dataset, DirectDataset, NpyArray, NpyDataset, NpyError, write_npy,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The fixture's values as f64, converting through the dtype.
fn values_f64(t: &longshore_data::Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::Bool => t.bytes().iter().map(|&b| f64::from(b)).collect(),
        DType::U8 => t
            .as_slice::<u8>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::I8 => t
            .as_slice::<i8>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::U16 => t
            .as_slice::<u16>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::I16 => t
            .as_slice::<i16>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::U32 => t
            .as_slice::<u32>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::I32 => t
            .as_slice::<i32>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::U64 => t
            .as_slice::<u64>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DType::I64 => t
            .as_slice::<i64>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DType::F16 => t
            .as_slice::<half::f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::F32 => t
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::F64 => t.as_slice::<f64>().unwrap().to_vec(),
        other => panic!("unexpected dtype {other}"),
    }
}

#[test]
fn every_little_endian_dtype_reads_as_arange() {
    let cases = [
        ("le_u1.npy", DType::U8),
        ("le_i1.npy", DType::I8),
        ("le_u2.npy", DType::U16),
        ("le_i2.npy", DType::I16),
        ("le_u4.npy", DType::U32),
        ("le_i4.npy", DType::I32),
        ("le_u8.npy", DType::U64),
        ("le_i8.npy", DType::I64),
        ("le_f2.npy", DType::F16),
        ("le_f4.npy", DType::F32),
        ("le_f8.npy", DType::F64),
        ("le_b1.npy", DType::Bool),
    ];
    for (name, dtype) in cases {
        let a = NpyArray::open(fixture(name)).unwrap();
        assert_eq!(a.dtype(), dtype, "{name}");
        assert_eq!(a.shape(), &[3, 4], "{name}");
        let t = a.to_tensor().unwrap();
        let expect: Vec<f64> = (0..12)
            .map(|i| {
                if dtype == DType::Bool {
                    f64::from(i % 2)
                } else {
                    f64::from(i)
                }
            })
            .collect();
        assert_eq!(values_f64(&t), expect, "{name}");
        // Rows through the dataset.
        let ds = NpyDataset::open(fixture(name)).unwrap();
        assert_eq!(ds.len(), 3);
        let row = ds.get(2).unwrap();
        assert_eq!(row.shape(), &[4]);
        assert_eq!(values_f64(&row), expect[8..12].to_vec(), "{name} row 2");
    }
}

#[test]
fn big_endian_is_converted_on_read() {
    for (name, dtype) in [
        ("be_u2.npy", DType::U16),
        ("be_i4.npy", DType::I32),
        ("be_i8.npy", DType::I64),
        ("be_f2.npy", DType::F16),
        ("be_f4.npy", DType::F32),
        ("be_f8.npy", DType::F64),
    ] {
        let a = NpyArray::open(fixture(name)).unwrap();
        assert_eq!(a.header().byte_order, ByteOrder::Big, "{name}");
        assert_eq!(a.dtype(), dtype);
        let expect: Vec<f64> = (0..12).map(f64::from).collect();
        assert_eq!(values_f64(&a.to_tensor().unwrap()), expect, "{name}");
        let ds = NpyDataset::open(fixture(name)).unwrap();
        assert_eq!(
            values_f64(&ds.get(1).unwrap()),
            expect[4..8].to_vec(),
            "{name}"
        );
        // The direct path converts too.
        let mut out = vec![0u8; 4 * dtype.size()];
        ds.get_field_into(1, 0, &mut out).unwrap();
        assert_eq!(out, ds.get(1).unwrap().bytes(), "{name}");
        // Zero-copy typed views refuse foreign byte order rather than lie.
        assert!(matches!(
            a.as_slice::<u16>(),
            Err(DataError::InvalidFile { .. }) | Err(DataError::DTypeMismatch { .. })
        ));
    }
}

#[test]
fn versions_two_and_three() {
    let a = NpyArray::open(fixture("v2_f4.npy")).unwrap();
    assert_eq!(a.header().version, (2, 0));
    assert_eq!(
        a.as_slice::<f32>().unwrap(),
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    );
    let b = NpyArray::open(fixture("v3_i2.npy")).unwrap();
    assert_eq!(b.header().version, (3, 0));
    assert_eq!(b.as_slice::<i16>().unwrap(), &[0, 1, 2, 3, 4]);
}

#[test]
fn scalar_and_empty_arrays() {
    let s = NpyArray::open(fixture("scalar_f8.npy")).unwrap();
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.as_slice::<f64>().unwrap(), &[7.5]);
    let err = NpyDataset::open(fixture("scalar_f8.npy")).unwrap_err();
    assert!(err.to_string().contains("0-dimensional"), "{err}");

    let e = NpyDataset::open(fixture("empty_f4.npy")).unwrap();
    assert_eq!(e.len(), 0);
    assert!(e.is_empty());
    let err = e.get(0).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::IndexOutOfRange {
                index: 0,
                len: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn fortran_order_is_refused_unless_one_dimensional() {
    let err = NpyArray::open(fixture("fortran_f4.npy")).unwrap_err();
    // The file in the error, the reason in its cause (each printed once by a report).
    let msg = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        msg.contains("fortran_order") && msg.contains("fortran_f4.npy"),
        "{msg}"
    );
    assert!(matches!(
        err,
        DataError::Npy {
            source: NpyError::FortranOrder(_),
            ..
        }
    ));
    // NumPy may flag a 1-D array as Fortran ordered; its layout is the same as C order.
    let a = NpyArray::open(fixture("fortran_1d_f4.npy")).unwrap();
    assert_eq!(a.as_slice::<f32>().unwrap(), &[0.0, 1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn unsupported_dtypes_are_named() {
    for name in ["structured.npy", "complex.npy"] {
        let err = NpyArray::open(fixture(name)).unwrap_err();
        assert!(
            matches!(
                &err,
                DataError::Npy {
                    source: NpyError::UnsupportedDType(_),
                    ..
                }
            ),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn writer_matches_numpy_header_bytes() {
    // NumPy's own header for a (3, 4) <f4 array, from the committed fixture.
    let numpy = std::fs::read(fixture("le_f4.npy")).unwrap();
    let ours = longshore_data::formats::npy::encode_npy(
        DType::F32,
        &[3, 4],
        bytemuck::cast_slice(&(0..12).map(|i| i as f32).collect::<Vec<_>>()),
    )
    .unwrap();
    assert_eq!(ours, numpy);
    let h = parse_header(&ours).unwrap();
    assert_eq!(h.data_offset % 64, 0);
}

fn numpy_available() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn round_trip_through_numpy_when_installed() {
    if !numpy_available() {
        println!("skipping round_trip_through_numpy_when_installed: python3 with numpy not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Ours -> NumPy.
    let ours = dir.path().join("ours.npy");
    let data: Vec<i64> = (0..24).map(|i| i * 1_000_000_007 - 5).collect();
    write_npy(&ours, &[2, 3, 4], &data).unwrap();
    let script = format!(
        "import numpy as np\na = np.load(r'{}')\nassert a.dtype == np.int64 and a.shape == (2, 3, 4), (a.dtype, a.shape)\n\
         assert (a.ravel() == np.arange(24, dtype=np.int64) * 1000000007 - 5).all()\n\
         np.save(r'{}', (np.arange(60, dtype='>f4') / 7).reshape(5, 12))",
        ours.display(),
        dir.path().join("theirs.npy").display()
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "numpy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // NumPy -> ours (big endian f4).
    let ds = NpyDataset::open(dir.path().join("theirs.npy")).unwrap();
    assert_eq!(ds.len(), 5);
    let row = ds.get(3).unwrap();
    let expect: Vec<f32> = (36..48).map(|i| i as f32 / 7.0).collect();
    assert_eq!(row.as_slice::<f32>().unwrap(), expect.as_slice());
}
