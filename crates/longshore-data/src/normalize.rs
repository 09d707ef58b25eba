//! The fast path of image normalisation: `u8` pixels to normalised `f32` in CHW order,
//! written straight into the caller's slot (a batch's page-locked buffer), vectorised with
//! runtime CPU-feature dispatch.
//!
//! `out = (x / 255 - mean[c]) / std[c]` is computed as one multiply-add,
//! `x * scale[c] + bias[c]` with `scale = 1 / (255 std)` and `bias = -mean / std`, from CHW
//! or HWC (interleaved, deinterleaved on the fly) input. [`NormalizeKernel::new`] picks the
//! widest path the running CPU has (the last of [`KernelPath::available`]), no `-C target-cpu`.
//!
//! ```
//! use longshore_data::ImageLayout;
//! use longshore_data::normalize::{KernelPath, NormalizeKernel};
//!
//! # fn main() -> Result<(), longshore_data::DataError> {
//! let kernel = NormalizeKernel::imagenet(ImageLayout::Hwc);
//! let pixels = vec![128u8; 4 * 4 * 3]; // a 4x4 HWC image
//! let mut out = vec![0f32; pixels.len()]; // CHW planes
//! kernel.apply(&pixels, &mut out)?;
//! let scalar = kernel.clone().with_path(KernelPath::Scalar)?;
//! let mut reference = vec![0f32; pixels.len()];
//! scalar.apply(&pixels, &mut reference)?;
//! assert!(out.iter().zip(&reference).all(|(a, b)| (a - b).abs() < 1e-5));
//! # Ok(())
//! # }
//! ```
//!
//! # Paths
//!
//! | [`KernelPath`] | what | when |
//! | --- | --- | --- |
//! | `Scalar` | one element at a time, `x * s + b`: the reference | always |
//! | `Portable` | the same arithmetic in blocks the compiler vectorises for the build target | always; the default where nothing below is detected |
//! | `Avx2` | 8 floats per fused multiply-add, SSSE3 byte shuffles for HWC with 3 channels | x86-64 with AVX2 and FMA |
//! | `Avx512` | 16 floats per fused multiply-add | x86-64 with AVX-512F, AVX2 and FMA |
//!
//! The fused paths round once per element where `Scalar` rounds twice, so they may differ
//! from it in the last bit. Large outputs (at least 256 KiB) are written with
//! non-temporal stores: the batch is read next by the copy engine, not by this core, so
//! filling caches with it (and reading every line before writing it) only costs bandwidth.
//!
//! # Unsafe code
//!
//! The SIMD paths call `std::arch` intrinsics, which are `unsafe`: they need CPU features the
//! compiler cannot assume and raw pointers into the slices. This module is the one place in
//! this crate allowed to use `unsafe`; every block states why it is sound. Each SIMD function
//! is only reachable through a [`KernelPath`] whose features were detected at run time.
#![allow(unsafe_code)]

use crate::DataError;
use crate::tensor::ImageLayout;

/// Outputs of at least this many bytes are written with non-temporal (streaming) stores by
/// the SIMD paths.
pub(crate) const STREAM_MIN_BYTES: usize = 256 << 10;

/// One implementation of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelPath {
    /// One element at a time: the reference every other path is tested against.
    Scalar,
    /// Blocked code the compiler vectorises for the build target (SSE2 on baseline x86-64).
    Portable,
    /// AVX2 + FMA (x86-64).
    Avx2,
    /// AVX-512F + AVX2 + FMA (x86-64).
    Avx512,
}

impl KernelPath {
    /// Every path, narrowest first.
    pub const ALL: [KernelPath; 4] = [
        KernelPath::Scalar,
        KernelPath::Portable,
        KernelPath::Avx2,
        KernelPath::Avx512,
    ];

    /// A short lowercase name (`scalar`, `portable`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Portable => "portable",
            KernelPath::Avx2 => "avx2",
            KernelPath::Avx512 => "avx512",
        }
    }

    /// Whether the running CPU can run this path.
    pub fn is_available(self) -> bool {
        match self {
            KernelPath::Scalar | KernelPath::Portable => true,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            KernelPath::Avx2 | KernelPath::Avx512 => false,
        }
    }

    /// The paths the running CPU can run, narrowest first.
    pub fn available() -> Vec<KernelPath> {
        KernelPath::ALL
            .into_iter()
            .filter(|p| p.is_available())
            .collect()
    }

    /// The widest available path (what [`NormalizeKernel::new`] uses).
    pub(crate) fn detect() -> KernelPath {
        KernelPath::available()
            .pop()
            .unwrap_or(KernelPath::Portable)
    }
}

/// Per-channel `u8` -> `f32` normalisation into CHW, on the widest path the running CPU has
/// (or the one [`with_path`](NormalizeKernel::with_path) forces).
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizeKernel {
    layout: ImageLayout,
    scale: Vec<f32>,
    bias: Vec<f32>,
    path: KernelPath,
    /// Non-temporal stores: `None` decides by size (`STREAM_MIN_BYTES`).
    streaming: Option<bool>,
}

impl NormalizeKernel {
    /// Normalisation with per-channel `mean` and `std` (on the `[0, 1]` scale) of images in
    /// `layout`, as torchvision's `ToTensor()` + `Normalize(mean, std)`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `mean` and `std` differ in length or are empty,
    /// or a `std` is zero, negative or not finite.
    pub fn new(mean: &[f32], std: &[f32], layout: ImageLayout) -> Result<Self, DataError> {
        if mean.is_empty() || mean.len() != std.len() {
            return Err(DataError::arg(
                "std",
                format!(
                    "{} means and {} stds; need one of each per channel",
                    mean.len(),
                    std.len()
                ),
            ));
        }
        if let Some((c, s)) = std
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(DataError::arg(
                "std",
                format!("std of channel {c} is {s}; must be positive"),
            ));
        }
        let scale = std.iter().map(|s| 1.0 / (255.0 * s)).collect();
        let bias = mean.iter().zip(std).map(|(m, s)| -m / s).collect();
        Self::from_scale_bias(scale, bias, layout)
    }

    /// ImageNet's mean and std, 3 channels.
    pub fn imagenet(layout: ImageLayout) -> Self {
        Self::new(&[0.485, 0.456, 0.406], &[0.229, 0.224, 0.225], layout)
            .expect("ImageNet's constants are valid")
    }

    /// `out = x * scale[c] + bias[c]` directly.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when the two differ in length or are empty.
    pub(crate) fn from_scale_bias(
        scale: Vec<f32>,
        bias: Vec<f32>,
        layout: ImageLayout,
    ) -> Result<Self, DataError> {
        if scale.is_empty() || scale.len() != bias.len() {
            return Err(DataError::arg(
                "bias",
                format!(
                    "{} scales and {} biases; need one of each per channel",
                    scale.len(),
                    bias.len()
                ),
            ));
        }
        Ok(NormalizeKernel {
            layout,
            scale,
            bias,
            path: KernelPath::detect(),
            streaming: None,
        })
    }

    /// The same kernel on `path` (benchmarks, tests, or to rule a path out).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when the running CPU cannot run `path`.
    pub fn with_path(mut self, path: KernelPath) -> Result<Self, DataError> {
        if !path.is_available() {
            return Err(DataError::arg(
                "path",
                format!("the {} path needs CPU features this CPU lacks", path.name()),
            ));
        }
        self.path = path;
        Ok(self)
    }

    /// Forces non-temporal stores on (`Some(true)`: the output is not read again soon by this
    /// core, as a batch bound for the copy engine) or off (`Some(false)`: the output is read
    /// next from cache, as one reused buffer), or lets the size decide (`None`, the default:
    /// outputs of at least 256 KiB). Only the SIMD paths stream.
    pub fn with_streaming(mut self, streaming: Option<bool>) -> Self {
        self.streaming = streaming;
        self
    }

    /// The same kernel reading images in `layout` (the output is CHW either way).
    pub(crate) fn with_layout(mut self, layout: ImageLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Per-channel scale: `out = x * scale[c] + bias[c]`.
    pub fn scale(&self) -> &[f32] {
        &self.scale
    }

    /// Per-channel bias: `out = x * scale[c] + bias[c]`.
    pub fn bias(&self) -> &[f32] {
        &self.bias
    }

    /// The path [`apply`](NormalizeKernel::apply) runs.
    pub fn path(&self) -> KernelPath {
        self.path
    }

    /// Channels per pixel.
    pub fn channels(&self) -> usize {
        self.scale.len()
    }

    /// The input layout.
    pub fn layout(&self) -> ImageLayout {
        self.layout
    }

    /// Normalises the pixels of one image, `src` (`channels x H x W` bytes in this kernel's
    /// layout), into `out`: `channels` planes of `H x W` floats (CHW).
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when `src` is not a whole number of pixels or `out` is not
    /// as long as `src`.
    pub fn apply(&self, src: &[u8], out: &mut [f32]) -> Result<(), DataError> {
        let channels = self.channels();
        if !src.len().is_multiple_of(channels) || out.len() != src.len() {
            return Err(DataError::ShapeMismatch(format!(
                "normalise {} bytes of {channels}-channel pixels into {} floats; need as many floats as bytes",
                src.len(),
                out.len()
            )));
        }
        let plane = src.len() / channels;
        let stream = self.streaming.unwrap_or(out.len() * 4 >= STREAM_MIN_BYTES);
        match (self.layout, self.path) {
            (ImageLayout::Chw, path) | (ImageLayout::Hwc, path) if channels == 1 => {
                self.planes(path, src, out, plane, stream)
            }
            (ImageLayout::Chw, path) => self.planes(path, src, out, plane, stream),
            (ImageLayout::Hwc, KernelPath::Scalar) => self.hwc_scalar(src, out, plane),
            (ImageLayout::Hwc, path) if channels == 3 => self.hwc3(path, src, out, plane, stream),
            (ImageLayout::Hwc, _) => self.hwc_scalar(src, out, plane),
        }
        Ok(())
    }

    /// CHW input: one contiguous plane per channel.
    fn planes(&self, path: KernelPath, src: &[u8], out: &mut [f32], plane: usize, stream: bool) {
        for (c, (s, o)) in src
            .chunks_exact(plane.max(1))
            .zip(out.chunks_exact_mut(plane.max(1)))
            .enumerate()
        {
            let (k, b) = (self.scale[c], self.bias[c]);
            match path {
                KernelPath::Scalar => plane_scalar(s, o, k, b),
                KernelPath::Portable => plane_portable(s, o, k, b),
                #[cfg(target_arch = "x86_64")]
                KernelPath::Avx2 => {
                    // SAFETY: a kernel only holds the Avx2 path when `with_path` or `detect`
                    // found AVX2 and FMA on this CPU.
                    unsafe { x86::plane_avx2(s, o, k, b, stream) }
                }
                #[cfg(target_arch = "x86_64")]
                KernelPath::Avx512 => {
                    // SAFETY: as above, AVX-512F, AVX2 and FMA were detected.
                    unsafe { x86::plane_avx512(s, o, k, b, stream) }
                }
                #[cfg(not(target_arch = "x86_64"))]
                KernelPath::Avx2 | KernelPath::Avx512 => plane_portable(s, o, k, b),
            }
        }
    }

    /// HWC input, any channel count, one element at a time.
    fn hwc_scalar(&self, src: &[u8], out: &mut [f32], plane: usize) {
        for (p, px) in src.chunks_exact(self.channels()).enumerate() {
            for (c, &x) in px.iter().enumerate() {
                out[c * plane + p] = f32::from(x) * self.scale[c] + self.bias[c];
            }
        }
    }

    /// HWC input with 3 channels: deinterleaved into the three planes.
    fn hwc3(&self, path: KernelPath, src: &[u8], out: &mut [f32], plane: usize, stream: bool) {
        let (r, rest) = out.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        let k = [self.scale[0], self.scale[1], self.scale[2]];
        let o = [self.bias[0], self.bias[1], self.bias[2]];
        match path {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => {
                // SAFETY: the Avx2 path is only held when AVX2 and FMA (hence SSSE3) were
                // detected on this CPU.
                unsafe { x86::hwc3_avx2(src, [r, g, b], k, o, stream) }
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => {
                // SAFETY: as above, AVX-512F, AVX2 and FMA were detected.
                unsafe { x86::hwc3_avx512(src, [r, g, b], k, o, stream) }
            }
            _ => hwc3_portable(src, [r, g, b], k, o),
        }
    }
}

/// The reference: `out[i] = src[i] * k + b`, one element at a time.
fn plane_scalar(src: &[u8], out: &mut [f32], k: f32, b: f32) {
    for i in 0..src.len().min(out.len()) {
        out[i] = f32::from(src[i]) * k + b;
    }
}

/// `out[i] = src[i] * k + b` in blocks of 16 the compiler vectorises.
fn plane_portable(src: &[u8], out: &mut [f32], k: f32, b: f32) {
    let mut s = src.chunks_exact(16);
    let mut o = out.chunks_exact_mut(16);
    for (s, o) in (&mut s).zip(&mut o) {
        for (o, &x) in o.iter_mut().zip(s) {
            *o = f32::from(x) * k + b;
        }
    }
    for (o, &x) in o.into_remainder().iter_mut().zip(s.remainder()) {
        *o = f32::from(x) * k + b;
    }
}

/// HWC, 3 channels, portable: one pixel at a time into three planes without bounds checks.
fn hwc3_portable(src: &[u8], [r, g, b]: [&mut [f32]; 3], k: [f32; 3], o: [f32; 3]) {
    for (((px, r), g), b) in src.chunks_exact(3).zip(r).zip(g).zip(b) {
        *r = f32::from(px[0]) * k[0] + o[0];
        *g = f32::from(px[1]) * k[1] + o[1];
        *b = f32::from(px[2]) * k[2] + o[2];
    }
}

// The AVX-512 intrinsics are stable since Rust 1.89 (safe `#[target_feature]` functions since
// 1.86): this module, and so longshore-data, needs 1.89 although the workspace still says 1.85.
#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86-64 SIMD paths. Every function here is `unsafe` only because of its target
    //! features: callers must have detected them. Slices are read and written within their
    //! bounds only (each loop checks the remaining length before its loads and stores).

    use std::arch::x86_64::*;

    /// `pshufb` masks gathering channel `ch` of 16 interleaved 3-channel pixels (48 bytes in
    /// three 16-byte vectors) from vector `v`: lane `j` takes byte `3j + ch - 16v` when that
    /// lies in `v`, else zero (`0x80`). OR-ing the three results gives the 16 bytes of the
    /// channel in pixel order.
    const fn mask(ch: usize, v: usize) -> [u8; 16] {
        let mut m = [0x80u8; 16];
        let mut j = 0;
        while j < 16 {
            let pos = 3 * j + ch;
            if pos >= 16 * v && pos < 16 * (v + 1) {
                m[j] = (pos - 16 * v) as u8;
            }
            j += 1;
        }
        m
    }

    const MASKS: [[[u8; 16]; 3]; 3] = [
        [mask(0, 0), mask(0, 1), mask(0, 2)],
        [mask(1, 0), mask(1, 1), mask(1, 2)],
        [mask(2, 0), mask(2, 1), mask(2, 2)],
    ];

    /// Loads a mask of [`MASKS`].
    #[target_feature(enable = "ssse3")]
    fn load_mask(m: &[u8; 16]) -> __m128i {
        // SAFETY: `m` is 16 readable bytes; `loadu` has no alignment requirement.
        unsafe { _mm_loadu_si128(m.as_ptr().cast()) }
    }

    /// Deinterleaves 48 bytes (16 pixels of 3 channels) at `p` into one 16-byte vector per
    /// channel.
    ///
    /// # Safety
    /// `p` must be valid for reading 48 bytes; the CPU must have SSSE3.
    #[target_feature(enable = "ssse3")]
    unsafe fn deinterleave3(p: *const u8, masks: &[[__m128i; 3]; 3]) -> [__m128i; 3] {
        // SAFETY: the caller guarantees 48 readable bytes at `p`; unaligned loads.
        let (a, b, c) = unsafe {
            (
                _mm_loadu_si128(p.cast()),
                _mm_loadu_si128(p.add(16).cast()),
                _mm_loadu_si128(p.add(32).cast()),
            )
        };
        let gather = |m: &[__m128i; 3]| {
            _mm_or_si128(
                _mm_or_si128(_mm_shuffle_epi8(a, m[0]), _mm_shuffle_epi8(b, m[1])),
                _mm_shuffle_epi8(c, m[2]),
            )
        };
        [gather(&masks[0]), gather(&masks[1]), gather(&masks[2])]
    }

    /// 8 bytes (the low half of `v`) to 8 normalised floats stored at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writing 8 floats, and 32-byte aligned when `stream`; AVX2+FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store8(v: __m128i, dst: *mut f32, k: __m256, b: __m256, stream: bool) {
        let x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), k, b);
        // SAFETY: the caller guarantees 8 writable floats at `dst` (aligned when streaming).
        unsafe {
            if stream {
                _mm256_stream_ps(dst, x)
            } else {
                _mm256_storeu_ps(dst, x)
            }
        }
    }

    /// 16 bytes to 16 normalised floats stored at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writing 16 floats, and 64-byte aligned when `stream`;
    /// AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn store16(v: __m128i, dst: *mut f32, k: __m512, b: __m512, stream: bool) {
        let x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)), k, b);
        // SAFETY: the caller guarantees 16 writable floats at `dst` (aligned when streaming).
        unsafe {
            if stream {
                _mm512_stream_ps(dst, x)
            } else {
                _mm512_storeu_ps(dst, x)
            }
        }
    }

    /// Elements to do one at a time before `out` reaches an `align`-byte boundary (all of
    /// them when it never does within `n`).
    fn head(out: &[f32], align: usize, n: usize) -> usize {
        let mis = out.as_ptr() as usize % align;
        if mis == 0 {
            0
        } else if !mis.is_multiple_of(4) {
            n
        } else {
            ((align - mis) / 4).min(n)
        }
    }

    /// The single-element step of the fused paths.
    #[target_feature(enable = "fma")]
    fn one(x: u8, k: f32, b: f32) -> f32 {
        f32::from(x).mul_add(k, b)
    }

    /// `out[i] = src[i] * k + b`, 32 elements per iteration.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn plane_avx2(src: &[u8], out: &mut [f32], k: f32, b: f32, stream: bool) {
        let n = src.len().min(out.len());
        let h = if stream { head(out, 32, n) } else { 0 };
        for i in 0..h {
            out[i] = one(src[i], k, b);
        }
        let (vk, vb) = (_mm256_set1_ps(k), _mm256_set1_ps(b));
        let mut i = h;
        while i + 32 <= n {
            // SAFETY: `i + 32 <= n` bytes of `src` and floats of `out` remain; after the
            // head `out[i..]` is 32-byte aligned when streaming (`i - h` is a multiple of 32).
            unsafe {
                let lo = _mm_loadu_si128(src.as_ptr().add(i).cast());
                let hi = _mm_loadu_si128(src.as_ptr().add(i + 16).cast());
                let d = out.as_mut_ptr().add(i);
                store8(lo, d, vk, vb, stream);
                store8(_mm_srli_si128::<8>(lo), d.add(8), vk, vb, stream);
                store8(hi, d.add(16), vk, vb, stream);
                store8(_mm_srli_si128::<8>(hi), d.add(24), vk, vb, stream);
            }
            i += 32;
        }
        for j in i..n {
            out[j] = one(src[j], k, b);
        }
        if stream {
            _mm_sfence();
        }
    }

    /// `out[i] = src[i] * k + b`, 64 elements per iteration.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn plane_avx512(src: &[u8], out: &mut [f32], k: f32, b: f32, stream: bool) {
        let n = src.len().min(out.len());
        let h = if stream { head(out, 64, n) } else { 0 };
        for i in 0..h {
            out[i] = one(src[i], k, b);
        }
        let (vk, vb) = (_mm512_set1_ps(k), _mm512_set1_ps(b));
        let mut i = h;
        while i + 64 <= n {
            // SAFETY: `i + 64 <= n` bytes of `src` and floats of `out` remain; `out[i..]` is
            // 64-byte aligned when streaming (after the head, `i - h` is a multiple of 64).
            unsafe {
                let p = src.as_ptr().add(i);
                let d = out.as_mut_ptr().add(i);
                for q in 0..4 {
                    let v = _mm_loadu_si128(p.add(16 * q).cast());
                    store16(v, d.add(16 * q), vk, vb, stream);
                }
            }
            i += 64;
        }
        for j in i..n {
            out[j] = one(src[j], k, b);
        }
        if stream {
            _mm_sfence();
        }
    }

    /// Whether the three planes start equally misaligned, so one head aligns all three.
    fn same_alignment(planes: &[&mut [f32]; 3], align: usize) -> bool {
        let m = |p: &[f32]| p.as_ptr() as usize % align;
        m(planes[0]) == m(planes[1]) && m(planes[1]) == m(planes[2])
    }

    /// HWC with 3 channels into three planes, 16 pixels per iteration.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn hwc3_avx2(
        src: &[u8],
        planes: [&mut [f32]; 3],
        k: [f32; 3],
        b: [f32; 3],
        stream: bool,
    ) {
        let n = (src.len() / 3).min(planes.iter().map(|p| p.len()).min().unwrap_or(0));
        let stream = stream && same_alignment(&planes, 32);
        let h = if stream { head(planes[0], 32, n) } else { 0 };
        for p in 0..h {
            for c in 0..3 {
                planes[c][p] = one(src[3 * p + c], k[c], b[c]);
            }
        }
        let masks = MASKS.map(|m| m.each_ref().map(|m| load_mask(m)));
        let vk = k.map(|k| _mm256_set1_ps(k));
        let vb = b.map(|b| _mm256_set1_ps(b));
        let mut p = h;
        while p + 16 <= n {
            // SAFETY: 16 pixels (48 bytes of `src`, 16 floats of each plane) remain at `p`;
            // each plane is 32-byte aligned at `p` when streaming (same misalignment, head
            // done, `p - h` a multiple of 16 floats).
            unsafe {
                let ch = deinterleave3(src.as_ptr().add(3 * p), &masks);
                for c in 0..3 {
                    let d = planes[c].as_mut_ptr().add(p);
                    store8(ch[c], d, vk[c], vb[c], stream);
                    store8(_mm_srli_si128::<8>(ch[c]), d.add(8), vk[c], vb[c], stream);
                }
            }
            p += 16;
        }
        for q in p..n {
            for c in 0..3 {
                planes[c][q] = one(src[3 * q + c], k[c], b[c]);
            }
        }
        if stream {
            _mm_sfence();
        }
    }

    /// HWC with 3 channels into three planes, 16 pixels per iteration, 16-float stores.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn hwc3_avx512(
        src: &[u8],
        planes: [&mut [f32]; 3],
        k: [f32; 3],
        b: [f32; 3],
        stream: bool,
    ) {
        let n = (src.len() / 3).min(planes.iter().map(|p| p.len()).min().unwrap_or(0));
        let stream = stream && same_alignment(&planes, 64);
        let h = if stream { head(planes[0], 64, n) } else { 0 };
        for p in 0..h {
            for c in 0..3 {
                planes[c][p] = one(src[3 * p + c], k[c], b[c]);
            }
        }
        let masks = MASKS.map(|m| m.each_ref().map(|m| load_mask(m)));
        let vk = k.map(|k| _mm512_set1_ps(k));
        let vb = b.map(|b| _mm512_set1_ps(b));
        let mut p = h;
        while p + 16 <= n {
            // SAFETY: 16 pixels (48 bytes of `src`, 16 floats of each plane) remain at `p`;
            // each plane is 64-byte aligned at `p` when streaming (same misalignment, head
            // done, `p - h` a multiple of 16 floats).
            unsafe {
                let ch = deinterleave3(src.as_ptr().add(3 * p), &masks);
                for c in 0..3 {
                    store16(ch[c], planes[c].as_mut_ptr().add(p), vk[c], vb[c], stream);
                }
            }
            p += 16;
        }
        for q in p..n {
            for c in 0..3 {
                planes[c][q] = one(src[3 * q + c], k[c], b[c]);
            }
        }
        if stream {
            _mm_sfence();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `a` equals the two-rounding reference `r` up to the rounding of one fused step.
    fn close(a: f32, r: f32, x: u8, k: f32, b: f32) -> bool {
        let scale = (f32::from(x) * k).abs() + b.abs();
        (a - r).abs() <= 2.0 * f32::EPSILON * scale.max(f32::MIN_POSITIVE)
    }

    fn check(layout: ImageLayout, channels: usize, pixels: usize, offset: usize, seed: u64) {
        let mut rng = seed;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) as u32
        };
        let mean: Vec<f32> = (0..channels)
            .map(|_| next() as f32 / u32::MAX as f32)
            .collect();
        let std: Vec<f32> = (0..channels)
            .map(|_| 0.05 + next() as f32 / u32::MAX as f32)
            .collect();
        let src: Vec<u8> = (0..channels * pixels).map(|_| next() as u8).collect();
        let base = NormalizeKernel::new(&mean, &std, layout).unwrap();
        let mut reference = vec![0f32; src.len()];
        base.clone()
            .with_path(KernelPath::Scalar)
            .unwrap()
            .apply(&src, &mut reference)
            .unwrap();
        for path in KernelPath::available() {
            // `offset` shifts the output off any alignment (odd slots within a batch); the
            // seed picks streaming stores on, off or by size.
            let mut buf = vec![f32::NAN; src.len() + offset];
            let out = &mut buf[offset..];
            let streaming = [None, Some(true), Some(false)][(seed % 3) as usize];
            base.clone()
                .with_path(path)
                .unwrap()
                .with_streaming(streaming)
                .apply(&src, out)
                .unwrap();
            for (i, (&a, &r)) in out.iter().zip(&reference).enumerate() {
                let (c, x) = match layout {
                    ImageLayout::Chw => (i / pixels.max(1), src[i]),
                    ImageLayout::Hwc => {
                        let (c, p) = (i / pixels.max(1), i % pixels.max(1));
                        (c, src[p * channels + c])
                    }
                };
                assert!(
                    close(a, r, x, base.scale[c], base.bias[c]),
                    "{path:?} {layout:?} c={channels} px={pixels} off={offset} i={i}: {a} vs {r}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn every_path_equals_the_scalar_reference(
            hwc in any::<bool>(),
            channels in 1usize..=5,
            pixels in 0usize..400,
            offset in 0usize..20,
            seed in any::<u64>(),
        ) {
            let layout = if hwc { ImageLayout::Hwc } else { ImageLayout::Chw };
            check(layout, channels, pixels, offset, seed);
        }
    }

    #[test]
    fn large_outputs_take_the_streaming_stores_and_stay_exact() {
        // 3 x 224 x 224 floats = 588 KiB, above STREAM_MIN_BYTES; aligned and not.
        for layout in [ImageLayout::Chw, ImageLayout::Hwc] {
            for offset in [0, 1, 3, 16] {
                check(layout, 3, 224 * 224, offset, 7 + offset as u64);
            }
        }
    }

    #[test]
    fn matches_the_transform_normalize() {
        let src: Vec<u8> = (0..3 * 50).map(|i| (i * 37 % 256) as u8).collect();
        for layout in [ImageLayout::Chw, ImageLayout::Hwc] {
            let mut a = vec![0f32; src.len()];
            let mut b = vec![0f32; src.len()];
            NormalizeKernel::imagenet(layout)
                .apply(&src, &mut a)
                .unwrap();
            crate::Normalize::imagenet(layout)
                .apply_into(&src, 3, &mut b)
                .unwrap();
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{x} vs {y}");
            }
        }
    }

    #[test]
    fn rejects_bad_shapes_and_arguments() {
        let k = NormalizeKernel::imagenet(ImageLayout::Chw);
        let mut out = [0f32; 6];
        assert!(matches!(
            k.apply(&[0u8; 5], &mut out[..5]),
            Err(DataError::ShapeMismatch(_))
        ));
        assert!(matches!(
            k.apply(&[0u8; 6], &mut out[..3]),
            Err(DataError::ShapeMismatch(_))
        ));
        assert!(NormalizeKernel::new(&[0.5], &[0.0], ImageLayout::Chw).is_err());
        assert!(NormalizeKernel::new(&[0.5, 0.5], &[0.2], ImageLayout::Chw).is_err());
        assert!(NormalizeKernel::from_scale_bias(vec![], vec![], ImageLayout::Hwc).is_err());
    }

    #[test]
    fn detection_names_an_available_path() {
        let p = KernelPath::detect();
        assert!(p.is_available());
        assert!(KernelPath::available().contains(&KernelPath::Scalar));
        assert_eq!(NormalizeKernel::imagenet(ImageLayout::Chw).path(), p);
        #[cfg(target_arch = "x86_64")]
        if !std::arch::is_x86_feature_detected!("avx512f") {
            let err = NormalizeKernel::imagenet(ImageLayout::Chw).with_path(KernelPath::Avx512);
            assert!(err.is_err());
        }
    }
}
