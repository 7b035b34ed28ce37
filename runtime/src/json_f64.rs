//! `#[serde(with = "crate::json_f64")]`: an f64 that may be ±inf or NaN, in JSON. serde_json
//! writes a non-finite float as `null`, which then fails to read back as a number; a
//! metric-driven scheduler's "best so far" is ±inf until its first evaluation, and a checkpoint
//! written then must resume. Finite values stay JSON numbers (exact: serde_json round-trips
//! f64); the others are the strings `"inf"`, `"-inf"`, `"nan"`. A `null` (what such a field held
//! before this existed, only ever the plateau scheduler's initial +inf) reads as +inf.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr {
    Number(f64),
    Word(String),
    Null,
}

/// Writes `x`.
pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else if x.is_nan() {
        s.serialize_str("nan")
    } else if *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

/// Reads what [`serialize`] wrote.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Repr::deserialize(d)? {
        Repr::Number(x) => Ok(x),
        Repr::Null => Ok(f64::INFINITY),
        Repr::Word(w) => match w.as_str() {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            other => Err(serde::de::Error::custom(format!(
                "expected a number, \"inf\", \"-inf\" or \"nan\", found {other:?}"
            ))),
        },
    }
}

/// The same for a sequence of f64 (a rolling window of metrics).
pub mod seq {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::VecDeque;

    #[derive(Serialize, Deserialize)]
    struct One(#[serde(with = "super")] f64);

    /// Writes `xs`.
    pub fn serialize<S: Serializer>(xs: &VecDeque<f64>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(xs.iter().map(|&x| One(x)))
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<VecDeque<f64>, D::Error> {
        Ok(Vec::<One>::deserialize(d)?
            .into_iter()
            .map(|One(x)| x)
            .collect())
    }
}
