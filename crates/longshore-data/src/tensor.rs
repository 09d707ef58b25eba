//! Owned and borrowed tensors, and the [`Field`] / [`Sample`] traits that describe
//! a fixed-shape numeric sample to the collators.

use std::fmt;

use crate::DataError;
use crate::dtype::{DType, Element};
use crate::shape::{Shape, nbytes};

/// Where the channel axis of an image tensor is: how the image transforms
/// ([`crate::image`]) and the normalisation kernel ([`crate::normalize`]) read `u8` pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageLayout {
    /// `[channels, height, width]` (PyTorch).
    Chw,
    /// `[height, width, channels]` (decoded images, NumPy).
    Hwc,
}

impl ImageLayout {
    /// `(channels, height, width)` of a tensor in this layout.
    pub(crate) fn dims(self, t: &Tensor) -> Result<(usize, usize, usize), DataError> {
        self.dims_of(t.shape())
    }

    /// `(channels, height, width)` of a shape in this layout.
    pub(crate) fn dims_of(self, shape: &[usize]) -> Result<(usize, usize, usize), DataError> {
        match (self, shape) {
            (ImageLayout::Chw, &[c, h, w]) => Ok((c, h, w)),
            (ImageLayout::Hwc, &[h, w, c]) => Ok((c, h, w)),
            (_, s) => Err(DataError::ShapeMismatch(format!(
                "expected a 3-dimensional {self:?} image, got shape {s:?}"
            ))),
        }
    }

    /// The shape of a `channels x height x width` image in this layout.
    pub(crate) fn shape(self, c: usize, h: usize, w: usize) -> [usize; 3] {
        match self {
            ImageLayout::Chw => [c, h, w],
            ImageLayout::Hwc => [h, w, c],
        }
    }
}

/// An owned tensor: dtype, shape and native-endian bytes in 8-byte aligned storage,
/// so it can always be viewed as a typed slice.
#[derive(Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    words: Vec<u64>,
    len: usize,
}

impl Tensor {
    /// A zero-filled tensor.
    ///
    /// # Errors
    /// When the shape has too many dimensions or its size overflows.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Tensor, DataError> {
        let shape = Shape::new(shape)?;
        let len = nbytes(shape.dims(), dtype.size(), "tensor size")?;
        Ok(Tensor {
            dtype,
            shape,
            words: vec![0u64; len.div_ceil(8)],
            len,
        })
    }

    /// Copies `bytes` (native byte order) into a new tensor of `dtype` and `shape`.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when `bytes.len()` is not the size the shape implies.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, DataError> {
        let mut t = Tensor::zeros(dtype, shape)?;
        if bytes.len() != t.len {
            return Err(DataError::ShapeMismatch(format!(
                "{} bytes given for a {dtype} tensor of shape {shape:?} ({} bytes)",
                bytes.len(),
                t.len
            )));
        }
        t.bytes_mut().copy_from_slice(bytes);
        Ok(t)
    }

    /// Copies a typed slice into a new tensor of the given shape.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when `data.len()` is not the shape's element count.
    pub fn from_slice<T: Element>(shape: &[usize], data: &[T]) -> Result<Tensor, DataError> {
        Tensor::from_bytes(T::DTYPE, shape, bytemuck::cast_slice(data))
    }

    /// A one-dimensional tensor holding `data`.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Tensor {
        let bytes: &[u8] = bytemuck::cast_slice(&data);
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Tensor {
            dtype: T::DTYPE,
            shape: Shape::d1(data.len()),
            words,
            len: bytes.len(),
        }
    }

    /// A scalar (zero-dimensional) tensor.
    pub fn scalar<T: Element>(value: T) -> Tensor {
        let mut t = Tensor::from_vec(vec![value]);
        t.shape = Shape::SCALAR;
        t
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.len / self.dtype.size()
    }

    /// The raw bytes, native byte order.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }

    /// The raw bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.len]
    }

    /// The elements as a typed slice.
    ///
    /// # Errors
    /// [`DataError::DTypeMismatch`] when `T` is not this tensor's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], DataError> {
        self.check::<T>()?;
        // Storage is 8-byte aligned and every Element is at most 8 bytes, so the cast holds.
        bytemuck::try_cast_slice(self.bytes()).map_err(|_| DataError::Misaligned {
            what: "tensor".into(),
            align: std::mem::align_of::<T>(),
        })
    }

    /// The elements as a mutable typed slice.
    ///
    /// # Errors
    /// [`DataError::DTypeMismatch`] when `T` is not this tensor's dtype.
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T], DataError> {
        self.check::<T>()?;
        bytemuck::try_cast_slice_mut(self.bytes_mut()).map_err(|_| DataError::Misaligned {
            what: "tensor".into(),
            align: std::mem::align_of::<T>(),
        })
    }

    /// A borrowed view of this tensor.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            dtype: self.dtype,
            shape: self.shape,
            bytes: self.bytes(),
        }
    }

    /// Changes the shape, keeping the bytes.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the element count differs.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Tensor, DataError> {
        let new = Shape::new(shape)?;
        if new.numel() != Some(self.numel()) {
            return Err(DataError::ShapeMismatch(format!(
                "cannot reshape {:?} into {shape:?}",
                self.shape
            )));
        }
        self.shape = new;
        Ok(self)
    }

    fn check<T: Element>(&self) -> Result<(), DataError> {
        if T::DTYPE != self.dtype {
            return Err(DataError::DTypeMismatch {
                what: format!("tensor of shape {:?}", self.shape),
                actual: self.dtype,
                requested: T::DTYPE,
            });
        }
        Ok(())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.len)
            .finish()
    }
}

/// A borrowed tensor: dtype, shape and native-endian bytes.
#[derive(Clone, Copy, PartialEq)]
pub struct TensorRef<'a> {
    dtype: DType,
    shape: Shape,
    bytes: &'a [u8],
}

impl<'a> TensorRef<'a> {
    /// Wraps bytes as a tensor of `dtype` and `shape`.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the byte count does not match the shape.
    pub fn new(dtype: DType, shape: Shape, bytes: &'a [u8]) -> Result<TensorRef<'a>, DataError> {
        let need = nbytes(shape.dims(), dtype.size(), "tensor size")?;
        if need != bytes.len() {
            return Err(DataError::ShapeMismatch(format!(
                "{} bytes given for a {dtype} tensor of shape {shape:?} ({need} bytes)",
                bytes.len()
            )));
        }
        Ok(TensorRef {
            dtype,
            shape,
            bytes,
        })
    }

    /// A view of a typed slice with the given shape.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the element count does not match the shape.
    pub fn from_slice<T: Element>(shape: Shape, data: &'a [T]) -> Result<TensorRef<'a>, DataError> {
        TensorRef::new(T::DTYPE, shape, bytemuck::cast_slice(data))
    }

    fn of<T: Element>(shape: Shape, data: &'a [T]) -> TensorRef<'a> {
        TensorRef {
            dtype: T::DTYPE,
            shape,
            bytes: bytemuck::cast_slice(data),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The bytes, native byte order.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Copies into an owned [`Tensor`].
    pub fn to_owned(&self) -> Tensor {
        let mut t = Tensor {
            dtype: self.dtype,
            shape: self.shape,
            words: vec![0u64; self.bytes.len().div_ceil(8)],
            len: self.bytes.len(),
        };
        t.bytes_mut().copy_from_slice(self.bytes);
        t
    }
}

impl fmt::Debug for TensorRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRef")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// One fixed-shape numeric field of a sample: a scalar, an array, a `Vec`, a [`Tensor`]...
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tensor field of a sample",
    label = "not a tensor field",
    note = "a field is a tensor element (u8, i8, u16, i16, u32, i32, u64, i64, f16, f32, f64), an array of them (up to 3 dimensions), a `Vec`, `Box<[T]>` or slice of them, a `Tensor` or a `TensorRef`",
    note = "leave a field that is not a tensor out of the batch with `#[sample(skip)]`"
)]
pub trait Field {
    /// A borrowed view of the field.
    fn tensor_ref(&self) -> TensorRef<'_>;
}

impl<T: Element> Field for T {
    fn tensor_ref(&self) -> TensorRef<'_> {
        TensorRef::of(Shape::SCALAR, std::slice::from_ref(self))
    }
}

impl<T: Element, const N: usize> Field for [T; N] {
    fn tensor_ref(&self) -> TensorRef<'_> {
        TensorRef::of(Shape::d1(N), self.as_slice())
    }
}

impl<T: Element, const N: usize, const M: usize> Field for [[T; M]; N] {
    fn tensor_ref(&self) -> TensorRef<'_> {
        TensorRef::of(Shape::d2(N, M), self.as_flattened())
    }
}

impl<T: Element, const N: usize, const M: usize, const K: usize> Field for [[[T; K]; M]; N] {
    fn tensor_ref(&self) -> TensorRef<'_> {
        TensorRef::of(Shape::d3(N, M, K), self.as_flattened().as_flattened())
    }
}

impl<T: Element> Field for Vec<T> {
    fn tensor_ref(&self) -> TensorRef<'_> {
        TensorRef::of(Shape::d1(self.len()), self)
    }
}

impl<T: Element> Field for &[T] {
    fn tensor_ref(&self) -> TensorRef<'_> {
        TensorRef::of(Shape::d1(self.len()), self)
    }
}

impl<T: Element> Field for Box<[T]> {
    fn tensor_ref(&self) -> TensorRef<'_> {
        TensorRef::of(Shape::d1(self.len()), self)
    }
}

impl Field for Tensor {
    fn tensor_ref(&self) -> TensorRef<'_> {
        self.view()
    }
}

impl Field for TensorRef<'_> {
    fn tensor_ref(&self) -> TensorRef<'_> {
        *self
    }
}

/// A sample made of numbered fields, each a fixed-shape numeric tensor.
///
/// Implemented for tuples of up to six [`Field`]s (`(features, label)`,
/// `([f32; 64], i64)`, `(image_tensor, label)`), for a lone [`Tensor`], scalar or
/// array, and for `Vec<Tensor>`. For a struct, derive it: each field not marked
/// `#[sample(skip)]` becomes one tensor of the batch, in declaration order.
///
/// ```
/// use longshore_data::{Collate, Sample, StackCollate};
///
/// #[derive(Sample)]
/// struct Item {
///     pixels: [[u8; 2]; 2], // tensor 0: [batch, 2, 2] u8
///     label: i64,           // tensor 1: [batch] i64
///     #[sample(skip)]
///     name: String,         // not a tensor: left out of the batch
/// }
///
/// let items = vec![
///     Item { pixels: [[1, 2], [3, 4]], label: 7, name: "a".into() },
///     Item { pixels: [[5, 6], [7, 8]], label: 9, name: "b".into() },
/// ];
/// let batch = StackCollate::new().with_names(["pixels", "label"]).collate(&items)?;
/// assert_eq!(batch.shape(0)?, &[2, 2, 2]);
/// assert_eq!(batch.tensor_by_name::<i64>("label")?, &[7, 9]);
/// # Ok::<(), longshore_data::DataError>(())
/// ```
///
/// A struct that neither derives nor implements `Sample` is refused where a sample is
/// needed, with a note saying so:
///
/// ```compile_fail
/// use longshore_data::{Collate, StackCollate};
///
/// struct Item { label: i64 }
/// let _ = StackCollate::new().collate(&[Item { label: 1 }]);
/// ```
///
/// and so is a field that is not a tensor:
///
/// ```compile_fail
/// #[derive(longshore_data::Sample)]
/// struct Item { label: i64, name: String }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a sample: a dataset item made of tensor fields",
    label = "not a `Sample`",
    note = "for a struct, add `#[derive(Sample)]` (from `longshore_data` or `longshore::data`): each field becomes one tensor of the batch",
    note = "tuples of fields, `Tensor`, `Vec<Tensor>`, tensor elements and arrays of them are samples already"
)]
pub trait Sample {
    /// Number of fields.
    fn num_fields(&self) -> usize;
    /// Field `i`, or `None` when `i >= num_fields()`.
    fn field(&self, i: usize) -> Option<TensorRef<'_>>;
}

impl Sample for Tensor {
    fn num_fields(&self) -> usize {
        1
    }
    fn field(&self, i: usize) -> Option<TensorRef<'_>> {
        (i == 0).then(|| self.view())
    }
}

impl Sample for TensorRef<'_> {
    fn num_fields(&self) -> usize {
        1
    }
    fn field(&self, i: usize) -> Option<TensorRef<'_>> {
        (i == 0).then_some(*self)
    }
}

impl Sample for Vec<Tensor> {
    fn num_fields(&self) -> usize {
        self.len()
    }
    fn field(&self, i: usize) -> Option<TensorRef<'_>> {
        self.get(i).map(Tensor::view)
    }
}

/// A lone scalar is a one-field sample.
impl<T: Element> Sample for T {
    fn num_fields(&self) -> usize {
        1
    }
    fn field(&self, i: usize) -> Option<TensorRef<'_>> {
        (i == 0).then(|| self.tensor_ref())
    }
}

/// A lone array is a one-field sample.
impl<T: Element, const N: usize> Sample for [T; N] {
    fn num_fields(&self) -> usize {
        1
    }
    fn field(&self, i: usize) -> Option<TensorRef<'_>> {
        (i == 0).then(|| self.tensor_ref())
    }
}

macro_rules! tuple_sample {
    ($n:expr; $($name:ident $idx:tt),+) => {
        impl<$($name: Field),+> Sample for ($($name,)+) {
            fn num_fields(&self) -> usize {
                $n
            }
            fn field(&self, i: usize) -> Option<TensorRef<'_>> {
                match i {
                    $($idx => Some(self.$idx.tensor_ref()),)+
                    _ => None,
                }
            }
        }
    };
}

tuple_sample!(1; A 0);
tuple_sample!(2; A 0, B 1);
tuple_sample!(3; A 0, B 1, C 2);
tuple_sample!(4; A 0, B 1, C 2, D 3);
tuple_sample!(5; A 0, B 1, C 2, D 3, E 4);
tuple_sample!(6; A 0, B 1, C 2, D 3, E 4, F 5);
