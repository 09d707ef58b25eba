//! [`Shape`]: a small, copyable tensor shape, and the checked byte size of one.
//!
//! Apart from [`crate::dtype`] so that the dtypes sit below [`crate::DataError`] (which names
//! them) and shapes, whose constructors can fail, above it.

use std::fmt;

use crate::DataError;

/// The maximum number of dimensions of a [`Shape`].
pub const MAX_DIMS: usize = 8;

/// A small, copyable tensor shape of at most [`MAX_DIMS`] dimensions.
// Unused dimensions are always 0, so the derived `Hash` agrees with the `PartialEq` below.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Copy, Eq, Hash)]
pub struct Shape {
    dims: [usize; MAX_DIMS],
    ndim: u8,
}

impl PartialEq for Shape {
    /// Compares only the dimensions in use, element by element: the collates compare every
    /// sample's field shapes with the first sample's, and the derived comparison of the whole
    /// array went through a `memcmp` call per field per sample (a fifth of a worker's time in
    /// `loader_per_batch` with scalar fields).
    #[inline]
    fn eq(&self, other: &Shape) -> bool {
        self.ndim == other.ndim
            && (0..usize::from(self.ndim)).all(|i| self.dims[i] == other.dims[i])
    }
}

impl Shape {
    /// The shape of a scalar (no dimensions).
    pub const SCALAR: Shape = Shape {
        dims: [0; MAX_DIMS],
        ndim: 0,
    };

    /// Builds a shape from its dimensions.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `dims` has more than [`MAX_DIMS`] entries.
    pub fn new(dims: &[usize]) -> Result<Shape, DataError> {
        if dims.len() > MAX_DIMS {
            return Err(DataError::arg(
                "shape",
                format!("{} dimensions, at most {MAX_DIMS} supported", dims.len()),
            ));
        }
        let mut s = Shape::SCALAR;
        s.dims[..dims.len()].copy_from_slice(dims);
        s.ndim = dims.len() as u8;
        Ok(s)
    }

    /// A one-dimensional shape.
    pub const fn d1(n: usize) -> Shape {
        let mut s = Shape::SCALAR;
        s.dims[0] = n;
        s.ndim = 1;
        s
    }

    /// A two-dimensional shape.
    pub const fn d2(a: usize, b: usize) -> Shape {
        let mut s = Shape::d1(a);
        s.dims[1] = b;
        s.ndim = 2;
        s
    }

    /// A three-dimensional shape.
    pub const fn d3(a: usize, b: usize, c: usize) -> Shape {
        let mut s = Shape::d2(a, b);
        s.dims[2] = c;
        s.ndim = 3;
        s
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..usize::from(self.ndim)]
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        usize::from(self.ndim)
    }

    /// Number of elements (1 for a scalar), or `None` on overflow.
    pub fn numel(&self) -> Option<usize> {
        self.dims()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

/// Product of `dims` times `elem`, or an overflow error naming `what`.
pub(crate) fn nbytes(dims: &[usize], elem: usize, what: &'static str) -> Result<usize, DataError> {
    dims.iter()
        .try_fold(elem, |acc, &d| acc.checked_mul(d))
        .ok_or(DataError::Overflow(what))
}
