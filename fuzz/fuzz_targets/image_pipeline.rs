//! Decode + transform from arbitrary bytes: `decode_rgb` (JPEG or PNG, under a pixel limit
//! that keeps each input small), then PyTorch's ImageNet train and val pipelines at a small
//! size and every output layout. Nothing may panic; what decodes must transform into exactly
//! the declared number of bytes, and finite values; and `Compose::decode_into` (which decodes
//! only a leading crop's region of a JPEG) must give those very bytes. Seeds: `crates/longshore-vision/tests/
//! golden/*.{jpg,png}` and `crates/longshore-vision/tests/fixtures/*`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

use longshore_data::rng::epoch_rng;
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::{Compose, Output};

fuzz_target!(|bytes: &[u8]| {
    let opts = DecodeOptions::default().max_pixels(Some(4_000_000));
    let Ok(image) = decode_rgb(bytes, &opts) else {
        return;
    };
    assert_eq!(image.as_bytes().len(), image.width() * image.height() * 3);
    let seed = bytes.len() as u64;
    for pipeline in [
        Compose::train(24, Output::to_tensor()),
        Compose::val(28, 24, Output::U8Chw),
        Compose::train(17, Output::U8Hwc),
    ] {
        let tensor = pipeline
            .apply(&image, &mut epoch_rng(seed, 0))
            .expect("a decoded image transforms");
        assert_eq!(tensor.bytes().len(), pipeline.output_bytes());
        // The same file through the decode-for-a-pipeline path: region decoding must not
        // change a byte, nor fail where the whole decode succeeded.
        let mut direct = vec![0u8; pipeline.output_bytes()];
        pipeline
            .decode_into(Path::new("fuzz"), bytes, &opts, &mut epoch_rng(seed, 0), &mut direct)
            .expect("what decodes whole decodes for a pipeline");
        assert!(direct == tensor.bytes(), "region decoding changed the output");
        if let Ok(values) = tensor.as_slice::<f32>() {
            assert!(values.iter().all(|v| v.is_finite() && (0.0..=1.0).contains(v)));
        }
    }
});
