//! The `.npy` format: header parsing (versions 1.0, 2.0, 3.0) and a small writer.
//!
//! The parser accepts the header NumPy writes: a Python dict literal with the keys
//! `descr`, `fortran_order` and `shape`. Simple numeric dtypes in either byte order
//! are supported; structured dtypes and Fortran-ordered arrays of more than one
//! dimension are refused with an error saying so.

use std::io::Write;
use std::path::Path;

use crate::dtype::{ByteOrder, DType};
use crate::error::{DataError, NpyError};
use crate::shape::nbytes;

/// The magic string every `.npy` file starts with.
pub(crate) const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Format version (major, minor).
    pub version: (u8, u8),
    /// Element type.
    pub dtype: DType,
    /// Byte order of the stored data.
    pub byte_order: ByteOrder,
    /// The array's shape.
    pub shape: Vec<usize>,
    /// Offset of the first data byte in the file.
    pub data_offset: usize,
}

impl NpyHeader {
    /// Bytes of array data the header describes.
    ///
    /// # Errors
    /// [`NpyError::ShapeOverflow`] when the size does not fit `usize`.
    pub fn data_len(&self) -> Result<usize, NpyError> {
        nbytes(&self.shape, self.dtype.size(), "npy data size")
            .map_err(|_| NpyError::ShapeOverflow(self.shape.clone()))
    }
}

/// Parses the header at the start of `bytes` (which may hold the whole file or just
/// enough of it to contain the header).
///
/// # Errors
/// An [`NpyError`] naming the offset and what is wrong. Never panics, whatever the bytes.
pub fn parse_header(bytes: &[u8]) -> Result<NpyHeader, NpyError> {
    if bytes.len() < 8 {
        if !MAGIC.starts_with(&bytes[..bytes.len().min(6)]) {
            return Err(NpyError::BadMagic);
        }
        return Err(NpyError::Truncated {
            needed: 10,
            actual: bytes.len() as u64,
        });
    }
    if &bytes[..6] != MAGIC {
        return Err(NpyError::BadMagic);
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len_size, encoding) = match (major, minor) {
        (1, 0) => (2usize, "ascii"),
        (2, 0) => (4, "ascii"),
        (3, 0) => (4, "utf-8"),
        _ => return Err(NpyError::UnsupportedVersion { major, minor }),
    };
    let text_start = 8 + len_size;
    if bytes.len() < text_start {
        return Err(NpyError::Truncated {
            needed: text_start as u64,
            actual: bytes.len() as u64,
        });
    }
    let header_len = if len_size == 2 {
        usize::from(u16::from_le_bytes([bytes[8], bytes[9]]))
    } else {
        let n = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        usize::try_from(n).map_err(|_| NpyError::Truncated {
            needed: u64::from(n),
            actual: bytes.len() as u64,
        })?
    };
    let data_offset = text_start + header_len;
    if bytes.len() < data_offset {
        return Err(NpyError::Truncated {
            needed: data_offset as u64,
            actual: bytes.len() as u64,
        });
    }
    let raw = &bytes[text_start..data_offset];
    if encoding == "ascii" && !raw.is_ascii() {
        return Err(NpyError::BadEncoding {
            offset: text_start,
            encoding,
        });
    }
    let text = std::str::from_utf8(raw).map_err(|_| NpyError::BadEncoding {
        offset: text_start,
        encoding,
    })?;
    let dict = Parser {
        s: text.as_bytes(),
        pos: 0,
        base: text_start,
        depth: 0,
    }
    .parse_dict()?;

    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    for (key, value) in dict {
        match key.as_str() {
            "descr" => descr = Some(value),
            "fortran_order" => fortran = Some(value),
            "shape" => shape = Some(value),
            _ => {}
        }
    }
    let descr = descr.ok_or(NpyError::MissingKey("descr"))?;
    let fortran = match fortran.ok_or(NpyError::MissingKey("fortran_order"))? {
        Value::Bool(b) => b,
        other => {
            return Err(NpyError::Syntax {
                offset: text_start,
                reason: format!("'fortran_order' must be True or False, found {other:?}"),
            });
        }
    };
    let shape = match shape.ok_or(NpyError::MissingKey("shape"))? {
        Value::Tuple(items) => items
            .into_iter()
            .map(|v| match v {
                Value::Int(n) => usize::try_from(n).map_err(|_| NpyError::ShapeOverflow(vec![])),
                other => Err(NpyError::Syntax {
                    offset: text_start,
                    reason: format!("'shape' entries must be integers, found {other:?}"),
                }),
            })
            .collect::<Result<Vec<usize>, NpyError>>()?,
        other => {
            return Err(NpyError::Syntax {
                offset: text_start,
                reason: format!("'shape' must be a tuple, found {other:?}"),
            });
        }
    };
    let (dtype, byte_order) = match descr {
        Value::Str(s) => parse_descr(&s)?,
        other => return Err(NpyError::UnsupportedDType(format!("{other:?}"))),
    };
    if fortran && shape.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(NpyError::FortranOrder(shape));
    }
    let header = NpyHeader {
        version: (major, minor),
        dtype,
        byte_order,
        shape,
        data_offset,
    };
    header.data_len()?;
    Ok(header)
}

fn parse_descr(s: &str) -> Result<(DType, ByteOrder), NpyError> {
    let unsupported = || NpyError::UnsupportedDType(s.to_owned());
    let (order, code) = match s.as_bytes().first() {
        Some(b'<') => (Some(ByteOrder::Little), &s[1..]),
        Some(b'>') => (Some(ByteOrder::Big), &s[1..]),
        Some(b'=') => (Some(ByteOrder::NATIVE), &s[1..]),
        Some(b'|') => (None, &s[1..]),
        _ => (Some(ByteOrder::NATIVE), s),
    };
    let dtype = match code {
        "?" => DType::Bool,
        c => DType::from_npy_code(c).ok_or_else(unsupported)?,
    };
    let order = match order {
        Some(o) => o,
        None if dtype.size() == 1 => ByteOrder::NATIVE,
        None => return Err(unsupported()),
    };
    Ok((dtype, order))
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    None,
    Int(u64),
    Tuple(Vec<Value>),
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    base: usize,
    depth: usize,
}

const MAX_DEPTH: usize = 32;

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> NpyError {
        NpyError::Syntax {
            offset: self.base + self.pos,
            reason: reason.into(),
        }
    }

    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && matches!(self.s[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), NpyError> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err(format!("expected '{}'", c as char)))
        }
    }

    fn parse_dict(mut self) -> Result<Vec<(String, Value)>, NpyError> {
        self.expect(b'{')?;
        let mut out = Vec::new();
        loop {
            if self.peek() == Some(b'}') {
                self.pos += 1;
                break;
            }
            let key = match self.parse_value()? {
                Value::Str(s) => s,
                _ => return Err(self.err("dict keys must be strings")),
            };
            self.expect(b':')?;
            let value = self.parse_value()?;
            out.push((key, value));
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
        // Only whitespace may follow the dict (NumPy pads with spaces and a newline).
        if self.peek().is_some() {
            return Err(self.err("unexpected text after the header dict"));
        }
        Ok(out)
    }

    fn parse_value(&mut self) -> Result<Value, NpyError> {
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => {
                self.pos += 1;
                let start = self.pos;
                while self.pos < self.s.len() && self.s[self.pos] != q {
                    if self.s[self.pos] == b'\\' {
                        return Err(self.err("escape sequences are not supported in strings"));
                    }
                    self.pos += 1;
                }
                if self.pos >= self.s.len() {
                    return Err(self.err("unterminated string"));
                }
                let s = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
                self.pos += 1;
                Ok(Value::Str(s))
            }
            Some(open @ (b'(' | b'[')) => {
                let close = if open == b'(' { b')' } else { b']' };
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(self.err("nesting too deep"));
                }
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    if self.peek() == Some(close) {
                        self.pos += 1;
                        break;
                    }
                    items.push(self.parse_value()?);
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(c) if c == close => {}
                        _ => return Err(self.err(format!("expected ',' or '{}'", close as char))),
                    }
                }
                self.depth -= 1;
                if open == b'(' {
                    Ok(Value::Tuple(items))
                } else {
                    // Lists only appear in structured dtypes, which are unsupported.
                    Err(NpyError::UnsupportedDType(format!("{items:?}")))
                }
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.pos;
                while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
                    self.pos += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
                let n: u64 = digits.parse().map_err(|_| self.err("integer too large"))?;
                // Python 2 wrote long integers with an `L` suffix.
                if self.s.get(self.pos) == Some(&b'L') {
                    self.pos += 1;
                }
                Ok(Value::Int(n))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                while self.pos < self.s.len() && self.s[self.pos].is_ascii_alphanumeric() {
                    self.pos += 1;
                }
                match &self.s[start..self.pos] {
                    b"True" => Ok(Value::Bool(true)),
                    b"False" => Ok(Value::Bool(false)),
                    b"None" => Ok(Value::None),
                    _ => {
                        self.pos = start;
                        Err(self.err("unknown identifier"))
                    }
                }
            }
            Some(_) => Err(self.err("unexpected character")),
            None => Err(self.err("unexpected end of header")),
        }
    }
}

/// Encodes a `.npy` header (little-endian data, C order) for `dtype` and `shape`.
///
/// The result is padded so the data that follows starts at a multiple of 64 bytes.
/// Version 1.0 is used unless the header needs more than 65535 bytes.
pub fn encode_header(dtype: DType, shape: &[usize]) -> Vec<u8> {
    let order = if dtype.size() == 1 { '|' } else { '<' };
    let shape_str = match shape {
        [] => "()".to_owned(),
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{order}{}', 'fortran_order': False, 'shape': {shape_str}, }}",
        dtype.npy_code()
    );
    let build = |len_size: usize, major: u8| {
        let unpadded = 8 + len_size + dict.len() + 1;
        let total = unpadded.div_ceil(64) * 64;
        let header_len = total - 8 - len_size;
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[major, 0]);
        if len_size == 2 {
            out.extend_from_slice(&(header_len as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(header_len as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out.resize(total - 1, b' ');
        out.push(b'\n');
        out
    };
    if 10 + dict.len() + 1 + 63 <= usize::from(u16::MAX) {
        build(2, 1)
    } else {
        build(4, 2)
    }
}

/// Encodes a whole `.npy` file: header plus `data` (native bytes, converted to little endian).
///
/// # Errors
/// [`DataError::ShapeMismatch`] when `data` does not hold exactly the bytes the shape implies.
pub fn encode_npy(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Vec<u8>, DataError> {
    let need = nbytes(shape, dtype.size(), "npy data size")?;
    if data.len() != need {
        return Err(DataError::ShapeMismatch(format!(
            "{} data bytes for a {dtype} array of shape {shape:?} ({need} bytes)",
            data.len()
        )));
    }
    let mut out = encode_header(dtype, shape);
    let start = out.len();
    out.extend_from_slice(data);
    if !ByteOrder::Little.is_native() {
        crate::dtype::swap_bytes_in_place(&mut out[start..], dtype.size());
    }
    Ok(out)
}

/// Writes a `.npy` file holding a typed slice with the given shape.
///
/// # Errors
/// [`DataError::ShapeMismatch`] when `data.len()` does not match `shape`,
/// [`DataError::Io`] when the file cannot be written.
pub fn write_npy<T: crate::Element>(
    path: impl AsRef<Path>,
    shape: &[usize],
    data: &[T],
) -> Result<(), DataError> {
    write_npy_bytes(path, T::DTYPE, shape, bytemuck::cast_slice(data))
}

/// Writes a `.npy` file from raw native-endian bytes of `dtype`.
///
/// # Errors
/// As [`write_npy`].
pub fn write_npy_bytes(
    path: impl AsRef<Path>,
    dtype: DType,
    shape: &[usize],
    data: &[u8],
) -> Result<(), DataError> {
    let path = path.as_ref();
    let bytes = encode_npy(dtype, shape, data)?;
    let io = |source| DataError::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_data().map_err(io)?;
    tracing::debug!(target: "longshore::data", path = %path.display(), %dtype, ?shape, "wrote npy");
    Ok(())
}
