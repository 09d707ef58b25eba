//! The committed bad-input fixtures (`tests/fixtures/`, also the fuzz target's seeds) give
//! the documented outcome.

use std::path::PathBuf;

use longshore_vision::decode::{DecodeError, DecodeOptions, decode_rgb};

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn fixtures_decode_or_fail_as_documented() {
    let opts = DecodeOptions::default();
    assert!(matches!(
        decode_rgb(&fixture("truncated.jpg"), &opts),
        Err(DecodeError::Jpeg(_))
    ));
    assert!(matches!(
        decode_rgb(&fixture("text.jpg"), &opts),
        Err(DecodeError::UnknownFormat { .. })
    ));
    assert_eq!(
        decode_rgb(&fixture("empty.jpg"), &opts),
        Err(DecodeError::Empty)
    );
    assert_eq!(
        decode_rgb(&fixture("one_pixel.png"), &opts)
            .unwrap()
            .as_bytes(),
        &[200, 100, 50]
    );
    assert!(matches!(
        decode_rgb(&fixture("bomb_60000x60000.jpg"), &opts),
        Err(DecodeError::TooManyPixels {
            width: 60000,
            height: 60000,
            ..
        })
    ));
}
