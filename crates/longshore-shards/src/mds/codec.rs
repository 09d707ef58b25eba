//! Encoding and decoding MDS column values, byte for byte as Streaming's `encodings.py`.

use longshore_data::dtype::{ByteOrder, swap_bytes_in_place};
use longshore_data::{DType, Tensor};

use super::encoding::{Encoding, Value, ndarray_code, ndarray_dtype};
use super::pyjson;

fn u32_at(data: &[u8], at: usize) -> Result<u32, String> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| format!("needs 4 bytes at {at}, holds {}", data.len()))
}

fn exact<const N: usize>(data: &[u8]) -> Result<[u8; N], String> {
    data.try_into()
        .map_err(|_| format!("holds {} bytes, the encoding {N}", data.len()))
}

/// Little-endian bytes to a native tensor.
fn tensor(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Tensor, String> {
    let mut t = Tensor::from_bytes(dtype, shape, data).map_err(|e| e.to_string())?;
    if !ByteOrder::Little.is_native() {
        swap_bytes_in_place(t.bytes_mut(), dtype.size());
    }
    Ok(t)
}

/// `[n u32][n sizes u32][items]` after `skip` leading bytes: the items' byte slices.
fn sized_items(data: &[u8], skip: usize) -> Result<Vec<&[u8]>, String> {
    let n = u32_at(data, skip)? as usize;
    let mut at = skip + 4 + 4 * n;
    if at > data.len() {
        return Err(format!(
            "{n} items need {at} header bytes, the value holds {}",
            data.len()
        ));
    }
    let mut items = Vec::with_capacity(n);
    for i in 0..n {
        let size = u32_at(data, skip + 4 + 4 * i)? as usize;
        let item = data
            .get(at..at + size)
            .ok_or_else(|| format!("item {i} of {size} bytes at {at} ends past the value"))?;
        items.push(item);
        at += size;
    }
    Ok(items)
}

fn pil(data: &[u8]) -> Result<Value, String> {
    let (width, height, mode_len) = (u32_at(data, 0)?, u32_at(data, 4)?, u32_at(data, 8)?);
    let mode = data
        .get(12..12 + mode_len as usize)
        .ok_or("the PIL mode ends past the value")?;
    Ok(Value::Pil {
        width,
        height,
        mode: String::from_utf8(mode.to_vec()).map_err(|e| e.to_string())?,
        raw: data[12 + mode_len as usize..].to_vec(),
    })
}

/// Decodes one column value.
pub(crate) fn decode(encoding: &Encoding, data: &[u8]) -> Result<Value, String> {
    let text = || std::str::from_utf8(data).map_err(|e| format!("not UTF-8: {e}"));
    Ok(match encoding {
        Encoding::Bytes => Value::Bytes(data.to_vec()),
        Encoding::Str | Encoding::StrDecimal => Value::Str(text()?.to_owned()),
        Encoding::Int => Value::Int(i64::from_le_bytes(exact(data)?)),
        Encoding::Integer { bytes, signed } => {
            if data.len() != usize::from(*bytes) {
                return Err(format!("holds {} bytes, the encoding {bytes}", data.len()));
            }
            let mut b = [0u8; 8];
            b[..data.len()].copy_from_slice(data);
            let u = u64::from_le_bytes(b);
            if *signed {
                let shift = 64 - 8 * u32::from(*bytes);
                Value::Int(((u << shift) as i64) >> shift)
            } else {
                Value::UInt(u)
            }
        }
        Encoding::Float { bytes: 2 } => {
            Value::Float(half::f16::from_le_bytes(exact(data)?).to_f64())
        }
        Encoding::Float { bytes: 4 } => Value::Float(f32::from_le_bytes(exact(data)?).into()),
        Encoding::Float { .. } => Value::Float(f64::from_le_bytes(exact(data)?)),
        Encoding::StrInt => Value::Int(
            text()?
                .trim()
                .parse()
                .map_err(|_| "not an integer that fits i64".to_owned())?,
        ),
        Encoding::StrFloat => Value::Float(
            text()?
                .trim()
                .parse()
                .map_err(|_| "not a float".to_owned())?,
        ),
        Encoding::Jpeg | Encoding::Png => Value::Image(data.to_vec()),
        Encoding::Pil => pil(data)?,
        Encoding::Json => {
            Value::Json(serde_json::from_slice(data).map_err(|e| format!("not JSON: {e}"))?)
        }
        Encoding::Pickle => {
            return Err("pickle (`pkl`) values are not decoded; read their bytes".into());
        }
        Encoding::Other(name) => {
            return Err(format!(
                "encoding {name:?} is not a Streaming encoding; read its bytes"
            ));
        }
        Encoding::NdArray { dtype, shape } => {
            let mut at = 0;
            let dtype = match dtype {
                Some(d) => *d,
                None => {
                    let code = *data.first().ok_or("no dtype byte")?;
                    at = 1;
                    ndarray_dtype(code).ok_or(format!("unknown ndarray dtype code {code}"))?
                }
            };
            let shape = match shape {
                Some(s) => s.clone(),
                None => {
                    let byte = *data.get(at).ok_or("no shape byte")?;
                    at += 1;
                    let (ndim, width) = (usize::from(byte >> 2), 1usize << (byte & 3));
                    let raw = data
                        .get(at..at + ndim * width)
                        .ok_or("the shape ends past the value")?;
                    at += ndim * width;
                    raw.chunks(width)
                        .map(|c| {
                            let mut b = [0u8; 8];
                            b[..width].copy_from_slice(c);
                            usize::try_from(u64::from_le_bytes(b)).map_err(|e| e.to_string())
                        })
                        .collect::<Result<Vec<_>, _>>()?
                }
            };
            Value::Array(tensor(dtype, &shape, &data[at..])?)
        }
        Encoding::List(inner) => Value::List(
            sized_items(data, 4)?
                .into_iter()
                .map(|item| decode(inner, item))
                .collect::<Result<_, _>>()?,
        ),
        Encoding::JpegArray => Value::List(
            sized_items(data, 0)?
                .into_iter()
                .map(|item| Value::Image(item.to_vec()))
                .collect(),
        ),
    })
}

fn int_bytes(v: i128, bytes: u8, signed: bool) -> Result<Vec<u8>, String> {
    let bits = 8 * u32::from(bytes);
    let (lo, hi) = if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    };
    if v < lo || v > hi {
        return Err(format!("{v} does not fit {bits} bits"));
    }
    Ok((v as u64).to_le_bytes()[..usize::from(bytes)].to_vec())
}

fn join_sized(head: &[u8], items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = head.to_vec();
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
    }
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

/// Encodes one column value; [`Value::Bytes`] passes through under any encoding (as
/// Streaming's `mds_encode` does for `bytes`).
pub(crate) fn encode(encoding: &Encoding, value: &Value) -> Result<Vec<u8>, String> {
    let wrong = || {
        format!(
            "a {} value cannot be encoded as {}",
            kind(value),
            encoding.name()
        )
    };
    Ok(match (encoding, value) {
        (_, Value::Bytes(b)) => b.clone(),
        (Encoding::Str | Encoding::StrDecimal, Value::Str(s)) => s.as_bytes().to_vec(),
        (Encoding::Int, Value::Int(i)) => i.to_le_bytes().to_vec(),
        (Encoding::Int, Value::UInt(u)) => int_bytes(i128::from(*u), 8, true)?,
        (Encoding::Integer { bytes, signed }, Value::Int(i)) => {
            int_bytes(i128::from(*i), *bytes, *signed)?
        }
        (Encoding::Integer { bytes, signed }, Value::UInt(u)) => {
            int_bytes(i128::from(*u), *bytes, *signed)?
        }
        (Encoding::Float { bytes: 2 }, Value::Float(f)) => {
            half::f16::from_f64(*f).to_le_bytes().to_vec()
        }
        (Encoding::Float { bytes: 4 }, Value::Float(f)) => (*f as f32).to_le_bytes().to_vec(),
        (Encoding::Float { .. }, Value::Float(f)) => f.to_le_bytes().to_vec(),
        (Encoding::StrInt, Value::Int(i)) => i.to_string().into_bytes(),
        (Encoding::StrInt, Value::UInt(u)) => u.to_string().into_bytes(),
        (Encoding::StrFloat, Value::Float(f)) => pyjson::float_repr(*f).into_bytes(),
        (Encoding::Jpeg | Encoding::Png, Value::Image(b)) => b.clone(),
        (
            Encoding::Pil,
            Value::Pil {
                width,
                height,
                mode,
                raw,
            },
        ) => {
            let mut out = Vec::with_capacity(12 + mode.len() + raw.len());
            for v in [*width, *height, mode.len() as u32] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(mode.as_bytes());
            out.extend_from_slice(raw);
            out
        }
        (Encoding::Json, Value::Json(j)) => pyjson::dumps(j, false).into_bytes(),
        (Encoding::NdArray { dtype, shape }, Value::Array(t)) => {
            let code = ndarray_code(t.dtype())
                .ok_or_else(|| format!("ndarray cannot hold {} values", t.dtype()))?;
            if t.numel() == 0 {
                return Err("an ndarray with 0 elements cannot be encoded".into());
            }
            let mut out = Vec::new();
            match dtype {
                Some(d) if *d != t.dtype() => {
                    return Err(format!("wrong dtype: expected {d}, got {}", t.dtype()));
                }
                Some(_) => {}
                None => out.push(code),
            }
            match shape {
                Some(s) if s.as_slice() != t.shape() => {
                    return Err(format!("wrong shape: expected {s:?}, got {:?}", t.shape()));
                }
                Some(_) => {}
                None => {
                    let ndim = t.shape().len();
                    if ndim == 0 || ndim >= 64 {
                        return Err(format!("an ndarray of {ndim} axes cannot be encoded"));
                    }
                    let max = t.shape().iter().copied().max().unwrap_or(0) as u64;
                    let width: u8 = match max {
                        m if m < 1 << 8 => 0,
                        m if m < 1 << 16 => 1,
                        m if m < 1 << 32 => 2,
                        _ => 3,
                    };
                    out.push(((ndim as u8) << 2) | width);
                    for &d in t.shape() {
                        out.extend_from_slice(&(d as u64).to_le_bytes()[..1 << width]);
                    }
                }
            }
            let start = out.len();
            out.extend_from_slice(t.bytes());
            if !ByteOrder::Little.is_native() {
                swap_bytes_in_place(&mut out[start..], t.dtype().size());
            }
            out
        }
        (Encoding::List(inner), Value::List(items)) => {
            let encoded = items
                .iter()
                .map(|v| encode(inner, v))
                .collect::<Result<Vec<_>, _>>()?;
            join_sized(&[0; 4], &encoded)
        }
        (Encoding::JpegArray, Value::List(items)) => {
            let encoded = items
                .iter()
                .map(|v| encode(&Encoding::Jpeg, v))
                .collect::<Result<Vec<_>, _>>()?;
            join_sized(&[], &encoded)
        }
        _ => return Err(wrong()),
    })
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Bytes(_) => "bytes",
        Value::Str(_) => "str",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "float",
        Value::Json(_) => "json",
        Value::Image(_) => "image",
        Value::Pil { .. } => "pil",
        Value::Array(_) => "array",
        Value::List(_) => "list",
    }
}
