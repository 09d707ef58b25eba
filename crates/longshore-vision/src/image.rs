//! [`RgbImage`]: a decoded 8-bit RGB image, rows top to bottom, pixels interleaved (HWC).

use std::fmt;

use longshore_data::{DataError, Tensor};

/// An 8-bit RGB image in HWC order (`height x width x 3` bytes), what PIL's
/// `convert("RGB")` gives and what the transforms read.
#[derive(Clone, PartialEq, Eq)]
pub struct RgbImage {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

impl RgbImage {
    /// Wraps `data` (`height * width * 3` bytes, HWC).
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the length does not match the dimensions.
    pub fn from_vec(width: usize, height: usize, data: Vec<u8>) -> Result<RgbImage, DataError> {
        let expected = width
            .checked_mul(height)
            .and_then(|p| p.checked_mul(3))
            .ok_or(DataError::Overflow("image size"))?;
        if data.len() != expected {
            return Err(DataError::ShapeMismatch(format!(
                "{} bytes for a {width}x{height} RGB image, expected {expected}",
                data.len()
            )));
        }
        Ok(RgbImage {
            width,
            height,
            data,
        })
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The pixels, HWC.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// The pixel at `(x, y)`.
    ///
    /// # Panics
    /// When `(x, y)` is outside the image.
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        assert!(
            x < self.width && y < self.height,
            "pixel ({x}, {y}) outside the image"
        );
        let i = (y * self.width + x) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }

    /// The pixels, consuming the image.
    pub fn into_vec(self) -> Vec<u8> {
        self.data
    }

    /// The image as a `u8 [height, width, 3]` tensor.
    pub fn to_tensor_hwc(&self) -> Tensor {
        Tensor::from_slice(&[self.height, self.width, 3], &self.data)
            .expect("dimensions match the data")
    }
}

impl fmt::Debug for RgbImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RgbImage")
            .field("width", &self.width)
            .field("height", &self.height)
            .finish_non_exhaustive()
    }
}
