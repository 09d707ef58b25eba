//! The workers' marker walk (`JpegHeader::walk`, `JpegRoute`), on the CPU: generated JPEGs of
//! every kind the device stage meets (baseline 4:2:0 / 4:2:2 / 4:4:4 / 4:4:0, grayscale,
//! progressive, restart markers, CMYK), the bad-input fixtures, agreement with zune-jpeg's
//! header decode under proptest, and the route EncodedImages gives each file.

use std::path::Path;

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use longshore_nvjpeg::header::{Coding, HeaderError, route};
use longshore_nvjpeg::{EncodedImages, JpegHeader, JpegRoute, Payload};
use longshore_vision::{Compose, ImageFolder};
use proptest::prelude::*;
use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;

#[derive(Debug, Clone, Copy)]
struct Kind {
    color: ColorType,
    sampling: SamplingFactor,
    progressive: bool,
    restart: u16,
}

fn pixels(w: u16, h: u16, channels: usize, seed: u32) -> Vec<u8> {
    (0..usize::from(w) * usize::from(h) * channels)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn encode(w: u16, h: u16, k: Kind, seed: u32) -> Vec<u8> {
    let channels = match k.color {
        ColorType::Luma => 1,
        ColorType::Cmyk => 4,
        _ => 3,
    };
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, 90);
    e.set_progressive(k.progressive);
    e.set_sampling_factor(k.sampling);
    if k.restart > 0 {
        e.set_restart_interval(k.restart);
    }
    e.encode(&pixels(w, h, channels, seed), w, h, k.color)
        .unwrap();
    out
}

fn kind(color: ColorType, sampling: SamplingFactor) -> Kind {
    Kind {
        color,
        sampling,
        progressive: false,
        restart: 0,
    }
}

/// zune-jpeg's view: (width, height, components, progressive).
fn zune(bytes: &[u8]) -> Option<(usize, usize, u8, bool)> {
    let mut d = JpegDecoder::new(ZCursor::new(bytes));
    d.decode_headers().ok()?;
    let info = d.info()?;
    Some((
        usize::from(info.width),
        usize::from(info.height),
        info.components,
        // zune-jpeg's SOFMarkers is not exported by name; its Debug form is the variant.
        format!("{:?}", info.sof).starts_with("Progressive"),
    ))
}

#[test]
fn generated_jpegs_are_walked_and_routed_by_kind() {
    let cases = [
        (
            kind(ColorType::Rgb, SamplingFactor::R_4_2_0),
            (2, 2),
            3,
            JpegRoute::Hardware,
        ),
        (
            kind(ColorType::Rgb, SamplingFactor::R_4_4_4),
            (1, 1),
            3,
            JpegRoute::Hardware,
        ),
        (
            kind(ColorType::Rgb, SamplingFactor::R_4_2_2),
            (2, 1),
            3,
            JpegRoute::Hardware,
        ),
        (
            kind(ColorType::Rgb, SamplingFactor::R_4_4_0),
            (1, 2),
            3,
            JpegRoute::Hardware,
        ),
        (
            kind(ColorType::Rgb, SamplingFactor::F_2_4),
            (2, 4),
            3,
            JpegRoute::Check,
        ),
        (
            kind(ColorType::Luma, SamplingFactor::R_4_4_4),
            (1, 1),
            1,
            JpegRoute::Hardware,
        ),
        (
            kind(ColorType::Cmyk, SamplingFactor::R_4_4_4),
            (1, 1),
            4,
            JpegRoute::Check,
        ),
        (
            Kind {
                progressive: true,
                ..kind(ColorType::Rgb, SamplingFactor::R_4_2_0)
            },
            (2, 2),
            3,
            JpegRoute::CpuHuffman,
        ),
        (
            Kind {
                progressive: true,
                ..kind(ColorType::Luma, SamplingFactor::R_4_4_4)
            },
            (1, 1),
            1,
            JpegRoute::CpuHuffman,
        ),
        (
            Kind {
                restart: 2,
                ..kind(ColorType::Rgb, SamplingFactor::R_4_2_0)
            },
            (2, 2),
            3,
            JpegRoute::Hardware,
        ),
    ];
    for (k, y_sampling, components, want) in cases {
        let bytes = encode(67, 41, k, 1);
        let h = JpegHeader::walk(&bytes).unwrap();
        assert_eq!((h.width, h.height), (67, 41), "{k:?}");
        assert_eq!(h.components, components, "{k:?}");
        assert_eq!(h.precision, 8);
        assert!(h.has_eoi);
        if components > 1 {
            assert_eq!(h.sampling[0], y_sampling, "{k:?}");
        }
        assert_eq!(
            h.coding,
            if k.progressive {
                Coding::Progressive
            } else {
                Coding::Baseline
            }
        );
        assert_eq!(h.restart_interval, k.restart, "{k:?}");
        assert_eq!(h.route(), want, "{k:?}");
        assert_eq!(route(&bytes), want);
        let (w, hh, c, progressive) = zune(&bytes).unwrap();
        assert_eq!((w, hh, c, progressive), (67, 41, components, k.progressive));
        // Cut short (a truncated download): no end-of-image marker, so never trusted.
        let cut = &bytes[..bytes.len() * 2 / 3];
        let h = JpegHeader::walk(cut).unwrap();
        assert!(!h.has_eoi);
        assert_ne!(h.route(), JpegRoute::Hardware, "{k:?}");
    }
}

#[test]
fn the_bad_input_fixtures_are_walked_without_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../longshore-vision/tests/fixtures");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    assert_eq!(
        JpegHeader::walk(&read("empty.jpg")),
        Err(HeaderError::NotJpeg)
    );
    assert_eq!(
        JpegHeader::walk(&read("text.jpg")),
        Err(HeaderError::NotJpeg)
    );
    assert_eq!(route(&read("text.jpg")), JpegRoute::Check);
    assert_eq!(route(&read("one_pixel.png")), JpegRoute::Check);
    let bomb = JpegHeader::walk(&read("bomb_60000x60000.jpg")).unwrap();
    assert_eq!((bomb.width, bomb.height), (60_000, 60_000));
    let truncated = read("truncated.jpg");
    let h = JpegHeader::walk(&truncated).unwrap();
    assert!(!h.has_eoi);
    assert_ne!(h.route(), JpegRoute::Hardware);
}

#[test]
fn encoded_images_carry_the_walks_route() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("c");
    std::fs::create_dir_all(&root).unwrap();
    let files = [
        (
            "a_baseline.jpg",
            kind(ColorType::Rgb, SamplingFactor::R_4_2_0),
        ),
        ("b_grey.jpg", kind(ColorType::Luma, SamplingFactor::R_4_4_4)),
        ("c_cmyk.jpg", kind(ColorType::Cmyk, SamplingFactor::R_4_4_4)),
        (
            "d_progressive.jpg",
            Kind {
                progressive: true,
                ..kind(ColorType::Rgb, SamplingFactor::R_4_2_0)
            },
        ),
        (
            "e_restart.jpg",
            Kind {
                restart: 1,
                ..kind(ColorType::Rgb, SamplingFactor::R_4_4_4)
            },
        ),
    ];
    for (name, k) in files {
        std::fs::write(root.join(name), encode(50, 30, k, 7)).unwrap();
    }
    let data = EncodedImages::new(
        ImageFolder::new(dir.path())
            .unwrap()
            .with_transform(Compose::imagenet_train()),
    )
    .unwrap();
    let got: Vec<(Payload, bool)> = (0..files.len())
        .map(|i| {
            let s = data.read(i).unwrap();
            (s.payload, s.hardware)
        })
        .collect();
    assert_eq!(
        got,
        [
            (Payload::Jpeg, true),
            (Payload::Jpeg, true),
            (Payload::Jpeg, false),
            (Payload::Rgb, false),
            (Payload::Jpeg, true),
        ]
    );
}

fn sampling() -> impl Strategy<Value = SamplingFactor> {
    prop::sample::select(vec![
        SamplingFactor::R_4_4_4,
        SamplingFactor::R_4_2_0,
        SamplingFactor::R_4_2_2,
        SamplingFactor::R_4_4_0,
        SamplingFactor::R_4_1_1,
        SamplingFactor::F_2_4,
    ])
}

fn color() -> impl Strategy<Value = ColorType> {
    prop::sample::select(vec![ColorType::Rgb, ColorType::Luma, ColorType::Cmyk])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// On every file the encoder makes, the walk agrees with zune-jpeg's header decode, and
    /// routes to the engines only baseline 1- or 3-component files.
    #[test]
    fn the_walk_agrees_with_zune_jpeg(
        w in 1u16..90,
        h in 1u16..90,
        color in color(),
        sampling in sampling(),
        progressive in any::<bool>(),
        restart in 0u16..4,
        seed in any::<u32>(),
    ) {
        let k = Kind { color, sampling, progressive, restart };
        let bytes = encode(w, h, k, seed);
        let head = JpegHeader::walk(&bytes).unwrap();
        let (zw, zh, zc, zp) = zune(&bytes).unwrap();
        prop_assert_eq!((head.width, head.height), (zw, zh));
        prop_assert_eq!(head.components, zc);
        prop_assert_eq!(head.coding == Coding::Progressive, zp);
        prop_assert_eq!(head.restart_interval, restart);
        if head.route() == JpegRoute::Hardware {
            prop_assert!(!progressive && head.components != 4);
        }
        if progressive {
            prop_assert_eq!(head.route(), JpegRoute::CpuHuffman);
        }
    }

    /// Whatever the bytes (a valid file cut, with bytes overwritten), the walk returns.
    #[test]
    fn the_walk_never_panics(
        cut in 0usize..3000,
        edits in prop::collection::vec((0usize..3000, any::<u8>()), 0..8),
        noise in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = encode(40, 24, kind(ColorType::Rgb, SamplingFactor::R_4_2_0), 3);
        bytes.truncate(cut.min(bytes.len()));
        for (at, b) in edits {
            if let Some(x) = bytes.get_mut(at) {
                *x = b;
            }
        }
        let _ = JpegHeader::walk(&bytes);
        let _ = route(&noise);
        let mut framed = vec![0xFF, 0xD8];
        framed.extend_from_slice(&noise);
        let _ = JpegHeader::walk(&framed);
    }
}
