//! MDS column encodings (Streaming's `streaming/base/format/mds/encodings.py`) and the
//! [`Value`]s they hold.

use longshore_data::{DType, Tensor};

/// A column encoding, as named in `index.json`'s `column_encodings`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encoding {
    /// `bytes`: raw bytes.
    Bytes,
    /// `str`: UTF-8 text.
    Str,
    /// `int`: a little-endian `int64`.
    Int,
    /// `uint8`, `uint16`, `uint32`, `uint64`, `int8`, ..., `int64`: a little-endian integer of
    /// that many bytes, signed or not.
    Integer {
        /// Bytes (1, 2, 4, 8).
        bytes: u8,
        /// Signed.
        signed: bool,
    },
    /// `float16`, `float32`, `float64`: a little-endian IEEE float.
    Float {
        /// Bytes (2, 4, 8).
        bytes: u8,
    },
    /// `str_int`: an integer as decimal digits.
    StrInt,
    /// `str_float`: a float as Python's `str(float)`.
    StrFloat,
    /// `str_decimal`: a decimal number as text (kept as text).
    StrDecimal,
    /// `jpeg`: JPEG bytes (kept encoded).
    Jpeg,
    /// `png`: PNG bytes (kept encoded).
    Png,
    /// `pil`: a raw PIL image: `[width u32][height u32][mode length u32][mode][pixels]`.
    Pil,
    /// `json`: JSON text.
    Json,
    /// `pkl`: a Python pickle; never decoded (it can run code), its bytes are available.
    Pickle,
    /// `ndarray[:dtype[:d0,d1,...]]`: a NumPy array, dtype and shape either in the encoding
    /// (static) or before the values (dynamic).
    NdArray {
        /// The static dtype, if given.
        dtype: Option<DType>,
        /// The static shape, if given.
        shape: Option<Vec<usize>>,
    },
    /// `list[jpeg]`, `list[png]`, `list[pil]`: `[0 u32][n u32][n sizes u32][items]`.
    List(Box<Encoding>),
    /// `jpeg_array` (or `jpegarray`): `[n u32][n sizes u32][JPEGs]`.
    JpegArray,
    /// An encoding Streaming does not define (one a user registered): its values are
    /// available as bytes only.
    Other(String),
}

/// NumPy dtype name -> (MDS ndarray code, longshore dtype).
const NDARRAY_DTYPES: [(&str, u8, DType); 11] = [
    ("uint8", 8, DType::U8),
    ("int8", 9, DType::I8),
    ("uint16", 16, DType::U16),
    ("int16", 17, DType::I16),
    ("float16", 18, DType::F16),
    ("uint32", 32, DType::U32),
    ("int32", 33, DType::I32),
    ("float32", 34, DType::F32),
    ("uint64", 64, DType::U64),
    ("int64", 65, DType::I64),
    ("float64", 66, DType::F64),
];

/// The ndarray value-dtype code of `dtype`.
pub(crate) fn ndarray_code(dtype: DType) -> Option<u8> {
    NDARRAY_DTYPES
        .iter()
        .find(|(_, _, d)| *d == dtype)
        .map(|(_, c, _)| *c)
}

/// The dtype of ndarray value-dtype code `code`.
pub(crate) fn ndarray_dtype(code: u8) -> Option<DType> {
    NDARRAY_DTYPES
        .iter()
        .find(|(_, c, _)| *c == code)
        .map(|(_, _, d)| *d)
}

fn numpy_name(dtype: DType) -> Option<&'static str> {
    NDARRAY_DTYPES
        .iter()
        .find(|(_, _, d)| *d == dtype)
        .map(|(n, _, _)| *n)
}

impl Encoding {
    /// Parses an encoding name; `None` for one Streaming does not define.
    pub fn parse(name: &str) -> Option<Encoding> {
        let (base, config) = match name.split_once(':') {
            Some((b, c)) => (b, Some(c)),
            None => (name, None),
        };
        if base == "ndarray" {
            let args: Vec<&str> = match config {
                Some(c) if !c.is_empty() => c.split(':').collect(),
                _ => Vec::new(),
            };
            if args.len() > 2 {
                return None;
            }
            let dtype = match args.first() {
                Some(n) => Some(NDARRAY_DTYPES.iter().find(|(d, _, _)| d == n)?.2),
                None => None,
            };
            let shape = match args.get(1) {
                Some(s) => Some(
                    s.split(',')
                        .map(|d| d.trim().parse::<usize>().ok().filter(|&d| d >= 1))
                        .collect::<Option<Vec<_>>>()?,
                ),
                None => None,
            };
            return Some(Encoding::NdArray { dtype, shape });
        }
        if config.is_some() {
            return None;
        }
        let int = |bytes, signed| Some(Encoding::Integer { bytes, signed });
        match base {
            "bytes" => Some(Encoding::Bytes),
            "str" => Some(Encoding::Str),
            "int" => Some(Encoding::Int),
            "uint8" => int(1, false),
            "uint16" => int(2, false),
            "uint32" => int(4, false),
            "uint64" => int(8, false),
            "int8" => int(1, true),
            "int16" => int(2, true),
            "int32" => int(4, true),
            "int64" => int(8, true),
            "float16" => Some(Encoding::Float { bytes: 2 }),
            "float32" => Some(Encoding::Float { bytes: 4 }),
            "float64" => Some(Encoding::Float { bytes: 8 }),
            "str_int" => Some(Encoding::StrInt),
            "str_float" => Some(Encoding::StrFloat),
            "str_decimal" => Some(Encoding::StrDecimal),
            "jpeg" => Some(Encoding::Jpeg),
            "png" => Some(Encoding::Png),
            "pil" => Some(Encoding::Pil),
            "json" => Some(Encoding::Json),
            "pkl" => Some(Encoding::Pickle),
            "list[jpeg]" => Some(Encoding::List(Box::new(Encoding::Jpeg))),
            "list[png]" => Some(Encoding::List(Box::new(Encoding::Png))),
            "list[pil]" => Some(Encoding::List(Box::new(Encoding::Pil))),
            "jpeg_array" | "jpegarray" => Some(Encoding::JpegArray),
            _ => None,
        }
    }

    /// The encoding's name (as [`Encoding::parse`] reads it).
    pub fn name(&self) -> String {
        match self {
            Encoding::Bytes => "bytes".into(),
            Encoding::Str => "str".into(),
            Encoding::Int => "int".into(),
            Encoding::Integer { bytes, signed } => {
                format!("{}int{}", if *signed { "" } else { "u" }, 8 * bytes)
            }
            Encoding::Float { bytes } => format!("float{}", 8 * bytes),
            Encoding::StrInt => "str_int".into(),
            Encoding::StrFloat => "str_float".into(),
            Encoding::StrDecimal => "str_decimal".into(),
            Encoding::Jpeg => "jpeg".into(),
            Encoding::Png => "png".into(),
            Encoding::Pil => "pil".into(),
            Encoding::Json => "json".into(),
            Encoding::Pickle => "pkl".into(),
            Encoding::NdArray { dtype, shape } => {
                let mut s = "ndarray".to_owned();
                if let Some(d) = dtype.and_then(numpy_name) {
                    s = format!("{s}:{d}");
                    if let Some(shape) = shape {
                        let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
                        s = format!("{s}:{}", dims.join(","));
                    }
                }
                s
            }
            Encoding::List(inner) => format!("list[{}]", inner.name()),
            Encoding::JpegArray => "jpeg_array".into(),
            Encoding::Other(name) => name.clone(),
        }
    }

    /// The fixed size of every encoded value in bytes, or `None` when it varies (Streaming's
    /// `get_mds_encoded_size`, the `column_sizes` of `index.json`).
    pub fn fixed_size(&self) -> Option<u64> {
        match self {
            Encoding::Int => Some(8),
            Encoding::Integer { bytes, .. } | Encoding::Float { bytes } => Some(u64::from(*bytes)),
            Encoding::NdArray {
                dtype: Some(d),
                shape: Some(s),
            } => Some(s.iter().map(|&d| d as u64).product::<u64>() * d.size() as u64),
            _ => None,
        }
    }
}

/// A decoded MDS value (or one to encode).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// Raw bytes (`bytes`, `pkl`); written as-is under any encoding, as Streaming does.
    Bytes(Vec<u8>),
    /// Text (`str`, `str_decimal`).
    Str(String),
    /// A signed integer (`int`, `int8`..`int64`, `str_int`).
    Int(i64),
    /// An unsigned integer (`uint8`..`uint64`).
    UInt(u64),
    /// A float (`float16`..`float64`, `str_float`).
    Float(f64),
    /// JSON (`json`).
    Json(serde_json::Value),
    /// An encoded image (`jpeg`, `png`), kept encoded for a decoder.
    Image(Vec<u8>),
    /// A raw PIL image (`pil`).
    Pil {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// PIL's mode (`RGB`, `L`, ...).
        mode: String,
        /// The pixels as `Image.tobytes()` gives them.
        raw: Vec<u8>,
    },
    /// An array (`ndarray`).
    Array(Tensor),
    /// A list (`list[jpeg]`, `list[png]`, `list[pil]`, `jpeg_array`).
    List(Vec<Value>),
}

impl Value {
    /// What kind of value this is, for messages (`"bytes"`, `"text"`, `"an array"`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Bytes(_) => "bytes",
            Value::Str(_) => "text",
            Value::Int(_) => "an integer",
            Value::UInt(_) => "an unsigned integer",
            Value::Float(_) => "a float",
            Value::Json(_) => "JSON",
            Value::Image(_) => "an encoded image",
            Value::Pil { .. } => "a raw PIL image",
            Value::Array(_) => "an array",
            Value::List(_) => "a list",
        }
    }
}
