//! The workers' look at a JPEG's markers ([`JpegHeader::walk`]): frame kind, precision,
//! dimensions, components and their sampling factors, restart interval, Adobe colour transform
//! and whether the end-of-image marker is there; and from that, who decodes the file
//! ([`JpegHeader::route`]): nvJPEG's hardware engines with no further check by the device
//! stage, the worker's CPU decoder (progressive, lossless, arithmetic), or the device stage's
//! per-image checks with nvJPEG itself when the walk cannot decide.
//!
//! The walk reads the segments before the first scan only (a few hundred bytes), allocates
//! nothing and never panics, whatever the bytes (`tests/nvjpeg_header.rs` checks it against
//! zune-jpeg's header decode under proptest).

/// How a frame is coded (its start-of-frame marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Coding {
    /// SOF0: baseline sequential DCT, Huffman.
    Baseline,
    /// SOF1: extended sequential DCT, Huffman.
    ExtendedSequential,
    /// SOF2: progressive DCT, Huffman.
    Progressive,
    /// SOF3: lossless, Huffman.
    Lossless,
    /// SOF9-SOF11: arithmetic coding.
    Arithmetic,
    /// SOF5-SOF7, SOF13-SOF15: hierarchical (differential) frames.
    Hierarchical,
}

/// Who decodes a JPEG, as the worker's marker walk sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JpegRoute {
    /// A baseline, 8-bit, 1- or 3-component JPEG with a standard chroma subsampling and its
    /// end-of-image marker: nvJPEG's hardware engines take it, and the device stage puts it in
    /// the batched hardware decode without asking nvJPEG first (a batch that fails anyway is
    /// routed again image by image).
    Hardware,
    /// Not a frame the engines decode (progressive, lossless, arithmetic, hierarchical): the
    /// worker decodes it on the CPU, since nvJPEG's default backend would run its Huffman pass
    /// on the device stage's one thread.
    CpuHuffman,
    /// The walk cannot decide (extended sequential, 12-bit, CMYK, an unusual subsampling, no
    /// end-of-image marker, markers that do not parse): the device stage asks nvJPEG per image
    /// (`nvjpegGetImageInfo`, `nvjpegDecodeBatchedSupported`) and decodes what it refuses on
    /// the CPU.
    Check,
}

/// What the segments before a JPEG's first scan say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    /// The frame's coding.
    pub coding: Coding,
    /// Sample precision in bits (8, or 12 and 16 for the extended kinds).
    pub precision: u8,
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels (0 when a DNL marker defines it later).
    pub height: usize,
    /// Number of components (1 grey, 3 YCbCr, 4 CMYK/YCCK).
    pub components: u8,
    /// `(horizontal, vertical)` sampling factors of the first four components.
    pub sampling: [(u8, u8); 4],
    /// The restart interval in MCUs from a DRI segment before the first scan (0: none).
    pub restart_interval: u16,
    /// The Adobe APP14 colour transform (0 none / CMYK, 1 YCbCr, 2 YCCK), if there is one.
    pub adobe_transform: Option<u8>,
    /// Whether an end-of-image marker is within the file's last KiB (one that is not was
    /// probably truncated).
    pub has_eoi: bool,
}

/// Why a walk stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// No start-of-image marker at offset 0.
    #[error("not a jpeg: no start-of-image marker")]
    NotJpeg,
    /// Bytes that are not a marker where one must be.
    #[error("expected a marker at byte {offset}")]
    NoMarker {
        /// Offset in the file.
        offset: usize,
    },
    /// A segment whose length runs past the file or is below 2.
    #[error("the segment of marker 0x{marker:02x} at byte {offset} is cut short")]
    BadSegment {
        /// The marker.
        marker: u8,
        /// Offset of the marker in the file.
        offset: usize,
    },
    /// A scan or the end of the image before any frame header.
    #[error("no frame header before byte {offset}")]
    NoFrame {
        /// Where the scan or end marker is.
        offset: usize,
    },
}

/// Whether an end-of-image marker is within the last KiB of `data`.
pub(crate) fn has_eoi(data: &[u8]) -> bool {
    let tail = &data[data.len().saturating_sub(1024)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

impl JpegHeader {
    /// Walks the markers of `bytes` up to the first scan (the frame header and the segments
    /// around it).
    ///
    /// # Errors
    /// [`HeaderError`] when the bytes are not a JPEG, a segment is cut short, or a scan comes
    /// before any frame header.
    pub fn walk(bytes: &[u8]) -> Result<JpegHeader, HeaderError> {
        if bytes.get(..2) != Some(&[0xFF, 0xD8]) {
            return Err(HeaderError::NotJpeg);
        }
        let mut restart_interval = 0u16;
        let mut adobe_transform = None;
        let mut found: Option<JpegHeader> = None;
        let done = |found: Option<JpegHeader>, restart_interval, adobe_transform, i| match found {
            Some(mut h) => {
                h.restart_interval = restart_interval;
                h.adobe_transform = adobe_transform;
                h.has_eoi = has_eoi(bytes);
                Ok(h)
            }
            None => Err(HeaderError::NoFrame { offset: i }),
        };
        let mut i = 2;
        loop {
            if bytes.get(i) != Some(&0xFF) {
                return Err(HeaderError::NoMarker { offset: i });
            }
            let Some(&marker) = bytes.get(i + 1) else {
                return Err(HeaderError::NoMarker { offset: i });
            };
            match marker {
                // Fill bytes before a marker.
                0xFF => {
                    i += 1;
                    continue;
                }
                // Standalone markers carry no length.
                0x01 | 0xD0..=0xD7 => {
                    i += 2;
                    continue;
                }
                // The first scan (or the end): what came before is the header.
                0xD8..=0xDA => return done(found, restart_interval, adobe_transform, i),
                _ => {}
            }
            let bad = HeaderError::BadSegment { marker, offset: i };
            let len = match bytes.get(i + 2..i + 4) {
                Some(&[a, b]) => usize::from(u16::from_be_bytes([a, b])),
                _ => return Err(bad),
            };
            if len < 2 {
                return Err(bad);
            }
            let Some(body) = bytes.get(i + 4..i + 2 + len) else {
                return Err(bad);
            };
            let coding = match marker {
                0xC0 => Some(Coding::Baseline),
                0xC1 => Some(Coding::ExtendedSequential),
                0xC2 => Some(Coding::Progressive),
                0xC3 => Some(Coding::Lossless),
                0xC5..=0xC7 | 0xCD..=0xCF => Some(Coding::Hierarchical),
                0xC9..=0xCB => Some(Coding::Arithmetic),
                _ => None,
            };
            if let Some(coding) = coding {
                // The first frame header (a hierarchical file has more) names the image; the
                // tables, DRI and APP segments may follow it before the first scan.
                if found.is_none() {
                    found = Some(frame(coding, body, bad)?);
                }
                i += 2 + len;
                continue;
            }
            match marker {
                // DRI: the restart interval.
                0xDD if body.len() >= 2 => {
                    restart_interval = u16::from_be_bytes([body[0], body[1]]);
                }
                // APP14 "Adobe": version (2), flags0 (2), flags1 (2), transform (1).
                0xEE if body.len() >= 12 && body.starts_with(b"Adobe") => {
                    adobe_transform = Some(body[11]);
                }
                _ => {}
            }
            i += 2 + len;
        }
    }

    /// Who decodes this JPEG ([`JpegRoute`]).
    pub fn route(&self) -> JpegRoute {
        match self.coding {
            Coding::Progressive | Coding::Lossless | Coding::Arithmetic | Coding::Hierarchical => {
                return JpegRoute::CpuHuffman;
            }
            Coding::ExtendedSequential => return JpegRoute::Check,
            Coding::Baseline => {}
        }
        let standard = match self.components {
            1 => true,
            3 => {
                let [y, cb, cr, _] = self.sampling;
                cb == (1, 1) && cr == (1, 1) && matches!(y, (1 | 2 | 4, 1) | (1 | 2, 2))
            }
            _ => false,
        };
        // Adobe transform 2 is YCCK, which only 4-component files use; 0 on 3 components is
        // RGB stored without a colour transform, which the engines would treat as YCbCr.
        let plain_colour = !matches!((self.components, self.adobe_transform), (3, Some(0)));
        if self.precision == 8
            && standard
            && plain_colour
            && self.width > 0
            && self.height > 0
            && self.has_eoi
        {
            JpegRoute::Hardware
        } else {
            JpegRoute::Check
        }
    }
}

/// Reads a start-of-frame segment's body.
fn frame(coding: Coding, body: &[u8], bad: HeaderError) -> Result<JpegHeader, HeaderError> {
    if body.len() < 6 {
        return Err(bad);
    }
    let precision = body[0];
    let height = usize::from(u16::from_be_bytes([body[1], body[2]]));
    let width = usize::from(u16::from_be_bytes([body[3], body[4]]));
    let components = body[5];
    if body.len() < 6 + 3 * usize::from(components) {
        return Err(bad);
    }
    let mut sampling = [(0u8, 0u8); 4];
    for (c, s) in sampling
        .iter_mut()
        .enumerate()
        .take(usize::from(components))
    {
        let f = body[6 + 3 * c + 1];
        *s = (f >> 4, f & 0x0F);
    }
    Ok(JpegHeader {
        coding,
        precision,
        width,
        height,
        components,
        sampling,
        restart_interval: 0,
        adobe_transform: None,
        has_eoi: false,
    })
}

/// [`JpegHeader::walk`] then [`JpegHeader::route`]; a walk that fails is
/// [`JpegRoute::Check`] (the device stage names the file if nvJPEG and the CPU decoder fail too).
pub fn route(bytes: &[u8]) -> JpegRoute {
    JpegHeader::walk(bytes).map_or(JpegRoute::Check, |h| h.route())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(marker: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![0xFF, marker];
        v.extend_from_slice(&((body.len() + 2) as u16).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn sof(marker: u8, precision: u8, w: u16, h: u16, comps: &[u8]) -> Vec<u8> {
        let mut body = vec![precision];
        body.extend_from_slice(&h.to_be_bytes());
        body.extend_from_slice(&w.to_be_bytes());
        body.push(comps.len() as u8);
        for (i, &f) in comps.iter().enumerate() {
            body.extend_from_slice(&[i as u8 + 1, f, 0]);
        }
        segment(marker, &body)
    }

    fn file(parts: &[Vec<u8>]) -> Vec<u8> {
        let mut v = vec![0xFF, 0xD8];
        for p in parts {
            v.extend_from_slice(p);
        }
        v.extend_from_slice(&[0xFF, 0xDA, 0, 2, 0x12, 0x34, 0xFF, 0xD9]);
        v
    }

    #[test]
    fn frames_route_by_kind_precision_and_sampling() {
        let cases: &[(u8, u8, &[u8], JpegRoute)] = &[
            (0xC0, 8, &[0x22, 0x11, 0x11], JpegRoute::Hardware),
            (0xC0, 8, &[0x11, 0x11, 0x11], JpegRoute::Hardware),
            (0xC0, 8, &[0x21, 0x11, 0x11], JpegRoute::Hardware),
            (0xC0, 8, &[0x11], JpegRoute::Hardware),
            (0xC0, 8, &[0x22, 0x21, 0x11], JpegRoute::Check),
            (0xC0, 8, &[0x11, 0x11, 0x11, 0x11], JpegRoute::Check),
            (0xC1, 8, &[0x22, 0x11, 0x11], JpegRoute::Check),
            (0xC1, 12, &[0x22, 0x11, 0x11], JpegRoute::Check),
            (0xC2, 8, &[0x22, 0x11, 0x11], JpegRoute::CpuHuffman),
            (0xC3, 8, &[0x11, 0x11, 0x11], JpegRoute::CpuHuffman),
            (0xC9, 8, &[0x11, 0x11, 0x11], JpegRoute::CpuHuffman),
            (0xC5, 8, &[0x11, 0x11, 0x11], JpegRoute::CpuHuffman),
        ];
        for &(marker, precision, comps, want) in cases {
            let bytes = file(&[sof(marker, precision, 40, 30, comps)]);
            let h = JpegHeader::walk(&bytes).unwrap();
            assert_eq!((h.width, h.height), (40, 30));
            assert_eq!(usize::from(h.components), comps.len());
            assert_eq!(h.route(), want, "marker {marker:02x} comps {comps:?}");
        }
    }

    #[test]
    fn restart_interval_adobe_transform_and_fill_bytes_are_read() {
        let mut adobe = b"Adobe".to_vec();
        adobe.extend_from_slice(&[0, 100, 0, 0, 0, 0, 0]);
        let mut bytes = file(&[
            segment(0xE0, b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"),
            segment(0xDD, &[0, 7]),
            segment(0xEE, &adobe),
            vec![0xFF, 0xFF],
            sof(0xC0, 8, 5, 6, &[0x11, 0x11, 0x11]),
        ]);
        let h = JpegHeader::walk(&bytes).unwrap();
        assert_eq!(h.restart_interval, 7);
        assert_eq!(h.adobe_transform, Some(0));
        assert!(h.has_eoi);
        // RGB stored without a transform: not for the engines' YCbCr path.
        assert_eq!(h.route(), JpegRoute::Check);
        // Without its end-of-image marker (truncated): the device stage checks it.
        bytes.truncate(bytes.len() - 2);
        let h = JpegHeader::walk(&bytes).unwrap();
        assert!(!h.has_eoi);
    }

    #[test]
    fn broken_streams_are_errors_not_panics() {
        assert_eq!(JpegHeader::walk(b""), Err(HeaderError::NotJpeg));
        assert_eq!(JpegHeader::walk(b"hello"), Err(HeaderError::NotJpeg));
        assert_eq!(
            JpegHeader::walk(&[0xFF, 0xD8]),
            Err(HeaderError::NoMarker { offset: 2 })
        );
        assert_eq!(
            JpegHeader::walk(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]),
            Err(HeaderError::NoFrame { offset: 2 })
        );
        assert!(matches!(
            JpegHeader::walk(&[0xFF, 0xD8, 0xFF, 0xC0, 0, 40, 8]),
            Err(HeaderError::BadSegment { marker: 0xC0, .. })
        ));
        assert!(matches!(
            JpegHeader::walk(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 1]),
            Err(HeaderError::BadSegment { marker: 0xE0, .. })
        ));
        // A frame header whose component list is cut short.
        let mut short = sof(0xC0, 8, 4, 4, &[0x11, 0x11, 0x11]);
        short.truncate(short.len() - 3);
        short[3] -= 3;
        assert!(matches!(
            JpegHeader::walk(&file(&[short])),
            Err(HeaderError::BadSegment { marker: 0xC0, .. })
        ));
        assert_eq!(route(b"\x89PNG"), JpegRoute::Check);
    }
}
