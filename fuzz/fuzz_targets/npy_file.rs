//! A whole `.npy` file from arbitrary bytes: open it (mmap), then read it every way a user can
//! (typed slice, tensor, every row through `get` and `get_field_into`). Nothing may panic, and
//! every row read must agree with the array's raw bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longshore_data::formats::{NpyArray, NpyDataset};
use longshore_data::{Dataset, DirectDataset};

fn scratch() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("longshore-fuzz-npy-{}.npy", std::process::id()))
}

fuzz_target!(|bytes: &[u8]| {
    let path = scratch();
    std::fs::write(&path, bytes).expect("write the scratch file");
    let Ok(array) = NpyArray::open(&path) else {
        return;
    };
    let raw = array.raw_bytes().len();
    let _ = array.as_slice::<u8>();
    let _ = array.as_slice::<f32>();
    if let Ok(t) = array.to_tensor() {
        assert_eq!(t.bytes().len(), raw);
    }
    let Ok(ds) = NpyDataset::from_array(array) else {
        return;
    };
    // Cap the rows read so a file with many zero-sized rows stays fast.
    let rows = ds.len().min(4096);
    let row_bytes = ds.row_bytes();
    let mut out = vec![0u8; row_bytes];
    for i in 0..rows {
        let t = ds.get(i).expect("an in-range row reads");
        assert_eq!(t.bytes().len(), row_bytes);
        ds.get_field_into(i, 0, &mut out)
            .expect("an in-range row writes");
        assert_eq!(&out[..], t.bytes());
    }
    assert!(ds.get(ds.len()).is_err());
});
