//! Element types: [`DType`], the Rust types that carry one ([`Element`]) and byte order
//! (shapes are in [`crate::shape`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The element type of a tensor, matching NumPy's numeric dtypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DType {
    /// `bool`, one byte holding 0 or 1.
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`.
    U16,
    /// `i16`.
    I16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// IEEE half precision ([`half::f16`]).
    F16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// NumPy's type character and size, without byte order (`"f4"`, `"b1"`...).
    pub const fn npy_code(self) -> &'static str {
        match self {
            DType::Bool => "b1",
            DType::U8 => "u1",
            DType::I8 => "i1",
            DType::U16 => "u2",
            DType::I16 => "i2",
            DType::U32 => "u4",
            DType::I32 => "i4",
            DType::U64 => "u8",
            DType::I64 => "i8",
            DType::F16 => "f2",
            DType::F32 => "f4",
            DType::F64 => "f8",
        }
    }

    /// Parses NumPy's type code without byte order (`"f4"`), if supported.
    pub fn from_npy_code(code: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.npy_code() == code)
    }

    /// Writes `value` converted to this dtype (saturating, as `as` casts do) into `out`,
    /// which must be exactly [`DType::size`] bytes long; used for padding values.
    pub(crate) fn encode_f64(self, value: f64, out: &mut [u8]) {
        macro_rules! put {
            ($t:ty) => {
                out.copy_from_slice(bytemuck::bytes_of(&(value as $t)))
            };
        }
        match self {
            DType::Bool => out[0] = u8::from(value != 0.0),
            DType::U8 => put!(u8),
            DType::I8 => put!(i8),
            DType::U16 => put!(u16),
            DType::I16 => put!(i16),
            DType::U32 => put!(u32),
            DType::I32 => put!(i32),
            DType::U64 => put!(u64),
            DType::I64 => put!(i64),
            DType::F16 => out.copy_from_slice(bytemuck::bytes_of(&half::f16::from_f64(value))),
            DType::F32 => put!(f32),
            DType::F64 => put!(f64),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        };
        f.write_str(s)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element of a tensor of one [`DType`].
///
/// Implemented for `u8`, `i8`, `u16`, `i16`, `u32`, `i32`, `u64`, `i64`,
/// [`half::f16`], `f32` and `f64`. `bool` tensors are read as bytes through
/// [`crate::Batch::tensor_bytes`] since not every byte is a valid `bool`.
///
/// `Element` is sealed: only those types implement it. A struct, or any other type,
/// that is a dataset item implements [`crate::Sample`] instead, most simply with
/// `#[derive(Sample)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tensor element type (u8, i8, u16, i16, u32, i32, u64, i64, f16, f32, f64)",
    label = "not a tensor element",
    note = "`Element` is sealed and cannot be implemented outside longshore-data",
    note = "to use a struct as a dataset item, derive `Sample` for it: `#[derive(longshore_data::Sample)]` (or `longshore::data::Sample`), with fields that are elements, arrays, `Vec`s or `Tensor`s"
)]
pub trait Element: bytemuck::Pod + Send + Sync + sealed::Sealed + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, half::f16 => F16, f32 => F32, f64 => F64,
}

/// Byte order of stored data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ByteOrder {
    /// Least significant byte first (x86, ARM; what longshore hands out).
    Little,
    /// Most significant byte first; converted on read.
    Big,
}

impl ByteOrder {
    /// The byte order of the machine running this code.
    pub const NATIVE: ByteOrder = if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };

    /// Whether this is the machine's byte order.
    pub fn is_native(self) -> bool {
        self == Self::NATIVE
    }
}

/// Reverses the bytes of every `elem`-byte element of `bytes` in place.
///
/// Used to bring big-endian data to native order. `bytes.len()` must be a
/// multiple of `elem`; a trailing partial element is left untouched.
pub fn swap_bytes_in_place(bytes: &mut [u8], elem: usize) {
    if elem <= 1 {
        return;
    }
    for chunk in bytes.chunks_exact_mut(elem) {
        chunk.reverse();
    }
}
