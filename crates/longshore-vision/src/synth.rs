//! An ImageNet-like synthetic image folder, for benchmarks, examples and tests.
//!
//! [`write_folder`] writes `classes` folders of `per_class` JPEGs whose sizes, shapes and
//! content resemble ImageNet's training set closely enough to cost a decoder what ImageNet
//! costs it:
//!
//! * **Dimensions**: the area is log-normal around [`FolderSpec::mean_area`] (default
//!   140,000 px, about 400x350) with a spread of 0.35 in log space, clamped to 32..1,200 px a
//!   side; the aspect ratio is 4:3 (45%), 3:4 (20%), 1:1 (10%), 3:2 (15%) or 2:3 (10%), each
//!   jittered by up to 5%. ImageNet's train set averages about 400x350 with mostly 4:3 and 3:4.
//! * **Content** (photographic statistics, not flat colours nor white noise): a smooth
//!   background of two random colour gradients and a bilinearly upsampled 6x6 colour lattice
//!   (smooth regions); 3 to 8 ellipses and rectangles with their own colour gradients and
//!   anti-aliased 1-2 px edges (edges), half of them carrying stripes of 2.5-8.5 px period
//!   whose phase wanders with a low-frequency field (fabric, grass, fur); fractal value noise
//!   on luminance, 8 octaves of equal amplitude from 4 cells across the image down to about a
//!   pixel (a 1/f power spectrum), stronger inside some shapes; a fine colour texture (a
//!   3-pixel lattice per channel); and sensor grain (triangular, +-22 levels at most).
//! * **Encoding**: quality 90, 4:2:0 chroma subsampling (what PIL and most cameras write),
//!   baseline; 5% progressive and 1% grayscale files, as ImageNet holds a few of each.
//!   The texture strengths are set so files average about 106 KB at the default area
//!   (146,000 px measured over 200 images, 0.73 bytes a pixel; ImageNet's train set has
//!   about 110 KB at 400x350, 0.8 bytes a pixel).
//!
//! Everything is a pure function of [`FolderSpec::seed`], so a folder can be regenerated
//! identically; [`write_folder`] skips work when a folder with the same spec already exists
//! (it records the spec in `longshore-synth.json`).

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use longshore_data::rng::{Rng, below, unit_f64};
use rand_chacha::rand_core::SeedableRng;

/// What [`write_folder`] generates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FolderSpec {
    /// Class folders (`n0000`, `n0001`, ...).
    pub classes: usize,
    /// JPEGs per class.
    pub per_class: usize,
    /// Mean image area in pixels.
    pub mean_area: f64,
    /// JPEG quality, 1..=100.
    pub quality: u8,
    /// Seed of everything.
    pub seed: u64,
}

impl FolderSpec {
    /// The benchmark's folder: 100 classes x 100 images, ImageNet-like sizes (10,000 files,
    /// about 1.1 GB).
    pub fn imagenet_like() -> FolderSpec {
        FolderSpec {
            classes: 100,
            per_class: 100,
            mean_area: 140_000.0,
            quality: 90,
            seed: 0x1_3A6E,
        }
    }

    /// A folder that generates in well under a second: 4 classes x 3 small images.
    pub fn tiny() -> FolderSpec {
        FolderSpec {
            classes: 4,
            per_class: 3,
            mean_area: 96.0 * 80.0,
            quality: 90,
            seed: 7,
        }
    }

    /// Total images.
    pub fn len(&self) -> usize {
        self.classes * self.per_class
    }

    /// Whether the spec makes no image.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn stamp(&self) -> String {
        format!(
            "{{\"generator\":\"longshore-vision synth v1\",\"classes\":{},\"per_class\":{},\"mean_area\":{},\"quality\":{},\"seed\":{}}}\n",
            self.classes, self.per_class, self.mean_area, self.quality, self.seed
        )
    }
}

/// What [`write_folder`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FolderReport {
    /// Images in the folder.
    pub images: usize,
    /// Bytes of JPEG data.
    pub bytes: u64,
    /// Whether the folder was already there (nothing was written).
    pub reused: bool,
}

/// Writes the folder described by `spec` under `root` (created if needed), or reuses it
/// when `root/longshore-synth.json` records the same spec.
///
/// # Errors
/// I/O errors creating or writing files.
pub fn write_folder(root: &Path, spec: &FolderSpec) -> io::Result<FolderReport> {
    let stamp_path = root.join("longshore-synth.json");
    if fs::read_to_string(&stamp_path).is_ok_and(|s| s == spec.stamp()) {
        let mut bytes = 0;
        for c in 0..spec.classes {
            for entry in fs::read_dir(root.join(class_name(c)))? {
                bytes += entry?.metadata()?.len();
            }
        }
        return Ok(FolderReport {
            images: spec.len(),
            bytes,
            reused: true,
        });
    }
    for c in 0..spec.classes {
        fs::create_dir_all(root.join(class_name(c)))?;
    }
    // Images are independent: one thread per core, each taking the next image.
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> io::Result<()> {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= spec.len() {
                            return Ok(());
                        }
                        let (c, i) = (k / spec.per_class, k % spec.per_class);
                        let jpeg = image_jpeg(spec, c, i);
                        bytes.fetch_add(jpeg.len() as u64, Ordering::Relaxed);
                        let name = format!("{}_{i:05}.JPEG", class_name(c));
                        fs::write(root.join(class_name(c)).join(name), jpeg)?;
                    }
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(io::Error::other("generator thread panicked")))
        })
    })?;
    let bytes = bytes.into_inner();
    fs::write(&stamp_path, spec.stamp())?;
    Ok(FolderReport {
        images: spec.len(),
        bytes,
        reused: false,
    })
}

fn class_name(c: usize) -> String {
    format!("n{c:04}")
}

/// The JPEG bytes of image `index` of class `class`.
pub fn image_jpeg(spec: &FolderSpec, class: usize, index: usize) -> Vec<u8> {
    let mut rng = Rng::seed_from_u64(spec.seed ^ ((class as u64) << 32) ^ index as u64);
    let (w, h) = dimensions(spec.mean_area, &mut rng);
    let rgb = render(w, h, class, &mut rng);
    let kind = below(&mut rng, 100);
    let mut out = Vec::with_capacity(w * h / 2);
    let mut enc = Encoder::new(&mut out, spec.quality);
    enc.set_sampling_factor(SamplingFactor::R_4_2_0);
    if kind < 5 {
        enc.set_progressive(true);
    }
    let result = if kind == 99 {
        let grey: Vec<u8> = rgb
            .chunks_exact(3)
            .map(|p| {
                ((u32::from(p[0]) * 299 + u32::from(p[1]) * 587 + u32::from(p[2]) * 114) / 1000)
                    as u8
            })
            .collect();
        enc.encode(&grey, w as u16, h as u16, ColorType::Luma)
    } else {
        enc.encode(&rgb, w as u16, h as u16, ColorType::Rgb)
    };
    result.expect("dimensions are within JPEG's limits and the buffer matches them");
    out
}

fn dimensions(mean_area: f64, rng: &mut Rng) -> (usize, usize) {
    // Box-Muller for a standard normal.
    let (u1, u2) = (unit_f64(rng).max(1e-12), unit_f64(rng));
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let area = mean_area * (0.35 * z - 0.5 * 0.35 * 0.35).exp();
    let ratio = match below(rng, 100) {
        0..45 => 4.0 / 3.0,
        45..65 => 3.0 / 4.0,
        65..75 => 1.0,
        75..90 => 1.5,
        _ => 2.0 / 3.0,
    } * (1.0 + 0.1 * (unit_f64(rng) - 0.5));
    let w = (area * ratio).sqrt().round().clamp(32.0, 1200.0) as usize;
    let h = (area / ratio).sqrt().round().clamp(32.0, 1200.0) as usize;
    (w, h)
}

fn rand_color(rng: &mut Rng) -> [f32; 3] {
    [0; 3].map(|_| (unit_f64(rng) * 255.0) as f32)
}

/// Value noise: a random lattice of `cells` cells across the larger side, bilinearly
/// interpolated, in [-1, 1].
struct Lattice {
    n: usize,
    values: Vec<f32>,
    scale: f32,
}

impl Lattice {
    fn new(cells: usize, w: usize, h: usize, rng: &mut Rng) -> Lattice {
        let n = cells + 2;
        let values = (0..n * n)
            .map(|_| (unit_f64(rng) * 2.0 - 1.0) as f32)
            .collect();
        Lattice {
            n,
            values,
            scale: cells as f32 / w.max(h) as f32,
        }
    }

    fn at(&self, x: usize, y: usize) -> f32 {
        let (fx, fy) = (x as f32 * self.scale, y as f32 * self.scale);
        let (ix, iy) = (fx as usize, fy as usize);
        let (tx, ty) = (fx - ix as f32, fy - iy as f32);
        let (ix, iy) = (ix.min(self.n - 2), iy.min(self.n - 2));
        let v = |i: usize, j: usize| self.values[j * self.n + i];
        let top = v(ix, iy) * (1.0 - tx) + v(ix + 1, iy) * tx;
        let bottom = v(ix, iy + 1) * (1.0 - tx) + v(ix + 1, iy + 1) * tx;
        top * (1.0 - ty) + bottom * ty
    }
}

struct Shape {
    ellipse: bool,
    cx: f32,
    cy: f32,
    rx: f32,
    ry: f32,
    color: [f32; 3],
    gradient: [f32; 3],
    texture: f32,
    edge: f32,
    /// Stripes (fabric, grass, fur): direction (cos, sin), angular frequency and amplitude.
    stripes: (f32, f32, f32, f32),
}

fn render(w: usize, h: usize, class: usize, rng: &mut Rng) -> Vec<u8> {
    // Each class has its own palette bias, so classes differ a little (a learnable signal).
    let mut class_rng = Rng::seed_from_u64(0xC1A55 ^ class as u64);
    let bias = rand_color(&mut class_rng);
    let (c0, c1, c2) = (rand_color(rng), rand_color(rng), rand_color(rng));
    let angle = unit_f64(rng) as f32 * std::f32::consts::TAU;
    let (dx, dy) = (angle.cos(), angle.sin());
    let colour_lattice: [Lattice; 3] = [0, 1, 2].map(|_| Lattice::new(6, w, h, rng));
    // Equal amplitude per octave: a 1/f power spectrum ("pink"), from 4 cells across the image
    // down to about one pixel.
    let octaves: Vec<Lattice> = (0..8).map(|k| Lattice::new(4 << k, w, h, rng)).collect();
    let shapes: Vec<Shape> = (0..3 + below(rng, 6))
        .map(|_| Shape {
            ellipse: below(rng, 2) == 0,
            cx: unit_f64(rng) as f32 * w as f32,
            cy: unit_f64(rng) as f32 * h as f32,
            rx: (0.05 + 0.3 * unit_f64(rng) as f32) * w as f32,
            ry: (0.05 + 0.3 * unit_f64(rng) as f32) * h as f32,
            color: rand_color(rng),
            gradient: [0; 3].map(|_| (unit_f64(rng) as f32 - 0.5) * 120.0),
            texture: 0.5 + 1.5 * unit_f64(rng) as f32,
            edge: 1.0 + unit_f64(rng) as f32,
            stripes: {
                let a = unit_f64(rng) as f32 * std::f32::consts::PI;
                let period = 2.5 + 6.0 * unit_f64(rng) as f32;
                let amp = if below(rng, 2) == 0 {
                    0.0
                } else {
                    10.0 + 20.0 * unit_f64(rng) as f32
                };
                (a.cos(), a.sin(), std::f32::consts::TAU / period, amp)
            },
        })
        .collect();
    // Texture, grain and colour-texture strengths, tuned so files average about 106 KB at
    // 146,000 px (0.73 bytes a pixel, ImageNet's train set has about 0.8).
    let (texture_amp, grain_amp, chroma_amp) = (56.0f32, 22.0f32, 40.0f32);
    let chroma: [Lattice; 3] = [0, 1, 2].map(|_| Lattice::new(w.max(h) / 3, w, h, rng));
    let detail = Lattice::new(w.max(h) / 12, w, h, rng);
    let mut out = vec![0u8; w * h * 3];
    let mut grain = Rng::seed_from_u64(w as u64 * 31 + h as u64);
    for y in 0..h {
        for x in 0..w {
            let t = ((x as f32 * dx + y as f32 * dy) / (w + h) as f32 + 0.5).clamp(0.0, 1.0);
            let mut px = [0f32; 3];
            for c in 0..3 {
                let g = c0[c] * (1.0 - t) + c1[c] * t;
                px[c] =
                    0.45 * g + 0.25 * c2[c] + 0.15 * bias[c] + 60.0 * colour_lattice[c].at(x, y);
            }
            let mut tex_gain = 1.0;
            let mut stripes = 0.0;
            for s in &shapes {
                let (ux, uy) = ((x as f32 - s.cx) / s.rx, (y as f32 - s.cy) / s.ry);
                // Signed distance in pixels, roughly: negative inside.
                let d = if s.ellipse {
                    ((ux * ux + uy * uy).sqrt() - 1.0) * s.rx.min(s.ry)
                } else {
                    (ux.abs() - 1.0).max(uy.abs() - 1.0) * s.rx.min(s.ry)
                };
                let cover = (0.5 - d / s.edge).clamp(0.0, 1.0);
                if cover > 0.0 {
                    for (c, p) in px.iter_mut().enumerate() {
                        let inner = s.color[c] + s.gradient[c] * uy.clamp(-1.0, 1.0);
                        *p = *p * (1.0 - cover) + inner * cover;
                    }
                    tex_gain = tex_gain * (1.0 - cover) + s.texture * cover;
                    let (cs, sn, f, amp) = s.stripes;
                    let phase = (x as f32 * cs + y as f32 * sn) * f + 3.0 * detail.at(x, y);
                    stripes = stripes * (1.0 - cover) + amp * phase.sin() * cover;
                }
            }
            let mut noise = 0.0;
            for lattice in &octaves {
                noise += lattice.at(x, y);
            }
            let grain_v = (unit_f64(&mut grain) + unit_f64(&mut grain) - 1.0) as f32 * grain_amp;
            let lum = noise * texture_amp * tex_gain + grain_v + stripes;
            let o = (y * w + x) * 3;
            for c in 0..3 {
                let colour_texture = chroma_amp * tex_gain * chroma[c].at(x, y);
                out[o + c] = (px[c] + lum + colour_texture).clamp(0.0, 255.0) as u8;
            }
        }
    }
    out
}
