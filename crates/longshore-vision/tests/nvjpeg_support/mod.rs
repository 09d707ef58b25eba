//! Shared by the nvjpeg test files: GPU 0 or a printed skip (a failure with
//! LONGSHORE_REQUIRE_CUDA=1), a small PNG writer, and a folder mixing JPEGs, a PNG and
//! broken JPEGs.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;

use longshore_transfer::Device;
use longshore_vision::synth::{FolderSpec, image_jpeg};

/// `cuda:0`, or `None` (printing why) when no driver or GPU can be used.
pub fn gpu() -> Option<Device> {
    let require = std::env::var("LONGSHORE_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) if require => panic!("LONGSHORE_REQUIRE_CUDA=1 but cuda:0 cannot be used: {e}"),
        Err(e) => {
            eprintln!("skipping CUDA test: {e}");
            None
        }
    }
}

/// An 8-bit RGB PNG of `w x h` (zlib stored blocks, no compression).
pub fn png_rgb(w: usize, h: usize, px: &[u8]) -> Vec<u8> {
    fn crc32(data: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    let mut raw = Vec::new();
    for y in 0..h {
        raw.push(0u8);
        raw.extend_from_slice(&px[y * w * 3..(y + 1) * w * 3]);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &x in &raw {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, blk) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        let n = blk.len() as u16;
        z.extend_from_slice(&n.to_le_bytes());
        z.extend_from_slice(&(!n).to_le_bytes());
        z.extend_from_slice(blk);
    }
    z.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"IDAT", &z);
    chunk(&mut png, b"IEND", &[]);
    png
}

/// The JPEGs of a small photo-like folder spec (2 classes).
pub fn spec() -> FolderSpec {
    FolderSpec {
        classes: 2,
        per_class: 6,
        mean_area: 60_000.0,
        quality: 90,
        seed: 11,
    }
}

/// Writes class `a` (6 JPEGs) and class `b` (6 JPEGs, then `x_image.png`, and, when `broken`,
/// `w_badheader.jpg`, `y_truncated.jpg` and `z_garbled.jpg`): in `b`, the sorted order is
/// img0..img5, w_badheader, x_image, y_truncated, z_garbled.
pub fn write_mixed(root: &Path, broken: bool) {
    let s = spec();
    for (c, name) in ["a", "b"].iter().enumerate() {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..s.per_class {
            std::fs::write(dir.join(format!("img{i}.jpg")), image_jpeg(&s, c, i)).unwrap();
        }
    }
    let (w, h) = (45, 37);
    let px: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7) % 251) as u8).collect();
    std::fs::write(root.join("b/x_image.png"), png_rgb(w, h, &px)).unwrap();
    if broken {
        let jpeg = image_jpeg(&s, 1, 0);
        std::fs::write(root.join("b/y_truncated.jpg"), &jpeg[..jpeg.len() / 2]).unwrap();
        // The header survives, the entropy-coded data is garbage: only decoding finds out.
        let mut garbled = jpeg.clone();
        let sos = garbled.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        for (k, b) in garbled[sos + 20..].iter_mut().enumerate() {
            *b = if k % 3 == 0 { 0xFF } else { (k % 200) as u8 };
        }
        garbled.extend_from_slice(&[0xFF, 0xD9]);
        std::fs::write(root.join("b/z_garbled.jpg"), garbled).unwrap();
        // A JPEG whose header does not parse: the worker's probe refuses it.
        std::fs::write(
            root.join("b/w_badheader.jpg"),
            b"\xFF\xD8\xFF\xE0 not a jpeg at all",
        )
        .unwrap();
    }
}
