//! The bytes between a [`super::NetCollective`] and its proxy in the hub: a handshake, then one
//! request and one reply per collective. Little-endian throughout; `f32`/`f64` travel as their
//! bits, so what arrives is what was sent (NaN payloads and signed zeros included).
//!
//! Handshake: the rank sends `MAGIC`, then its rank, the world, the run's digest and mode; the
//! hub answers `WELCOME` with a blob (what rank 0's process hands every rank, e.g. an NCCL
//! unique id) once every rank has joined, or `REFUSE` with the reason.
//!
//! A request is a tag byte and its fields; a reply is `OK` and the op's result, or `ERR` and
//! the [`CollectiveError`] as JSON (errors are rare; their exact text must survive the trip).

use std::io::{self, Read, Write};

use crate::collective::{CollectiveError, ReduceOp};

/// The first bytes of a handshake: a stray connection (or another program) is told apart at
/// once, and a future change of this format changes the last byte.
pub const MAGIC: &[u8; 8] = b"RCPNET\x00\x01";

/// Handshake answers.
pub const WELCOME: u8 = 1;
pub const REFUSE: u8 = 2;

/// Reply status.
pub const OK: u8 = 0;
pub const ERR: u8 = 1;

/// Request tags.
pub mod tag {
    pub const ALL_REDUCE: u8 = 1;
    pub const REDUCE_SCATTER: u8 = 2;
    pub const REDUCE: u8 = 3;
    pub const ALL_GATHER: u8 = 4;
    pub const BROADCAST: u8 = 5;
    pub const MAX: u8 = 6;
    pub const SUM_F64: u8 = 7;
    pub const BARRIER: u8 = 8;
    /// [`crate::collective::Collective::abort`]: the proxy aborts the group with the reason.
    pub const ABORT: u8 = 9;
    /// The rank leaves (its handle was dropped) and says why; no reply.
    pub const LEAVE: u8 = 10;
}

/// Longest string field accepted (digests, modes, reasons, error JSON): a corrupt length is a
/// protocol error, not an allocation of gigabytes.
const MAX_TEXT: u64 = 1 << 20;
/// Longest blob (an NCCL unique id is 128 bytes).
const MAX_BLOB: u64 = 1 << 16;
/// Elements converted per chunk when streaming `f32` buffers.
const CHUNK: usize = 1 << 14;

/// What a rank says when it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub rank: usize,
    pub world: usize,
    /// What every process must agree on (the plan, the resumed step): see `train.rs`.
    pub digest: String,
    /// How the ranks exchange (`cpu`, `cuda`, `cuda+nccl`): every process must match.
    pub mode: String,
}

pub fn put_u8(w: &mut impl Write, v: u8) -> io::Result<()> {
    w.write_all(&[v])
}

pub fn put_u64(w: &mut impl Write, v: u64) -> io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

pub fn put_usize(w: &mut impl Write, v: usize) -> io::Result<()> {
    put_u64(w, v as u64)
}

pub fn put_bytes(w: &mut impl Write, b: &[u8]) -> io::Result<()> {
    put_usize(w, b.len())?;
    w.write_all(b)
}

pub fn put_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    put_bytes(w, s.as_bytes())
}

/// A length, then the elements' bits.
pub fn put_f32s(w: &mut impl Write, v: &[f32]) -> io::Result<()> {
    put_usize(w, v.len())?;
    let mut bytes = Vec::with_capacity(CHUNK.min(v.len()) * 4);
    for chunk in v.chunks(CHUNK) {
        bytes.clear();
        for x in chunk {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        w.write_all(&bytes)?;
    }
    Ok(())
}

pub fn get_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

pub fn get_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

pub fn get_usize(r: &mut impl Read) -> io::Result<usize> {
    let v = get_u64(r)?;
    usize::try_from(v).map_err(|_| bad(format!("length {v} does not fit this machine")))
}

fn get_bytes_max(r: &mut impl Read, max: u64) -> io::Result<Vec<u8>> {
    let n = get_u64(r)?;
    if n > max {
        return Err(bad(format!("a field of {n} bytes (at most {max})")));
    }
    let mut b = vec![0u8; n as usize];
    r.read_exact(&mut b)?;
    Ok(b)
}

pub fn get_blob(r: &mut impl Read) -> io::Result<Vec<u8>> {
    get_bytes_max(r, MAX_BLOB)
}

pub fn get_str(r: &mut impl Read) -> io::Result<String> {
    String::from_utf8(get_bytes_max(r, MAX_TEXT)?).map_err(|_| bad("a string that is not UTF-8"))
}

/// Reads a length-prefixed `f32` buffer of at most `max` elements.
pub fn get_f32s(r: &mut impl Read, max: usize) -> io::Result<Vec<f32>> {
    let n = get_usize(r)?;
    if n > max {
        return Err(bad(format!("{n} elements where at most {max} fit")));
    }
    // Grown as the bytes arrive: a corrupt length fails at the read, not at the allocation.
    let mut out = Vec::with_capacity(n.min(1 << 24));
    let mut bytes = vec![0u8; CHUNK.min(n) * 4];
    let mut left = n;
    while left > 0 {
        let k = left.min(CHUNK);
        r.read_exact(&mut bytes[..k * 4])?;
        out.extend(
            bytes[..k * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        left -= k;
    }
    Ok(out)
}

/// Reads a length-prefixed `f32` buffer into `out`, which must have exactly that length.
pub fn get_f32s_into(r: &mut impl Read, out: &mut [f32]) -> io::Result<()> {
    let n = get_usize(r)?;
    if n != out.len() {
        return Err(bad(format!(
            "a reply of {n} elements for a buffer of {}",
            out.len()
        )));
    }
    let mut bytes = vec![0u8; CHUNK.min(n) * 4];
    for chunk in out.chunks_mut(CHUNK) {
        let k = chunk.len();
        r.read_exact(&mut bytes[..k * 4])?;
        for (o, b) in chunk.iter_mut().zip(bytes[..k * 4].chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    Ok(())
}

pub fn put_op(w: &mut impl Write, op: ReduceOp) -> io::Result<()> {
    put_u8(
        w,
        match op {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 1,
        },
    )
}

pub fn get_op(r: &mut impl Read) -> io::Result<ReduceOp> {
    match get_u8(r)? {
        0 => Ok(ReduceOp::Sum),
        1 => Ok(ReduceOp::Avg),
        b => Err(bad(format!("reduction {b}"))),
    }
}

pub fn put_hello(w: &mut impl Write, h: &Hello) -> io::Result<()> {
    w.write_all(MAGIC)?;
    put_usize(w, h.rank)?;
    put_usize(w, h.world)?;
    put_str(w, &h.digest)?;
    put_str(w, &h.mode)
}

pub fn get_hello(r: &mut impl Read) -> io::Result<Hello> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(bad("not a recipe rank (or another version of recipe)"));
    }
    Ok(Hello {
        rank: get_usize(r)?,
        world: get_usize(r)?,
        digest: get_str(r)?,
        mode: get_str(r)?,
    })
}

/// `ERR` and the error.
pub fn put_err(w: &mut impl Write, e: &CollectiveError) -> io::Result<()> {
    put_u8(w, ERR)?;
    let json = serde_json::to_string(e).map_err(|e| bad(e.to_string()))?;
    put_str(w, &json)
}

/// After `ERR`: the error.
pub fn get_err(r: &mut impl Read) -> io::Result<CollectiveError> {
    let json = get_str(r)?;
    serde_json::from_str(&json).map_err(|e| bad(format!("an error that does not parse: {e}")))
}

/// A malformed message.
pub fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_cross_bit_for_bit_in_chunks() {
        // Longer than one chunk, with values whose bits a lossy path would change.
        let mut v: Vec<f32> = (0..CHUNK * 2 + 7).map(|i| i as f32 * 0.1 - 3.0).collect();
        v[0] = -0.0;
        v[1] = f32::from_bits(0x7fc0_1234); // a NaN with a payload
        v[2] = f32::INFINITY;
        v[3] = f32::from_bits(1); // the smallest subnormal
        let mut bytes = Vec::new();
        put_f32s(&mut bytes, &v).unwrap();
        assert_eq!(bytes.len(), 8 + v.len() * 4);
        let back = get_f32s(&mut &bytes[..], v.len()).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&v));
        let mut into = vec![0.0; v.len()];
        get_f32s_into(&mut &bytes[..], &mut into).unwrap();
        assert_eq!(bits(&into), bits(&v));
        // A buffer of another length is refused, not truncated or overrun.
        let mut short = vec![0.0; 3];
        assert!(get_f32s_into(&mut &bytes[..], &mut short).is_err());
        assert!(get_f32s(&mut &bytes[..], 3).is_err());
    }

    #[test]
    fn a_handshake_round_trips_and_a_stranger_is_refused() {
        let h = Hello {
            rank: 3,
            world: 4,
            digest: "plan 1f2e".into(),
            mode: "cpu".into(),
        };
        let mut bytes = Vec::new();
        put_hello(&mut bytes, &h).unwrap();
        assert_eq!(get_hello(&mut &bytes[..]).unwrap(), h);
        let e = get_hello(&mut &b"GET / HTTP/1.1\r\n\r\n"[..]).unwrap_err();
        assert!(e.to_string().contains("not a recipe rank"), "{e}");
        // A huge declared length is an error, not an allocation.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&0u64.to_le_bytes());
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(get_hello(&mut &huge[..]).is_err());
    }

    #[test]
    fn errors_keep_their_words() {
        let e = CollectiveError::Aborted {
            rank: 2,
            reason: "it left the group: its thread panicked".into(),
        };
        let mut bytes = Vec::new();
        put_err(&mut bytes, &e).unwrap();
        let mut r = &bytes[..];
        assert_eq!(get_u8(&mut r).unwrap(), ERR);
        assert_eq!(get_err(&mut r).unwrap(), e);
    }
}
