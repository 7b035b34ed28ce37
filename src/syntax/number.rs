//! Number literals: `16`, `-1`, `0.9`, `3e-5`, `1_000`, `6%`, `60M`, `2k`, `1.5G`, `64Ki`.
//!
//! The grammar lexes number-like tokens generously; this module decides whether a token is a
//! number and, if not, says why in words.

use crate::syntax::ast::NumberValue;

/// Size suffixes and their multipliers. Decimal ones match how DeepSpeed sizes are usually
/// written (`5e8`), binary ones are there for byte counts.
const SUFFIXES: &[(&str, f64)] = &[
    ("Ki", 1024.0),
    ("Mi", 1024.0 * 1024.0),
    ("Gi", 1024.0 * 1024.0 * 1024.0),
    ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("k", 1e3),
    ("K", 1e3),
    ("M", 1e6),
    ("G", 1e9),
    ("T", 1e12),
];

/// Parses a number token, or explains what is wrong with it.
pub fn parse(raw: &str) -> Result<NumberValue, String> {
    let (body, percent) = match raw.strip_suffix('%') {
        Some(b) => (b, true),
        None => (raw, false),
    };
    let bytes = body.as_bytes();
    let mut i = 0;
    if matches!(bytes.first(), Some(b'-' | b'+')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < bytes.len() && (bytes[*i].is_ascii_digit() || bytes[*i] == b'_') {
            *i += 1;
        }
        *i - start
    };
    digits(&mut i);
    let mut fractional = false;
    if bytes.get(i) == Some(&b'.') {
        i += 1;
        fractional = true;
        if digits(&mut i) == 0 {
            return Err("a decimal point must be followed by digits".into());
        }
        if bytes.get(i) == Some(&b'.') {
            return Err("a number has at most one decimal point".into());
        }
    }
    let mut exponent = false;
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        let mark = i;
        i += 1;
        if matches!(bytes.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            // `2e` or `1eM` is not an exponent; let the suffix check below explain.
            i = mark;
        } else {
            exponent = true;
        }
    }
    let numeric: String = body[..i].chars().filter(|&c| c != '_').collect();
    if body[..i].ends_with('_') || body[..i].contains("__") {
        return Err("`_` may only separate digits".into());
    }
    let rest = &body[i..];
    let multiplier = if rest.is_empty() {
        None
    } else {
        match SUFFIXES.iter().find(|(s, _)| *s == rest) {
            Some((_, m)) => Some(*m),
            None if rest.starts_with(['e', 'E']) => {
                return Err("an exponent needs digits, as in `3e-5`".into())
            }
            None => {
                return Err(format!(
                    "`{rest}` is not a number suffix (use `%`, `k`, `M`, `G`, `T`, `Ki`, `Mi`, `Gi` or `Ti`)"
                ))
            }
        }
    };
    if percent && multiplier.is_some() {
        return Err("a percentage cannot also have a size suffix".into());
    }
    let float: f64 = numeric
        .parse()
        .map_err(|_| "this is not a number".to_string())?;
    if !float.is_finite() {
        return Err("this number is too large".into());
    }
    if percent {
        return Ok(NumberValue::Percent(float));
    }
    if let Some(m) = multiplier {
        let v = float * m;
        if v.fract() != 0.0 {
            return Err("a size must come out as a whole number".into());
        }
        if v.abs() >= 9.2e18 {
            return Err("this number is too large".into());
        }
        return Ok(NumberValue::Int(v as i64));
    }
    if fractional || exponent {
        return Ok(NumberValue::Float(float));
    }
    numeric
        .parse::<i64>()
        .map(NumberValue::Int)
        .map_err(|_| "this integer is too large (the limit is 2^63 - 1)".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use NumberValue::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("16"), Ok(Int(16)));
        assert_eq!(parse("-1"), Ok(Int(-1)));
        assert_eq!(parse("1_000"), Ok(Int(1000)));
        assert_eq!(parse("0.9"), Ok(Float(0.9)));
        assert_eq!(parse("3e-5"), Ok(Float(3e-5)));
        assert_eq!(parse("5E8"), Ok(Float(5e8)));
        assert_eq!(parse("6%"), Ok(Percent(6.0)));
        assert_eq!(parse("2.5%"), Ok(Percent(2.5)));
        assert_eq!(parse("60M"), Ok(Int(60_000_000)));
        assert_eq!(parse("2k"), Ok(Int(2000)));
        assert_eq!(parse("1.5G"), Ok(Int(1_500_000_000)));
        assert_eq!(parse("64Ki"), Ok(Int(65536)));
        assert_eq!(parse("1e3k"), Ok(Int(1_000_000)));
    }

    #[test]
    fn explains_bad_numbers() {
        for bad in [
            "1.2.3",
            "12abc",
            "3e",
            "1.",
            "1__0",
            "1_",
            "2%k",
            "1.0001k",
            "99999999999999999999",
        ] {
            assert!(parse(bad).is_err(), "{bad} should be rejected");
        }
        assert!(parse("1.2.3").unwrap_err().contains("decimal point"));
        assert!(parse("3e").unwrap_err().contains("exponent"));
        assert!(parse("12abc").unwrap_err().contains("suffix"));
    }
}
