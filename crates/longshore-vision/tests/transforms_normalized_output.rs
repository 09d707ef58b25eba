//! The normalised f32 output (`ToTensor()` + `Normalize`) is the u8 output of the same
//! pipeline, normalised: through the SIMD kernel (an f32-aligned slot, the pipeline's own
//! pixels, a flip applied to them first) and through the row-by-row fallback (a slot that is
//! not aligned for f32), with the same random crops and flips.

use longshore_data::rng::epoch_rng;
use longshore_vision::transforms::Normalize;
use longshore_vision::{Compose, Output, RgbImage};
use proptest::prelude::*;

fn image(w: usize, h: usize, seed: u32) -> RgbImage {
    let data = (0..w * h * 3)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 24) as u8)
        .collect();
    RgbImage::from_vec(w, h, data).unwrap()
}

/// Runs `pipeline` into a slot starting `offset` bytes into a buffer aligned for f32, and
/// returns the floats.
fn normalized(pipeline: &Compose, img: &RgbImage, epoch: u64, offset: usize) -> Vec<f32> {
    let n = pipeline.output_bytes();
    let mut backing = vec![0f32; n / 4 + 1];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut backing);
    let slot = &mut bytes[offset..offset + n];
    pipeline
        .apply_into(img, &mut epoch_rng(1, epoch), slot)
        .unwrap();
    slot.chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn check(pipeline: Compose, img: &RgbImage, epoch: u64) -> Result<(), TestCaseError> {
    let norm = Normalize::imagenet(longshore_data::ImageLayout::Hwc);
    let u8s = pipeline.clone().with_output(Output::U8Chw);
    let mut chw = vec![0u8; u8s.output_bytes()];
    u8s.apply_into(img, &mut epoch_rng(1, epoch), &mut chw)
        .unwrap();
    let pipeline = pipeline.with_output(Output::Normalized(norm.clone()));
    let plane = chw.len() / 3;
    for offset in [0, 1] {
        let got = normalized(&pipeline, img, epoch, offset);
        for (i, (&x, &y)) in chw.iter().zip(&got).enumerate() {
            let c = i / plane;
            let want = (f32::from(x) / 255.0 - norm.mean()[c]) / norm.std()[c];
            prop_assert!(
                (want - y).abs() <= 1e-5 * want.abs().max(1.0),
                "offset {} value {}: {} vs {}",
                offset,
                i,
                y,
                want
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn normalized_outputs_are_the_u8_outputs_normalized(
        w in 1usize..90,
        h in 1usize..90,
        seed in 0u32..1000,
        epoch in 0u64..1000,
    ) {
        let img = image(w, h, seed);
        // Train: a random box resized, flipped half the time. Val: resize + centre crop,
        // or padding when the image is smaller than the crop.
        check(Compose::train(17, Output::U8Chw), &img, epoch)?;
        check(Compose::val(20, 17, Output::U8Chw), &img, epoch)?;
        check(Compose::val(6, 17, Output::U8Chw), &img, epoch)?;
    }
}
