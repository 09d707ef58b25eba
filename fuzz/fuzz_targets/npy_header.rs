//! The `.npy` header parser on arbitrary bytes: never panics, and whatever parses is
//! self-consistent (data inside the input's reach, a computable data length) and re-encodes to
//! a header that parses to the same dtype and shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longshore_data::formats::npy::{encode_header, parse_header};

fuzz_target!(|bytes: &[u8]| {
    let Ok(h) = parse_header(bytes) else { return };
    assert!(h.data_offset <= bytes.len(), "data offset past the input");
    let Ok(_len) = h.data_len() else { return };
    let again = parse_header(&encode_header(h.dtype, &h.shape)).expect("re-encoded header parses");
    assert_eq!(again.dtype, h.dtype);
    assert_eq!(again.shape, h.shape);
});
