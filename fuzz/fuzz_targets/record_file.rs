//! A fixed-size record file with a layout drawn from the input: the first bytes choose the
//! record size, header length, byte order and up to four fields; the rest is the file. Opening
//! and reading every record (as tensors and field by field) never panics, and both reads agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longshore_data::formats::{RecordDataset, RecordLayout};
use longshore_data::{ByteOrder, DType, Dataset, DirectDataset};

fn scratch() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("longshore-fuzz-rec-{}.bin", std::process::id()))
}

fn layout(spec: &[u8]) -> Option<RecordLayout> {
    let record_size = u16::from_le_bytes([spec[0], spec[1]]) as usize % 300;
    let header = spec[2] as usize % 64;
    let order = if spec[3] & 1 == 1 {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };
    let mut l = RecordLayout::new(record_size)
        .ok()?
        .header_bytes(header)
        .byte_order(order);
    let nfields = 1 + spec[3] as usize / 64;
    for f in 0..nfields {
        let b = &spec[4 + 4 * f..8 + 4 * f];
        let dtype = DType::ALL[b[0] as usize % DType::ALL.len()];
        let shape: Vec<usize> = match b[1] % 3 {
            0 => vec![],
            1 => vec![b[2] as usize % 17],
            _ => vec![b[2] as usize % 9, b[1] as usize / 3 % 5],
        };
        // Offsets may be anything: past the record is an error the layout must refuse.
        l = match l.field(&format!("f{f}"), dtype, &shape, b[3] as usize) {
            Ok(l) => l,
            Err(_) => return None,
        };
    }
    Some(l)
}

fuzz_target!(|bytes: &[u8]| {
    if bytes.len() < 20 {
        return;
    }
    let (spec, file) = bytes.split_at(20);
    let Some(layout) = layout(spec) else { return };
    let path = scratch();
    std::fs::write(&path, file).expect("write the scratch file");
    let Ok(ds) = RecordDataset::open(&path, layout) else {
        return;
    };
    let fields = ds.fields().to_vec();
    for i in 0..ds.len().min(4096) {
        let tensors = ds.get(i).expect("an in-range record reads");
        assert_eq!(tensors.len(), fields.len());
        for (f, (t, spec)) in tensors.iter().zip(&fields).enumerate() {
            let mut out = vec![0u8; spec.nbytes().expect("field size")];
            ds.get_field_into(i, f, &mut out)
                .expect("an in-range field writes");
            assert_eq!(&out[..], t.bytes(), "record {i} field {f}");
        }
    }
    assert!(ds.get(ds.len()).is_err());
});
