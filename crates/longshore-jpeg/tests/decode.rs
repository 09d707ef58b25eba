//! longshore-jpeg against whole decodes and a second decoder: a region's pixels are the whole
//! image's, bit for bit, over subsamplings, progressive files, restart intervals, grey images
//! and sizes that are no multiple of a block; damaged files are errors naming what is wrong.

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use longshore_jpeg::{ColorModel, JpegError, Region, decode_rgb, read_header};
use proptest::prelude::*;

/// A photo-like test image: smooth gradients (chroma that upsampling interpolates) plus
/// noise (edges), from `seed`.
fn pixels(width: usize, height: usize, channels: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(width * height * channels);
    for y in 0..height {
        for x in 0..width {
            for c in 0..channels {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let smooth = (x * (3 + c) + y * (5 - c) + (c * 80)) % 256;
                out.push((smooth as u64 + (s % 48)).min(255) as u8);
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Form {
    sampling: SamplingFactor,
    progressive: bool,
    restart: u16,
    grey: bool,
}

impl Form {
    /// A colour file of `sampling`, no restart markers.
    fn color(sampling: SamplingFactor, progressive: bool) -> Form {
        Form {
            sampling,
            progressive,
            restart: 0,
            grey: false,
        }
    }
}

fn encode(width: usize, height: usize, form: Form, seed: u64) -> Vec<u8> {
    let channels = if form.grey { 1 } else { 3 };
    let px = pixels(width, height, channels, seed);
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, 88);
    e.set_sampling_factor(form.sampling);
    e.set_progressive(form.progressive);
    if form.restart > 0 {
        e.set_restart_interval(form.restart);
    }
    let color = if form.grey {
        ColorType::Luma
    } else {
        ColorType::Rgb
    };
    e.encode(&px, width as u16, height as u16, color).unwrap();
    out
}

fn whole(jpeg: &[u8]) -> (Vec<u8>, usize, usize) {
    let mut out = Vec::new();
    let d = decode_rgb(jpeg, |_| Ok::<_, JpegError>(None), &mut out).unwrap();
    (out, d.region.width, d.region.height)
}

fn form() -> impl Strategy<Value = Form> {
    let sampling = prop_oneof![
        Just(SamplingFactor::R_4_4_4),
        Just(SamplingFactor::R_4_2_2),
        Just(SamplingFactor::R_4_2_0),
        Just(SamplingFactor::R_4_4_0),
        Just(SamplingFactor::R_4_1_1),
    ];
    (
        sampling,
        any::<bool>(),
        prop_oneof![Just(0u16), 1u16..5],
        prop::bool::weighted(0.15),
    )
        .prop_map(|(sampling, progressive, restart, grey)| Form {
            sampling,
            progressive,
            restart,
            grey,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// The invariant a cropping pipeline relies on: decoding a region gives exactly the
    /// region's pixels of the whole decode.
    #[test]
    fn a_region_is_the_whole_decode_cut(
        width in 1usize..140,
        height in 1usize..140,
        form in form(),
        seed in any::<u64>(),
        corners in (0.0f64..1.0, 0.0f64..1.0, 0.0f64..1.0, 0.0f64..1.0),
    ) {
        let jpeg = encode(width, height, form, seed);
        let (full, w, h) = whole(&jpeg);
        prop_assert_eq!((w, h), (width, height));
        let (a, b, c, d) = corners;
        let left = (a * width as f64) as usize;
        let top = (b * height as f64) as usize;
        let rw = 1 + (c * (width - left) as f64) as usize;
        let rh = 1 + (d * (height - top) as f64) as usize;
        let (rw, rh) = (rw.min(width - left), rh.min(height - top));
        let mut out = Vec::new();
        let got = decode_rgb(&jpeg, |_| Ok::<_, JpegError>(Some(Region::new(left, top, rw, rh))), &mut out)
            .unwrap();
        prop_assert_eq!(got.region, Region::new(left, top, rw, rh));
        prop_assert_eq!(out.len(), rw * rh * 3);
        for y in 0..rh {
            let want = &full[((top + y) * width + left) * 3..][..rw * 3];
            let row = &out[y * rw * 3..][..rw * 3];
            prop_assert!(row == want, "row {} of region {:?} differs ({:?})", y, got.region, form);
        }
    }
}

/// Narrow regions at every column and row, where libjpeg-turbo would upsample a crop a few
/// chroma samples wide without interpolation (the case the proptest found): the whole decode's
/// pixels, for every subsampling and tiny heights.
#[test]
fn narrow_regions_at_every_column_and_row() {
    let samplings = [
        SamplingFactor::R_4_2_0,
        SamplingFactor::R_4_2_2,
        SamplingFactor::R_4_1_1,
        SamplingFactor::R_4_4_0,
        SamplingFactor::R_4_4_4,
    ];
    for (i, sampling) in samplings.into_iter().enumerate() {
        for (width, height) in [(37usize, 4usize), (9, 3), (70, 17), (33, 1)] {
            let form = Form::color(sampling, i % 2 == 1);
            let jpeg = encode(width, height, form, i as u64);
            let (full, _, _) = whole(&jpeg);
            let mut out = Vec::new();
            for left in 0..width {
                for top in 0..height {
                    for (rw, rh) in [(1, 1), (1, 2), (2, 1), (3, 3), (5, 2)] {
                        let (rw, rh) = (rw.min(width - left), rh.min(height - top));
                        let region = Region::new(left, top, rw, rh);
                        decode_rgb(&jpeg, |_| Ok::<_, JpegError>(Some(region)), &mut out).unwrap();
                        for y in 0..rh {
                            let want = &full[((top + y) * width + left) * 3..][..rw * 3];
                            assert_eq!(
                                &out[y * rw * 3..][..rw * 3],
                                want,
                                "{sampling:?} {width}x{height}, region {region:?}, row {y}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Whole decodes agree with zune-jpeg (another decoder of the same files) within the IDCT's
/// and upsampling's rounding: checks the colour conversion and the row order.
#[test]
fn whole_decodes_match_a_second_decoder() {
    use zune_core::bytestream::ZCursor;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;
    for (i, sampling) in [SamplingFactor::R_4_4_4, SamplingFactor::R_4_2_0]
        .into_iter()
        .enumerate()
    {
        let form = Form::color(sampling, i == 1);
        let jpeg = encode(97, 61, form, 7 + i as u64);
        let (ours, w, h) = whole(&jpeg);
        let options = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
        let mut z = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(&jpeg[..]), options);
        let theirs = z.decode().unwrap();
        assert_eq!((w, h), (97, 61));
        assert_eq!(ours.len(), theirs.len());
        let diff: Vec<i32> = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (*a as i32 - *b as i32).abs())
            .collect();
        let mean = diff.iter().sum::<i32>() as f64 / diff.len() as f64;
        let max = *diff.iter().max().unwrap();
        assert!(
            mean < 1.0 && max <= 16,
            "{sampling:?}: mean {mean}, max {max}"
        );
    }
}

#[test]
fn grey_files_decode_to_equal_channels() {
    let form = Form {
        grey: true,
        ..Form::color(SamplingFactor::R_4_4_4, false)
    };
    let jpeg = encode(33, 17, form, 3);
    assert_eq!(read_header(&jpeg).unwrap().color, ColorModel::Grayscale);
    let (px, _, _) = whole(&jpeg);
    assert!(px.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
}

#[test]
fn the_header_comes_first_and_admit_can_refuse() {
    let form = Form::color(SamplingFactor::R_4_2_0, false);
    let jpeg = encode(40, 30, form, 1);
    let h = read_header(&jpeg).unwrap();
    assert_eq!(
        (h.width, h.height, h.components, h.color),
        (40, 30, 3, ColorModel::YCbCr)
    );
    #[derive(Debug, PartialEq)]
    enum Mine {
        TooBig(u64),
        Jpeg(JpegError),
    }
    impl From<JpegError> for Mine {
        fn from(e: JpegError) -> Self {
            Mine::Jpeg(e)
        }
    }
    let mut out = vec![1, 2, 3];
    let r = decode_rgb(&jpeg, |h| Err(Mine::TooBig(h.pixels())), &mut out);
    assert_eq!(r, Err(Mine::TooBig(1200)));
    // Outside the image, or empty: refused, not clamped.
    for region in [
        Region::new(30, 0, 11, 5),
        Region::new(0, 29, 5, 2),
        Region::new(3, 3, 0, 4),
    ] {
        let r = decode_rgb(&jpeg, |_| Ok::<_, JpegError>(Some(region)), &mut out);
        assert_eq!(
            r,
            Err(JpegError::Region {
                region,
                width: 40,
                height: 30
            })
        );
    }
}

#[test]
fn damaged_files_are_errors_naming_the_damage() {
    let form = Form::color(SamplingFactor::R_4_2_0, false);
    let jpeg = encode(64, 64, form, 9);
    let mut out = Vec::new();
    let decode =
        |bytes: &[u8], out: &mut Vec<u8>| decode_rgb(bytes, |_| Ok::<_, JpegError>(None), out);
    // Cut in the entropy-coded data: libjpeg would fill the rest with grey; here an error.
    let cut = &jpeg[..jpeg.len() * 2 / 3];
    let e = decode(cut, &mut out).unwrap_err();
    assert!(e.to_string().contains("Premature end of JPEG file"), "{e}");
    // A region whose rows all lie before the cut: still an error (the file is damaged,
    // whichever crop an epoch draws), for every region and a few cut points.
    for keep in [jpeg.len() - 3, jpeg.len() - 200, jpeg.len() / 2] {
        for region in [
            Region::new(0, 0, 64, 8),
            Region::new(8, 0, 16, 4),
            Region::new(0, 8, 3, 3),
        ] {
            let r = decode_rgb(
                &jpeg[..keep],
                |_| Ok::<_, JpegError>(Some(region)),
                &mut out,
            );
            let e = r.unwrap_err();
            assert!(
                e.to_string().contains("Premature end"),
                "{region:?} of {keep} bytes: {e}"
            );
        }
    }
    // Bytes appended after the end-of-image marker: the file is whole, regions decode (read
    // through the image's last row) and equal the whole decode's pixels.
    let mut padded = jpeg.clone();
    padded.extend_from_slice(&[0u8; 100]);
    let (full, _, _) = whole(&padded);
    let region = Region::new(5, 7, 20, 9);
    decode_rgb(&padded, |_| Ok::<_, JpegError>(Some(region)), &mut out).unwrap();
    for y in 0..9 {
        assert_eq!(&out[y * 60..][..60], &full[((7 + y) * 64 + 5) * 3..][..60]);
    }
    // Cut in the header.
    let e = decode(&jpeg[..40], &mut out).unwrap_err();
    assert!(matches!(e, JpegError::Corrupt { .. }), "{e}");
    // Not a JPEG; empty.
    let e = decode(b"\x89PNG\r\n\x1a\n0000", &mut out).unwrap_err();
    assert!(e.to_string().contains("Not a JPEG file"), "{e}");
    let e = read_header(b"").unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    // Entropy-coded bytes overwritten with a marker: corrupt data, an error.
    let mut bad = jpeg.clone();
    let mid = bad.len() / 2;
    bad[mid] = 0xFF;
    bad[mid + 1] = 0xD9;
    let e = decode(&bad, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("Corrupt JPEG data") || e.to_string().contains("Premature end"),
        "{e}"
    );
    // Every prefix: an error or a decode, never a panic or a print.
    for n in (0..jpeg.len()).step_by(37) {
        let _ = decode(&jpeg[..n], &mut out);
    }
}

#[test]
fn cmyk_is_named_for_another_decoder() {
    let px = pixels(16, 16, 4, 5);
    let mut jpeg = Vec::new();
    Encoder::new(&mut jpeg, 90)
        .encode(&px, 16, 16, ColorType::Cmyk)
        .unwrap();
    let mut out = Vec::new();
    let e = decode_rgb(&jpeg, |_| Ok::<_, JpegError>(None), &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            JpegError::UnsupportedColor(ColorModel::Cmyk | ColorModel::Ycck)
        ),
        "{e}"
    );
}
