//! JSON text exactly as Python's `json.dumps` writes it (separators `", "` and `": "`,
//! `ensure_ascii`, floats as `repr`), for byte-compatible MDS files.

use serde_json::Value;

/// Python's `repr(float)`: the shortest round-trip digits, positional when the decimal
/// exponent is in `-4..16`, else `d.ddde±XX`.
pub(crate) fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` prints the shortest round-trip digits, like Python's repr.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let decpt = exp + 1;
    let body = if decpt <= -4 || decpt > 16 {
        let rest = if n > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        let esign = if decpt - 1 < 0 { '-' } else { '+' };
        format!("{}{rest}e{esign}{:02}", &digits[..1], (decpt - 1).abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= n {
        format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
    } else {
        let (a, b) = digits.split_at(decpt as usize);
        format!("{a}.{b}")
    };
    format!("{sign}{body}")
}

fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// `json.dumps(value, sort_keys=sort_keys)`.
pub(crate) fn dumps(value: &Value, sort_keys: bool) -> String {
    let mut out = String::new();
    write(value, sort_keys, &mut out);
    out
}

fn write(value: &Value, sort_keys: bool, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) if f.is_nan() => out.push_str("NaN"),
            (_, _, Some(f)) if f.is_infinite() => {
                out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" })
            }
            (_, _, Some(f)) => out.push_str(&float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write(v, sort_keys, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                string(k, out);
                out.push_str(": ");
                write(v, sort_keys, out);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        for (x, py) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1.5e-7, "1.5e-07"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e100, "1.2345e+100"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float_repr(x), py, "{x}");
        }
    }

    #[test]
    fn json_prints_like_python_dumps() {
        let v = serde_json::json!({"b": [1, 2.5, null, true], "a": "é\"\n\u{1F600}"});
        assert_eq!(
            dumps(&v, true),
            r#"{"a": "\u00e9\"\n\ud83d\ude00", "b": [1, 2.5, null, true]}"#
        );
    }
}
