//! cuBLAS v2 on the CPU: handles (each with its stream, math mode and workspace) and the GEMMs
//! the CUDA backend calls (`cublasSgemm_v2`, `cublasGemmEx`, `cublasGemmBatchedEx`, and
//! `cublasGemmStridedBatchedEx`), with cuBLAS's column-major semantics and argument checks.
//!
//! A GEMM reads its operands as their type, widened to f32 (f32 operands first rounded to f16,
//! bf16 or TF32 where the compute type or the math mode lets cuBLAS do that), sums each dot
//! product in f32 in k order without FMA, then takes `alpha·sum + beta·C` in f32 and rounds it
//! once to C's type (nearest even). With `beta == 0` C is not read; with `alpha == 0` or
//! `k == 0` neither are A and B. Arguments cuBLAS rejects are refused before anything is
//! queued. The ranges of the operands (and of a batch's pointer lists) are checked when the
//! operation runs, against the live allocations of the handle's GPU; one outside them faults
//! the GPU, as a kernel's stray access would.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_longlong, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

use half::{bf16, f16};

use crate::{complain, State};

/// The `cublasStatus_t` codes returned here (cublas_api.h).
pub mod status {
    pub const SUCCESS: u32 = 0;
    pub const NOT_INITIALIZED: u32 = 1;
    pub const INVALID_VALUE: u32 = 7;
    pub const EXECUTION_FAILED: u32 = 13;
    pub const NOT_SUPPORTED: u32 = 15;
}

// `cudaDataType` (library_types.h).
pub(crate) const CUDA_R_32F: u32 = 0;
pub(crate) const CUDA_R_16F: u32 = 2;
pub(crate) const CUDA_R_16BF: u32 = 14;

// `cublasComputeType_t`.
const COMPUTE_32F: u32 = 68;
const COMPUTE_32F_PEDANTIC: u32 = 69;
const COMPUTE_32F_FAST_16F: u32 = 74;
const COMPUTE_32F_FAST_16BF: u32 = 75;
const COMPUTE_32F_FAST_TF32: u32 = 77;

// `cublasMath_t`: a mode, optionally or-ed with the flag.
const TF32_TENSOR_OP_MATH: u32 = 3;
pub(crate) const DISALLOW_REDUCED_PRECISION_REDUCTION: u32 = 16;

// `cublasPointerMode_t`.
const POINTER_MODE_HOST: u32 = 0;
const POINTER_MODE_DEVICE: u32 = 1;

/// What `cublasGetVersion` reports: cuBLAS 13.1.
const VERSION: c_int = 130100;

/// What a handle remembers.
#[derive(Debug, Clone, Copy)]
struct Handle {
    /// The GPU current at `cublasCreate`: cuBLAS ties a handle to it for life.
    device: i32,
    /// The `CUstream` its work goes to (0: the legacy stream).
    stream: usize,
    math: u32,
    /// The workspace `cublasSetWorkspace` gave it: address and bytes.
    workspace: Option<(u64, usize)>,
}

/// Live handles by value, so that a destroyed or made-up handle is refused rather than read.
static HANDLES: Mutex<BTreeMap<usize, Handle>> = Mutex::new(BTreeMap::new());

fn handles() -> MutexGuard<'static, BTreeMap<usize, Handle>> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on live handle `h`; a handle that is not live is cuBLAS's NOT_INITIALIZED.
fn with_handle<R>(h: *mut c_void, what: &str, f: impl FnOnce(&mut Handle) -> R) -> Result<R, u32> {
    match handles().get_mut(&(h as usize)) {
        Some(x) => Ok(f(x)),
        None => {
            complain(what, &format!("{h:p} is not a live cuBLAS handle"));
            Err(status::NOT_INITIALIZED)
        }
    }
}

/// A getter: `*out` from the live handle `h` (refusing a null `out`).
unsafe fn get<T>(h: *mut c_void, out: *mut T, what: &str, f: impl FnOnce(&mut Handle) -> T) -> u32 {
    if out.is_null() {
        complain(what, "a null output pointer");
        return status::INVALID_VALUE;
    }
    match with_handle(h, what, f) {
        Ok(v) => {
            *out = v;
            status::SUCCESS
        }
        Err(e) => e,
    }
}

/// A status out of `with_handle`'s result.
fn done(r: Result<u32, u32>) -> u32 {
    r.unwrap_or_else(|e| e)
}

#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(handle: *mut *mut c_void) -> u32 {
    let what = "cublasCreate";
    if handle.is_null() {
        complain(what, "a null handle pointer");
        return status::INVALID_VALUE;
    }
    // cuBLAS's runtime would pick GPU 0 here; a caller that bound no context has a bug a
    // multi-GPU run would show, so it is refused.
    let Some(device) = crate::current() else {
        complain(what, "no current context (bind the GPU's context first)");
        return status::NOT_INITIALIZED;
    };
    let id = crate::state().handle();
    handles().insert(
        id,
        Handle {
            device,
            stream: 0,
            math: 0,
            workspace: None,
        },
    );
    *handle = id as *mut c_void;
    status::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(handle: *mut c_void) -> u32 {
    if handles().remove(&(handle as usize)).is_some() {
        return status::SUCCESS;
    }
    complain(
        "cublasDestroy",
        &format!("{handle:p} is not a live cuBLAS handle (destroyed twice?)"),
    );
    status::NOT_INITIALIZED
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(handle: *mut c_void, stream: *mut c_void) -> u32 {
    done(with_handle(handle, "cublasSetStream", |h| {
        h.stream = stream as usize;
        // As cuBLAS does: a new stream goes back to the default workspace.
        h.workspace = None;
        status::SUCCESS
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetStream_v2(handle: *mut c_void, stream: *mut *mut c_void) -> u32 {
    get(handle, stream, "cublasGetStream", |h| {
        h.stream as *mut c_void
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetWorkspace_v2(
    handle: *mut c_void,
    workspace: *mut c_void,
    bytes: usize,
) -> u32 {
    let what = "cublasSetWorkspace";
    let ptr = workspace as u64;
    let ws = if ptr == 0 && bytes == 0 {
        None // back to the default workspace
    } else {
        // cuBLAS's documented requirement.
        if ptr % 256 != 0 {
            complain(what, &format!("{ptr:#x} is not aligned to 256 bytes"));
            return status::INVALID_VALUE;
        }
        if let Err(why) = crate::check_device(ptr, bytes) {
            complain(what, &format!("the workspace: {why}"));
            return status::INVALID_VALUE;
        }
        Some((ptr, bytes))
    };
    done(with_handle(handle, what, |h| {
        h.workspace = ws;
        status::SUCCESS
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetMathMode(handle: *mut c_void, mode: u32) -> u32 {
    let what = "cublasSetMathMode";
    // The modes of cuBLAS 13, and the one flag that combines with them.
    if !matches!(mode & !DISALLOW_REDUCED_PRECISION_REDUCTION, 0..=4 | 8) {
        complain(what, &format!("{mode} is not a cublasMath_t"));
        return status::INVALID_VALUE;
    }
    done(with_handle(handle, what, |h| {
        h.math = mode;
        status::SUCCESS
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetMathMode(handle: *mut c_void, mode: *mut u32) -> u32 {
    get(handle, mode, "cublasGetMathMode", |h| h.math)
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetVersion_v2(handle: *mut c_void, version: *mut c_int) -> u32 {
    get(handle, version, "cublasGetVersion", |_| VERSION)
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetPointerMode_v2(handle: *mut c_void, mode: u32) -> u32 {
    let what = "cublasSetPointerMode";
    match mode {
        POINTER_MODE_HOST => done(with_handle(handle, what, |_| status::SUCCESS)),
        // alpha and beta are read when a GEMM is queued, which device pointers would need
        // done when it runs; the backend passes host scalars.
        POINTER_MODE_DEVICE => {
            complain(
                what,
                "device pointer mode is not emulated (host scalars only)",
            );
            status::NOT_SUPPORTED
        }
        _ => {
            complain(what, &format!("{mode} is not a cublasPointerMode_t"));
            status::INVALID_VALUE
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetPointerMode_v2(handle: *mut c_void, mode: *mut u32) -> u32 {
    get(handle, mode, "cublasGetPointerMode", |_| POINTER_MODE_HOST)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasSgemm_v2(
    handle: *mut c_void,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
) -> u32 {
    let call = Call {
        trans: [transa, transb],
        dims: [m, n, k],
        lds: [lda, ldb, ldc],
        scalars: [alpha.cast(), beta.cast()],
        types: [CUDA_R_32F; 3],
        compute: COMPUTE_32F,
        algo: -1,
        count: 1,
    };
    gemm(
        "cublasSgemm",
        handle,
        &call,
        Items::One(a as u64, b as u64, c as u64),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmEx(
    handle: *mut c_void,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: u32,
    lda: c_int,
    b: *const c_void,
    b_type: u32,
    ldb: c_int,
    beta: *const c_void,
    c: *mut c_void,
    c_type: u32,
    ldc: c_int,
    compute: u32,
    algo: i32,
) -> u32 {
    let call = Call {
        trans: [transa, transb],
        dims: [m, n, k],
        lds: [lda, ldb, ldc],
        scalars: [alpha, beta],
        types: [a_type, b_type, c_type],
        compute,
        algo,
        count: 1,
    };
    gemm(
        "cublasGemmEx",
        handle,
        &call,
        Items::One(a as u64, b as u64, c as u64),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmBatchedEx(
    handle: *mut c_void,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a_array: *const *const c_void,
    a_type: u32,
    lda: c_int,
    b_array: *const *const c_void,
    b_type: u32,
    ldb: c_int,
    beta: *const c_void,
    c_array: *const *mut c_void,
    c_type: u32,
    ldc: c_int,
    batch_count: c_int,
    compute: u32,
    algo: i32,
) -> u32 {
    let call = Call {
        trans: [transa, transb],
        dims: [m, n, k],
        lds: [lda, ldb, ldc],
        scalars: [alpha, beta],
        types: [a_type, b_type, c_type],
        compute,
        algo,
        count: batch_count,
    };
    let lists = [a_array as u64, b_array as u64, c_array as u64];
    gemm("cublasGemmBatchedEx", handle, &call, Items::Lists(lists))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    handle: *mut c_void,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: u32,
    lda: c_int,
    stride_a: c_longlong,
    b: *const c_void,
    b_type: u32,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const c_void,
    c: *mut c_void,
    c_type: u32,
    ldc: c_int,
    stride_c: c_longlong,
    batch_count: c_int,
    compute: u32,
    algo: i32,
) -> u32 {
    let call = Call {
        trans: [transa, transb],
        dims: [m, n, k],
        lds: [lda, ldb, ldc],
        scalars: [alpha, beta],
        types: [a_type, b_type, c_type],
        compute,
        algo,
        count: batch_count,
    };
    let items = Items::Strided(
        [a as u64, b as u64, c as u64],
        [stride_a, stride_b, stride_c],
    );
    gemm("cublasGemmStridedBatchedEx", handle, &call, items)
}

/// A GEMM entry point's arguments as the caller passed them.
pub(crate) struct Call {
    pub(crate) trans: [u32; 2],
    /// m, n, k.
    pub(crate) dims: [c_int; 3],
    /// lda, ldb, ldc.
    pub(crate) lds: [c_int; 3],
    /// alpha, beta (host pointers).
    pub(crate) scalars: [*const c_void; 2],
    /// A's, B's and C's `cudaDataType`.
    pub(crate) types: [u32; 3],
    pub(crate) compute: u32,
    pub(crate) algo: i32,
    /// The batch count (1 for a single GEMM).
    pub(crate) count: c_int,
}

/// Where a call's matrices are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Items {
    /// One GEMM's A, B and C.
    One(u64, u64, u64),
    /// The first item's A, B and C, and the strides (elements) between items.
    Strided([u64; 3], [i64; 3]),
    /// Device arrays of every item's A, B and C addresses, read when the operation runs.
    Lists([u64; 3]),
}

/// A matrix element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Elem {
    F32,
    F16,
    Bf16,
}

impl Elem {
    fn of(t: u32) -> Option<Elem> {
        match t {
            CUDA_R_32F => Some(Elem::F32),
            CUDA_R_16F => Some(Elem::F16),
            CUDA_R_16BF => Some(Elem::Bf16),
            _ => None,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }
}

/// How f32 operands are rounded before the products: what the tensor cores read under a fast
/// compute type, or TF32 math.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Narrow {
    Exact,
    F16,
    Bf16,
    Tf32,
}

impl Narrow {
    fn apply(self, x: f32) -> f32 {
        match self {
            Narrow::Exact => x,
            Narrow::F16 => f16::from_f32(x).to_f32(),
            Narrow::Bf16 => bf16::from_f32(x).to_f32(),
            Narrow::Tf32 => tf32(x),
        }
    }
}

/// `x` with its mantissa rounded to TF32's 10 bits, to nearest even (the GPU's own conversion
/// may break ties differently).
fn tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let bits = x.to_bits();
    let odd = (bits >> 13) & 1;
    // A carry out of the mantissa moves into the exponent, up to infinity, as rounding should.
    f32::from_bits(bits.wrapping_add(0xfff + odd) & !0x1fff)
}

/// A 32- or 16-bit float as f32 and back (nearest even).
trait Value: Copy {
    fn widen(self) -> f32;
    fn round(v: f32) -> Self;
}

impl Value for f32 {
    fn widen(self) -> f32 {
        self
    }
    fn round(v: f32) -> f32 {
        v
    }
}

impl Value for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn round(v: f32) -> f16 {
        f16::from_f32(v)
    }
}

impl Value for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn round(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
}

/// Elements a column-major `rows × cols` matrix with leading dimension `ld` spans from its
/// first (0 when empty).
fn span(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (cols - 1) * ld + rows
    }
}

/// One GEMM's checked arguments, copied into its operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    /// A, B, C.
    types: [Elem; 3],
    narrow: Narrow,
    alpha: f32,
    beta: f32,
    /// The math mode lacks `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`: a 16-bit C may
    /// get split-K partial sums added in its own type (modelled as two halves of `k`, each
    /// rounded to C's type), so a caller relying on one rounding must set the flag.
    reduced: bool,
    /// Split-K with f32 partial sums (cuBLASLt's `CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE`): the
    /// halves of `k` summed apart in f32, then added, then rounded once to C's type — another
    /// order of the same terms, so other bits than one sum (`with_f32_split`).
    split: bool,
    /// How long the operation takes, at least (`with_delay`).
    delay: std::time::Duration,
}

impl Gemm {
    /// Checks `c` as cuBLAS does: INVALID_VALUE for a bad transpose, size, leading dimension,
    /// scalar pointer or algorithm, NOT_SUPPORTED for a combination of types and compute type
    /// cuBLAS does not have. Reads alpha and beta (host pointers).
    pub(crate) unsafe fn check(what: &str, c: &Call, math: u32) -> Result<Gemm, u32> {
        let invalid = |why: String| {
            complain(what, &why);
            status::INVALID_VALUE
        };
        let op = |t: u32, name: &str| match t {
            0 => Ok(false),
            // CUBLAS_OP_C is CUBLAS_OP_T for real types.
            1 | 2 => Ok(true),
            _ => Err(invalid(format!("{name} {t} is not CUBLAS_OP_N, _T or _C"))),
        };
        let (trans_a, trans_b) = (op(c.trans[0], "transa")?, op(c.trans[1], "transb")?);
        let [m, n, k] = c.dims;
        if m < 0 || n < 0 || k < 0 || c.count < 0 {
            return Err(invalid(format!(
                "negative size: m {m}, n {n}, k {k}, batch {}",
                c.count
            )));
        }
        let (m, n, k) = (m as usize, n as usize, k as usize);
        // The stored A is m×k (k×m transposed), B k×n (n×k), C m×n: each column-major, its
        // leading dimension at least its rows, and at least 1.
        let rows = [if trans_a { k } else { m }, if trans_b { n } else { k }, m];
        let mut lds = [0; 3];
        for (i, name) in ["lda", "ldb", "ldc"].into_iter().enumerate() {
            let (ld, need) = (c.lds[i], rows[i].max(1));
            if ld < 0 || (ld as usize) < need {
                return Err(invalid(format!(
                    "{name} {ld} < max(1, {}) (m {m}, n {n}, k {k}, transa {}, transb {})",
                    rows[i], c.trans[0], c.trans[1]
                )));
            }
            lds[i] = ld as usize;
        }
        if c.scalars.iter().any(|p| p.is_null()) {
            return Err(invalid("a null alpha or beta".into()));
        }
        // CUBLAS_GEMM_DEFAULT (-1), the ALGOn and their TENSOR_OP forms, AUTOTUNE.
        if !matches!(c.algo, -1..=23 | 99..=115 | 999) {
            return Err(invalid(format!("{} is not a cublasGemmAlgo_t", c.algo)));
        }
        let unsupported = || {
            complain(
                what,
                &format!(
                    "no GEMM of types A {}, B {}, C {} with compute type {} (cudaDataType, \
                     cublasComputeType_t; this emulation has R_32F, R_16F and R_16BF)",
                    c.types[0], c.types[1], c.types[2], c.compute
                ),
            );
            status::NOT_SUPPORTED
        };
        let (Some(ta), Some(tb), Some(tc)) = (
            Elem::of(c.types[0]),
            Elem::of(c.types[1]),
            Elem::of(c.types[2]),
        ) else {
            return Err(unsupported());
        };
        let all_f32 = [ta, tb, tc] == [Elem::F32; 3];
        // cublasGemmEx's table: with COMPUTE_32F, A and B of one type and C of theirs or f32
        // (f32 operands give f32); the fast compute types take f32 only.
        let narrow = match c.compute {
            COMPUTE_32F | COMPUTE_32F_PEDANTIC if ta == tb && (tc == ta || tc == Elem::F32) => {
                let tf32_math = math & !DISALLOW_REDUCED_PRECISION_REDUCTION == TF32_TENSOR_OP_MATH;
                if c.compute == COMPUTE_32F && ta == Elem::F32 && tf32_math {
                    Narrow::Tf32
                } else {
                    Narrow::Exact
                }
            }
            COMPUTE_32F_FAST_16F if all_f32 => Narrow::F16,
            COMPUTE_32F_FAST_16BF if all_f32 => Narrow::Bf16,
            COMPUTE_32F_FAST_TF32 if all_f32 => Narrow::Tf32,
            _ => return Err(unsupported()),
        };
        // Every compute type here scales in f32.
        let [alpha, beta] = c.scalars.map(|p| *(p as *const f32));
        Ok(Gemm {
            trans_a,
            trans_b,
            m,
            n,
            k,
            lda: lds[0],
            ldb: lds[1],
            ldc: lds[2],
            types: [ta, tb, tc],
            narrow,
            alpha,
            beta,
            reduced: math & DISALLOW_REDUCED_PRECISION_REDUCTION == 0,
            split: false,
            delay: std::time::Duration::ZERO,
        })
    }

    /// This GEMM as an algorithm that splits `k` in two with f32 partial sums computes it.
    pub(crate) fn with_f32_split(self) -> Gemm {
        Gemm {
            split: true,
            ..self
        }
    }

    /// This GEMM taking at least `delay` to run (a slow algorithm, for its callers' timing).
    pub(crate) fn with_delay(self, delay: std::time::Duration) -> Gemm {
        Gemm { delay, ..self }
    }

    /// Whether C is empty (nothing to compute: cuBLAS's quick return).
    pub(crate) fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0
    }

    /// Bytes an element of A, B and C.
    pub(crate) fn elem_bytes(&self) -> [usize; 3] {
        self.types.map(Elem::bytes)
    }

    /// Whether A and B are read: not when the product term is zero whatever they hold (as the
    /// reference BLAS).
    fn reads_operands(&self) -> bool {
        self.k > 0 && self.alpha != 0.0
    }

    /// The stored rows, columns and leading dimension of A, B and C.
    fn stored(&self) -> [(usize, usize, usize); 3] {
        let (m, n, k) = (self.m, self.n, self.k);
        [
            if self.trans_a {
                (k, m, self.lda)
            } else {
                (m, k, self.lda)
            },
            if self.trans_b {
                (n, k, self.ldb)
            } else {
                (k, n, self.ldb)
            },
            (m, n, self.ldc),
        ]
    }

    /// Checks that the matrices at `addrs` (A, B, C) lie in live allocations of `device`, and
    /// are aligned to their elements.
    fn check_ranges(&self, st: &State, device: i32, addrs: [u64; 3]) -> Result<(), String> {
        let first = if self.reads_operands() { 0 } else { 2 };
        let names = ["A", "B", "C"];
        let all = self
            .stored()
            .into_iter()
            .zip(self.types)
            .zip(names)
            .zip(addrs);
        for ((((rows, cols, ld), t), name), ptr) in all.skip(first) {
            let size = t.bytes();
            let bytes = span(rows, cols, ld) * size;
            let err =
                |why: String| format!("{name} ({rows}×{cols}, leading dimension {ld}): {why}");
            if ptr % size as u64 != 0 {
                return Err(err(format!(
                    "{ptr:#x} is not aligned to its {size}-byte elements"
                )));
            }
            if ptr.checked_add(bytes as u64).is_none() {
                return Err(err(format!("[{ptr:#x}, +{bytes}) wraps around")));
            }
            st.check_range(device, ptr, bytes).map_err(err)?;
        }
        Ok(())
    }

    /// Each column of the matrix `i` (0 A, 1 B, 2 C) at `at`, as a byte range.
    fn columns(&self, i: usize, at: u64) -> impl Iterator<Item = (u64, u64)> {
        let (rows, cols, ld) = self.stored()[i];
        let size = self.types[i].bytes() as u64;
        (0..cols as u64).map(move |j| {
            let start = at + j * ld as u64 * size;
            (start, start + rows as u64 * size)
        })
    }

    /// Refuses a C that overlaps an A or B it reads (undefined in cuBLAS: a GPU may read some
    /// of A or B after writing C, where this fake reads every operand first), and items of a
    /// batch whose Cs overlap (a GPU runs them concurrently). Element by element, column by
    /// column: interleaved layouts (attention's heads) do not overlap.
    fn check_overlaps(&self, items: &[[u64; 3]]) -> Result<(), String> {
        // (start, end, is C, item)
        let mut cols: Vec<(u64, u64, bool, usize)> = Vec::new();
        for (j, &[a, b, c]) in items.iter().enumerate() {
            cols.extend(self.columns(2, c).map(|(s, e)| (s, e, true, j)));
            if self.reads_operands() {
                cols.extend(self.columns(0, a).map(|(s, e)| (s, e, false, j)));
                cols.extend(self.columns(1, b).map(|(s, e)| (s, e, false, j)));
            }
        }
        cols.retain(|c| c.0 < c.1);
        cols.sort_unstable();
        // The C column with the furthest end so far, against each later column.
        let mut open: Option<(u64, usize)> = None;
        let mut open_any: Option<(u64, usize)> = None;
        for &(start, end, is_c, item) in &cols {
            if let Some((e, j)) = open.filter(|(e, _)| start < *e) {
                let _ = e;
                return Err(if is_c {
                    format!("the C of items {j} and {item} overlap")
                } else {
                    format!("item {j}'s C overlaps an A or B of item {item}")
                });
            }
            if is_c {
                if let Some((_, j)) = open_any.filter(|(e, _)| start < *e) {
                    return Err(format!("item {item}'s C overlaps an A or B of item {j}"));
                }
                if open.is_none_or(|(e, _)| end > e) {
                    open = Some((end, item));
                }
            } else if open_any.is_none_or(|(e, _)| end > e) {
                open_any = Some((end, item));
            }
        }
        Ok(())
    }

    /// Computes one GEMM on checked ranges.
    unsafe fn compute(&self, [a, b, c]: [u64; 3]) {
        let (ar, bc) = if self.reads_operands() {
            let [sa, sb, _] = self.stored();
            // op(A) as m rows of k, op(B) as n columns of k: the dot products' operands
            // contiguous.
            (
                load(
                    a,
                    self.types[0],
                    sa,
                    self.m,
                    self.k,
                    self.trans_a,
                    self.narrow,
                ),
                load(
                    b,
                    self.types[1],
                    sb,
                    self.n,
                    self.k,
                    !self.trans_b,
                    self.narrow,
                ),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        match self.types[2] {
            Elem::F32 => self.finish::<f32>(c, &ar, &bc),
            Elem::F16 => self.finish::<f16>(c, &ar, &bc),
            Elem::Bf16 => self.finish::<bf16>(c, &ar, &bc),
        }
    }

    /// Writes `C = alpha·(ar·bcᵀ) + beta·C` into C (of type `T`).
    unsafe fn finish<T: Value>(&self, c: u64, ar: &[f32], bc: &[f32]) {
        let (m, n, ldc) = (self.m, self.n, self.ldc);
        let (alpha, beta) = (self.alpha, self.beta);
        let out = std::slice::from_raw_parts_mut(c as *mut T, span(m, n, ldc));
        let mut put = |i: usize, j: usize, sum: f32| {
            let at = i + j * ldc;
            let v = alpha * sum;
            // beta 0: C is not read (it may hold NaN garbage).
            let v = if beta == 0.0 {
                v
            } else {
                v + beta * out[at].widen()
            };
            out[at] = T::round(v);
        };
        let k = self.k;
        if self.reads_operands() && self.reduced && std::mem::size_of::<T>() == 2 && k >= 2 {
            // Two partial products over the halves of k, each rounded to C's type, then added.
            let half = k / 2;
            let part = |from: usize, len: usize| {
                let cut = |x: &[f32], rows: usize| -> Vec<f32> {
                    (0..rows)
                        .flat_map(|r| x[r * k + from..][..len].to_vec())
                        .collect()
                };
                let mut out = vec![0f32; m * n];
                dots(&cut(ar, m), &cut(bc, n), m, n, len, &mut |i, j, v| {
                    out[i + j * m] = T::round(alpha * v).widen();
                });
                out
            };
            let (p1, p2) = (part(0, half), part(half, k - half));
            for j in 0..n {
                for i in 0..m {
                    let at = i + j * ldc;
                    let v = p1[i + j * m] + p2[i + j * m];
                    let v = if beta == 0.0 {
                        v
                    } else {
                        v + beta * out[at].widen()
                    };
                    out[at] = T::round(v);
                }
            }
        } else if self.reads_operands() && self.split && k >= 2 {
            // Two partial f32 sums over the halves of k, added in f32, then one rounding.
            let half = k / 2;
            let mut p1 = vec![0f32; m * n];
            let cut = |x: &[f32], rows: usize, from: usize, len: usize| -> Vec<f32> {
                (0..rows)
                    .flat_map(|r| x[r * k + from..][..len].to_vec())
                    .collect()
            };
            let (a1, b1) = (cut(ar, m, 0, half), cut(bc, n, 0, half));
            dots(&a1, &b1, m, n, half, &mut |i, j, v| p1[i + j * m] = v);
            let (a2, b2) = (cut(ar, m, half, k - half), cut(bc, n, half, k - half));
            dots(&a2, &b2, m, n, k - half, &mut |i, j, v| {
                put(i, j, p1[i + j * m] + v)
            });
        } else if self.reads_operands() {
            dots(ar, bc, m, n, k, &mut put);
        } else {
            for j in 0..n {
                for i in 0..m {
                    put(i, j, 0.0);
                }
            }
        }
    }
}

/// `outer × k` elements of a stored matrix at `ptr`, widened to f32 and narrowed as `narrow`
/// says, `k` contiguous per outer index: element `(o, p)` is stored at `p + o·ld` when
/// `k_inner` (k runs down the stored columns), else at `o + p·ld`.
unsafe fn load(
    ptr: u64,
    t: Elem,
    (rows, cols, ld): (usize, usize, usize),
    outer: usize,
    k: usize,
    k_inner: bool,
    narrow: Narrow,
) -> Vec<f32> {
    let len = span(rows, cols, ld);
    let mut out = vec![0.0f32; outer * k];
    match t {
        Elem::F32 => gather::<f32>(ptr, len, &mut out, outer, k, ld, k_inner),
        Elem::F16 => gather::<f16>(ptr, len, &mut out, outer, k, ld, k_inner),
        Elem::Bf16 => gather::<bf16>(ptr, len, &mut out, outer, k, ld, k_inner),
    }
    if narrow != Narrow::Exact {
        for v in &mut out {
            *v = narrow.apply(*v);
        }
    }
    out
}

/// [`load`] for one element type.
unsafe fn gather<T: Value>(
    ptr: u64,
    len: usize,
    out: &mut [f32],
    outer: usize,
    k: usize,
    ld: usize,
    k_inner: bool,
) {
    let src = std::slice::from_raw_parts(ptr as *const T, len);
    if k_inner {
        for (o, dst) in out.chunks_exact_mut(k).enumerate() {
            for (d, s) in dst.iter_mut().zip(&src[o * ld..][..k]) {
                *d = s.widen();
            }
        }
    } else {
        // Read down the stored columns (contiguous), write across.
        for p in 0..k {
            for (o, s) in src[p * ld..][..outer].iter().enumerate() {
                out[o * k + p] = s.widen();
            }
        }
    }
}

/// Calls `put(i, j, Σₚ a[i·k + p]·b[j·k + p])` for every `i < m`, `j < n`: each sum in f32
/// from 0, in p order, without FMA (Rust never contracts `s + x·y`), so that the blocking,
/// several independent sums at once for the CPU's pipelines, changes no bit.
fn dots(
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
    mut put: impl FnMut(usize, usize, f32),
) {
    let full = n - n % 4;
    for j in (0..full).step_by(4) {
        let mut i = 0;
        while i + 2 <= m {
            block::<2, 4>(a, b, i, j, k, &mut put);
            i += 2;
        }
        if i < m {
            block::<1, 4>(a, b, i, j, k, &mut put);
        }
    }
    for j in full..n {
        for i in 0..m {
            block::<1, 1>(a, b, i, j, k, &mut put);
        }
    }
}

/// [`dots`] for rows `i..i + R` and columns `j..j + C`.
#[inline(always)]
fn block<const R: usize, const C: usize>(
    a: &[f32],
    b: &[f32],
    i: usize,
    j: usize,
    k: usize,
    put: &mut impl FnMut(usize, usize, f32),
) {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &a[(i + r) * k..][..k]);
    let cols: [&[f32]; C] = std::array::from_fn(|c| &b[(j + c) * k..][..k]);
    let mut sums = [[0.0f32; C]; R];
    for p in 0..k {
        for (row, s) in rows.iter().zip(sums.iter_mut()) {
            let x = row[p];
            for (col, acc) in cols.iter().zip(s.iter_mut()) {
                *acc += x * col[p];
            }
        }
    }
    for (r, s) in sums.iter().enumerate() {
        for (c, &v) in s.iter().enumerate() {
            put(i + r, j + c, v);
        }
    }
}

impl Items {
    fn count(&self, call: &Call) -> usize {
        match self {
            Items::One(..) => 1,
            _ => call.count as usize,
        }
    }

    /// Every item's A, B and C addresses; a batch's lists are checked and read now.
    fn resolve(
        &self,
        st: &State,
        device: i32,
        g: &Gemm,
        count: usize,
    ) -> Result<Vec<[u64; 3]>, String> {
        match *self {
            Items::One(a, b, c) => Ok(vec![[a, b, c]]),
            Items::Strided(base, strides) => Ok((0..count)
                .map(|j| {
                    // Strides are in elements, and may be 0 (an operand shared by every item).
                    std::array::from_fn(|i| {
                        let step = strides[i].wrapping_mul(g.types[i].bytes() as i64);
                        base[i].wrapping_add((j as i64).wrapping_mul(step) as u64)
                    })
                })
                .collect()),
            Items::Lists(lists) => {
                let mut items = vec![[0u64; 3]; count];
                for (i, &list) in lists.iter().enumerate() {
                    let name = ["Aarray", "Barray", "Carray"][i];
                    if list % 8 != 0 {
                        return Err(format!("{name} {list:#x} is not aligned to 8 bytes"));
                    }
                    st.check_range(device, list, 8 * count)
                        .map_err(|why| format!("{name} ({count} pointers): {why}"))?;
                    // SAFETY: checked to lie in a live allocation, aligned.
                    let ptrs = unsafe { std::slice::from_raw_parts(list as *const u64, count) };
                    for (item, &p) in items.iter_mut().zip(ptrs) {
                        item[i] = p;
                    }
                }
                Ok(items)
            }
        }
    }
}

/// Every GEMM entry point: checks the arguments, then queues the GEMMs on the handle's stream.
unsafe fn gemm(what: &'static str, h: *mut c_void, call: &Call, items: Items) -> u32 {
    let handle = match with_handle(h, what, |x| *x) {
        Ok(x) => x,
        Err(e) => return e,
    };
    let g = match Gemm::check(what, call, handle.math) {
        Ok(g) => g,
        Err(e) => return e,
    };
    let count = items.count(call);
    if g.m == 0 || g.n == 0 || count == 0 {
        return status::SUCCESS; // nothing to compute (cuBLAS's quick return)
    }
    // A handle works on its own GPU, from that GPU's context.
    let here = crate::current();
    let stream_device = crate::device_of(handle.stream);
    if here != Some(handle.device) || stream_device != Some(handle.device) {
        complain(
            what,
            &format!(
                "the handle belongs to GPU {}; the current context's GPU is {here:?}, its \
                 stream {:#x}'s {stream_device:?}",
                handle.device, handle.stream
            ),
        );
        return status::EXECUTION_FAILED;
    }
    queue(
        what,
        handle.device,
        handle.stream,
        handle.workspace,
        g,
        items,
        count,
    )
}

/// Queues checked GEMMs on `stream` of GPU `device`: when they run, the workspace's and the
/// operands' ranges are checked against the live allocations, then each item computed.
pub(crate) fn queue(
    what: &'static str,
    device: i32,
    stream: usize,
    workspace: Option<(u64, usize)>,
    g: Gemm,
    items: Items,
    count: usize,
) -> u32 {
    {
        let mut st = crate::state();
        // A stream's first GEMM saves the counts: a run without graphs has no other occasion.
        if what == "cublasLtMatmul" && st.lt_streams.insert((device, stream)) {
            st.stats.lt_streams = st.lt_streams.len() as u64;
            st.stats.save();
        }
        let stats = &mut st.stats;
        match what {
            "cublasLtMatmul" => stats.lt_matmuls += 1,
            "cublasGemmBatchedEx" => stats.blas_pointer_batches += 1,
            _ => stats.blas_gemms += 1,
        }
    }
    let op: crate::Op = Arc::new(move || {
        std::thread::sleep(g.delay);
        let addrs = {
            let st = crate::state();
            if let Some((w, bytes)) = workspace {
                st.check_range(device, w, bytes)
                    .map_err(|why| format!("the handle's workspace: {why}"))?;
            }
            let addrs = items.resolve(&st, device, &g, count)?;
            for (j, &item) in addrs.iter().enumerate() {
                g.check_ranges(&st, device, item).map_err(|why| {
                    if count > 1 {
                        format!("batch item {j}: {why}")
                    } else {
                        why
                    }
                })?;
            }
            g.check_overlaps(&addrs)?;
            addrs
        };
        for item in addrs {
            // SAFETY: every range was checked just above, under the state's lock (released
            // for the arithmetic, which would hold up every other thread's calls).
            unsafe { g.compute(item) };
        }
        Ok(())
    });
    match crate::enqueue(stream, what, op) {
        0 => status::SUCCESS,
        _ => status::EXECUTION_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Alloc;
    use std::alloc::Layout;
    use std::ptr::null_mut;

    /// The GPUs these tests use: numbers no other test uses, since a fault leaves its GPU
    /// failing for the rest of the process (tests run in parallel in one process).
    const GPU: i32 = 40;
    const GPU_FAULT: i32 = 41;
    const GPU_FAULT_END: i32 = 42;
    const GPU_FREED_WORKSPACE: i32 = 43;

    const N: u32 = 0;
    const T: u32 = 1;

    /// A registered device allocation of host memory, filled with 0xFF bytes as the driver's.
    struct Buf {
        ptr: u64,
        layout: Layout,
    }

    impl Buf {
        fn new(device: i32, bytes: usize) -> Buf {
            let layout = Layout::from_size_align(bytes.max(1), 256).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe { std::alloc::alloc(layout) };
            assert!(!p.is_null());
            // SAFETY: `p` has `layout.size()` bytes.
            unsafe { std::ptr::write_bytes(p, 0xFF, layout.size()) };
            crate::state().allocs.insert(
                p as u64,
                Alloc {
                    size: bytes,
                    device,
                    layout,
                },
            );
            Buf {
                ptr: p as u64,
                layout,
            }
        }

        fn of<V: Value>(device: i32, v: &[V]) -> Buf {
            let b = Buf::new(device, std::mem::size_of_val(v));
            b.write(0, v);
            b
        }

        fn write<V: Value>(&self, at: usize, v: &[V]) {
            // SAFETY: the tests stay inside their buffers.
            unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr(), (self.ptr as *mut V).add(at), v.len())
            };
        }

        fn read<V: Value>(&self, n: usize) -> Vec<V> {
            // SAFETY: as `write`.
            unsafe { std::slice::from_raw_parts(self.ptr as *const V, n).to_vec() }
        }

        fn at<V>(&self, i: usize) -> *mut c_void {
            (self.ptr as usize + i * std::mem::size_of::<V>()) as *mut c_void
        }

        /// Forgets the allocation, as a free would (the memory stays, for the test to drop).
        fn unregister(&self) {
            crate::state().allocs.remove(&self.ptr);
        }
    }

    impl Drop for Buf {
        fn drop(&mut self) {
            crate::state().allocs.remove(&self.ptr);
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.ptr as *mut u8, self.layout) };
        }
    }

    /// A handle on GPU `device`'s legacy stream, the calling thread bound to that GPU.
    fn handle_on(device: i32) -> *mut c_void {
        crate::set_current(Some(device));
        let mut h = null_mut();
        assert_eq!(unsafe { cublasCreate_v2(&mut h) }, status::SUCCESS);
        h
    }

    /// Deterministic values in [-1, 1) with long mantissas.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The definition, column-major, with the file's arithmetic: op(A), op(B) as given (already
    /// widened and narrowed), sums in f32 in k order from 0, `alpha·sum + beta·C`, C not read
    /// with beta 0. Returns C's new f32 values (before rounding to C's type).
    #[allow(clippy::too_many_arguments)]
    fn reference(
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        beta: f32,
        c: &[f32],
        ldc: usize,
    ) -> Vec<f32> {
        let mut out = c.to_vec();
        for j in 0..n {
            for i in 0..m {
                let mut sum = 0.0f32;
                for p in 0..k {
                    let x = if ta { a[p + i * lda] } else { a[i + p * lda] };
                    let y = if tb { b[j + p * ldb] } else { b[p + j * ldb] };
                    sum += x * y;
                }
                let v = alpha * sum;
                out[i + j * ldc] = if beta == 0.0 {
                    v
                } else {
                    v + beta * c[i + j * ldc]
                };
            }
        }
        out
    }

    /// Stored sizes (rows, cols) of A and B, and padded leading dimensions.
    fn layout(ta: bool, tb: bool, (m, n, k): (usize, usize, usize)) -> [(usize, usize, usize); 3] {
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        [(ar, ac, ar + 3), (br, bc, br + 1), (m, n, m + 2)]
    }

    /// f32 GEMMs (cublasSgemm and cublasGemmEx) for every transpose, padded leading
    /// dimensions, blocks and remainders of the kernel, beta 0 over NaN and beta 1 over
    /// values: bit for bit the definition.
    #[test]
    fn f32_gemm_is_the_column_major_definition() {
        let h = handle_on(GPU);
        for dims in [(5, 6, 7), (9, 11, 13), (1, 1, 1), (4, 8, 1)] {
            let (m, n, k) = dims;
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let [(ar, ac, lda), (br, bc, ldb), (_, _, ldc)] = layout(ta, tb, dims);
                let a = values(span(ar, ac, lda), 1);
                let b = values(span(br, bc, ldb), 2);
                let c0 = values(span(m, n, ldc), 3);
                let (ab, bb) = (Buf::of(GPU, &a), Buf::of(GPU, &b));
                for (beta, ex) in [(0.0f32, false), (1.0, false), (0.0, true), (1.0, true)] {
                    let alpha = 0.75f32;
                    let cb = Buf::new(GPU, 4 * c0.len()); // NaN bytes
                    if beta != 0.0 {
                        cb.write(0, &c0);
                    }
                    let (mi, ni, ki) = (m as c_int, n as c_int, k as c_int);
                    let (ta_, tb_) = (if ta { T } else { N }, if tb { T } else { N });
                    let r = unsafe {
                        if ex {
                            cublasGemmEx(
                                h,
                                ta_,
                                tb_,
                                mi,
                                ni,
                                ki,
                                (&alpha as *const f32).cast(),
                                ab.at::<f32>(0),
                                CUDA_R_32F,
                                lda as c_int,
                                bb.at::<f32>(0),
                                CUDA_R_32F,
                                ldb as c_int,
                                (&beta as *const f32).cast(),
                                cb.at::<f32>(0),
                                CUDA_R_32F,
                                ldc as c_int,
                                COMPUTE_32F,
                                -1,
                            )
                        } else {
                            cublasSgemm_v2(
                                h,
                                ta_,
                                tb_,
                                mi,
                                ni,
                                ki,
                                &alpha,
                                ab.at::<f32>(0).cast(),
                                lda as c_int,
                                bb.at::<f32>(0).cast(),
                                ldb as c_int,
                                &beta,
                                cb.at::<f32>(0).cast(),
                                ldc as c_int,
                            )
                        }
                    };
                    assert_eq!(r, status::SUCCESS);
                    let got: Vec<f32> = cb.read(c0.len());
                    // What C held: the allocation's NaN bytes, or c0.
                    let garbage = f32::from_bits(u32::MAX);
                    let old = if beta == 0.0 {
                        vec![garbage; c0.len()]
                    } else {
                        c0.clone()
                    };
                    let want = reference((ta, tb), dims, alpha, &a, lda, &b, ldb, beta, &old, ldc);
                    // Bit for bit, the padding between C's columns left as it was.
                    for (at, (x, y)) in got.iter().zip(&want).enumerate() {
                        let (i, j) = (at % ldc, at / ldc);
                        assert_eq!(
                            x.to_bits(),
                            y.to_bits(),
                            "{dims:?} ta {ta} tb {tb} beta {beta} ex {ex}: C[{i},{j}]"
                        );
                        assert_eq!(x.is_nan(), i >= m && beta == 0.0, "C[{i},{j}]");
                    }
                }
            }
        }
        assert_eq!(unsafe { cublasDestroy_v2(h) }, status::SUCCESS);
    }

    /// beta 1 accumulates: the same GEMM twice adds the product twice.
    #[test]
    fn beta_one_accumulates() {
        let h = handle_on(GPU);
        let (m, n, k) = (3, 5, 4);
        let (a, b) = (values(m * k, 4), values(k * n, 5));
        let (ab, bb) = (Buf::of(GPU, &a), Buf::of(GPU, &b));
        let cb = Buf::of(GPU, &vec![0.0f32; m * n]);
        let (alpha, beta) = (1.0f32, 1.0f32);
        for _ in 0..2 {
            let r = unsafe {
                cublasSgemm_v2(
                    h,
                    N,
                    N,
                    m as c_int,
                    n as c_int,
                    k as c_int,
                    &alpha,
                    ab.at::<f32>(0).cast(),
                    m as c_int,
                    bb.at::<f32>(0).cast(),
                    k as c_int,
                    &beta,
                    cb.at::<f32>(0).cast(),
                    m as c_int,
                )
            };
            assert_eq!(r, status::SUCCESS);
        }
        let once = reference(
            (false, false),
            (m, n, k),
            1.0,
            &a,
            m,
            &b,
            k,
            0.0,
            &vec![0.0; m * n],
            m,
        );
        let twice = reference((false, false), (m, n, k), 1.0, &a, m, &b, k, 1.0, &once, m);
        let got: Vec<f32> = cb.read(m * n);
        assert_eq!(got, twice);
        unsafe { cublasDestroy_v2(h) };
    }

    /// f16 operands into an f16 C: the f32 result rounded once, to nearest even; bf16
    /// operands into an f32 C.
    /// Without `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION` a 16-bit C gets its
    /// partial sums rounded (split-K), which differs from one rounding: so the backend's
    /// setting of the flag (`set_math`) is tested by every half-precision run.
    #[test]
    fn reduced_precision_reduction_rounds_partial_sums_unless_disallowed() {
        let h = handle_on(GPU);
        let (m, n, k) = (8, 8, 64);
        let a: Vec<f16> = values(m * k, 21)
            .iter()
            .map(|&x| f16::from_f32(x))
            .collect();
        let b: Vec<f16> = values(k * n, 22)
            .iter()
            .map(|&x| f16::from_f32(x))
            .collect();
        let (ab, bb) = (Buf::new(GPU, 2 * a.len()), Buf::new(GPU, 2 * b.len()));
        ab.write(0, &a);
        bb.write(0, &b);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let mut outs = Vec::new();
        for mode in [DISALLOW_REDUCED_PRECISION_REDUCTION, 0] {
            assert_eq!(unsafe { cublasSetMathMode(h, mode) }, status::SUCCESS);
            let cb = Buf::new(GPU, 2 * m * n);
            let r = unsafe {
                cublasGemmEx(
                    h,
                    N,
                    N,
                    m as c_int,
                    n as c_int,
                    k as c_int,
                    (&alpha as *const f32).cast(),
                    ab.at::<u16>(0),
                    CUDA_R_16F,
                    m as c_int,
                    bb.at::<u16>(0),
                    CUDA_R_16F,
                    k as c_int,
                    (&beta as *const f32).cast(),
                    cb.at::<u16>(0),
                    CUDA_R_16F,
                    m as c_int,
                    COMPUTE_32F,
                    -1,
                )
            };
            assert_eq!(r, status::SUCCESS);
            outs.push(cb.read::<f16>(m * n));
        }
        assert_ne!(
            outs[0], outs[1],
            "partial sums rounded to f16 change some outputs"
        );
        unsafe { cublasDestroy_v2(h) };
    }

    #[test]
    fn half_operands_are_widened_and_the_output_rounded_once() {
        let h = handle_on(GPU);
        // Rounded once only with reduced-precision reductions disallowed (the backend's mode).
        let mode = DISALLOW_REDUCED_PRECISION_REDUCTION;
        assert_eq!(unsafe { cublasSetMathMode(h, mode) }, status::SUCCESS);
        let (m, n, k) = (6, 5, 9);
        let (alpha, beta) = (1.25f32, 0.5f32);
        for (t, out_f32) in [(CUDA_R_16F, false), (CUDA_R_16BF, true), (CUDA_R_16F, true)] {
            let half = |v: &[f32]| -> Vec<u16> {
                v.iter()
                    .map(|&x| {
                        if t == CUDA_R_16F {
                            f16::from_f32(x).to_bits()
                        } else {
                            bf16::from_f32(x).to_bits()
                        }
                    })
                    .collect()
            };
            let wide = |v: &[u16]| -> Vec<f32> {
                v.iter()
                    .map(|&x| {
                        if t == CUDA_R_16F {
                            f16::from_bits(x).to_f32()
                        } else {
                            bf16::from_bits(x).to_f32()
                        }
                    })
                    .collect()
            };
            let (a, b, c0) = (
                half(&values(k * m, 6)),
                half(&values(k * n, 7)),
                values(m * n, 8),
            );
            let ab = Buf::new(GPU, 2 * a.len());
            let bb = Buf::new(GPU, 2 * b.len());
            // (Raw 16-bit patterns, f16 or bf16.)
            ab.write(0, &a.iter().map(|&x| f16::from_bits(x)).collect::<Vec<_>>());
            bb.write(0, &b.iter().map(|&x| f16::from_bits(x)).collect::<Vec<_>>());
            let (cb, c_type, old) = if out_f32 {
                (Buf::of(GPU, &c0), CUDA_R_32F, c0.clone())
            } else {
                let c16 = half(&c0);
                let cb = Buf::new(GPU, 2 * c16.len());
                cb.write(
                    0,
                    &c16.iter().map(|&x| f16::from_bits(x)).collect::<Vec<_>>(),
                );
                (cb, t, wide(&c16))
            };
            // A transposed (k×m stored), B not.
            let r = unsafe {
                cublasGemmEx(
                    h,
                    T,
                    N,
                    m as c_int,
                    n as c_int,
                    k as c_int,
                    (&alpha as *const f32).cast(),
                    ab.at::<u16>(0),
                    t,
                    k as c_int,
                    bb.at::<u16>(0),
                    t,
                    k as c_int,
                    (&beta as *const f32).cast(),
                    cb.at::<u16>(0),
                    c_type,
                    m as c_int,
                    COMPUTE_32F,
                    -1,
                )
            };
            assert_eq!(r, status::SUCCESS);
            let want = reference(
                (true, false),
                (m, n, k),
                alpha,
                &wide(&a),
                k,
                &wide(&b),
                k,
                beta,
                &old,
                m,
            );
            if out_f32 {
                assert_eq!(cb.read::<f32>(m * n), want, "type {t}");
            } else {
                let got: Vec<u16> = cb.read::<f16>(m * n).iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, half(&want), "type {t}");
                // Rounding matters here: the f32 results are not all f16 values.
                assert!(want.iter().any(|&v| f16::from_f32(v).to_f32() != v));
            }
        }
        unsafe { cublasDestroy_v2(h) };
    }

    /// The fast compute types round f32 operands first (bf16, f16, TF32), to nearest even; the
    /// TF32 math mode does for COMPUTE_32F, not for COMPUTE_32F_PEDANTIC.
    #[test]
    fn fast_compute_types_round_f32_operands_first() {
        let h = handle_on(GPU);
        let (m, n, k) = (4, 7, 10);
        let (a, b) = (values(m * k, 9), values(k * n, 10));
        let (ab, bb) = (Buf::of(GPU, &a), Buf::of(GPU, &b));
        let (alpha, beta) = (1.0f32, 0.0f32);
        let exact = reference(
            (false, false),
            (m, n, k),
            alpha,
            &a,
            m,
            &b,
            k,
            beta,
            &vec![0.0; m * n],
            m,
        );
        type Round = fn(f32) -> f32;
        let cases: [(u32, u32, Round); 5] = [
            (COMPUTE_32F_FAST_16BF, 0, |x| bf16::from_f32(x).to_f32()),
            (COMPUTE_32F_FAST_16F, 0, |x| f16::from_f32(x).to_f32()),
            (COMPUTE_32F_FAST_TF32, 0, tf32),
            (
                COMPUTE_32F,
                TF32_TENSOR_OP_MATH | DISALLOW_REDUCED_PRECISION_REDUCTION,
                tf32,
            ),
            (COMPUTE_32F_PEDANTIC, TF32_TENSOR_OP_MATH, |x| x),
        ];
        for (compute, math, round) in cases {
            assert_eq!(unsafe { cublasSetMathMode(h, math) }, status::SUCCESS);
            let cb = Buf::new(GPU, 4 * m * n);
            let r = unsafe {
                cublasGemmEx(
                    h,
                    N,
                    N,
                    m as c_int,
                    n as c_int,
                    k as c_int,
                    (&alpha as *const f32).cast(),
                    ab.at::<f32>(0),
                    CUDA_R_32F,
                    m as c_int,
                    bb.at::<f32>(0),
                    CUDA_R_32F,
                    k as c_int,
                    (&beta as *const f32).cast(),
                    cb.at::<f32>(0),
                    CUDA_R_32F,
                    m as c_int,
                    compute,
                    -1,
                )
            };
            assert_eq!(r, status::SUCCESS);
            let (ra, rb): (Vec<f32>, Vec<f32>) = (
                a.iter().map(|&x| round(x)).collect(),
                b.iter().map(|&x| round(x)).collect(),
            );
            let want = reference(
                (false, false),
                (m, n, k),
                alpha,
                &ra,
                m,
                &rb,
                k,
                beta,
                &vec![0.0; m * n],
                m,
            );
            let got: Vec<f32> = cb.read(m * n);
            assert_eq!(got, want, "compute {compute} math {math}");
            assert_eq!(
                got != exact,
                compute != COMPUTE_32F_PEDANTIC,
                "compute {compute}"
            );
        }
        // Ties go to even, and a carry reaches the exponent.
        assert_eq!(tf32(f32::from_bits(0x3f80_1000)), 1.0);
        assert_eq!(tf32(f32::from_bits(0x3f80_3000)).to_bits(), 0x3f80_4000);
        assert_eq!(tf32(f32::from_bits(0x3fff_f000)), 2.0);
        assert_eq!(tf32(f32::MAX), f32::INFINITY);
        unsafe { cublasDestroy_v2(h) };
    }

    /// cublasGemmBatchedEx reads its device lists of addresses when it runs; each item is the
    /// single GEMM; cublasGemmStridedBatchedEx gives the same on strided items.
    #[test]
    fn batched_gemms_are_their_items() {
        let h = handle_on(GPU);
        let (m, n, k, count) = (3, 6, 5, 4);
        let (alpha, beta) = (0.5f32, 0.0f32);
        // A transposed (k×m), B transposed (n×k), items `stride` elements apart.
        let (sa, sb, sc) = (k * m + 2, n * k + 1, m * n);
        let a = values(sa * count, 11);
        let b = values(sb * count, 12);
        let (ab, bb) = (Buf::of(GPU, &a), Buf::of(GPU, &b));
        let cb = Buf::new(GPU, 4 * sc * count);
        let strided = Buf::new(GPU, 4 * sc * count);
        let lists = Buf::new(GPU, 8 * 3 * count);
        // Item j's A and B in order, its C at position count - 1 - j: the op follows the
        // lists (which it reads when it runs: here at once, so they are written first).
        let addr = |b: &Buf, stride: usize, j: usize| b.ptr + (4 * stride * j) as u64;
        let mut ptrs = Vec::new();
        for (buf, stride) in [(&ab, sa), (&bb, sb)] {
            ptrs.extend((0..count).map(|j| addr(buf, stride, j)));
        }
        ptrs.extend((0..count).map(|j| addr(&cb, sc, count - 1 - j)));
        // SAFETY: `lists` holds 3·count addresses.
        unsafe { std::ptr::copy_nonoverlapping(ptrs.as_ptr(), lists.ptr as *mut u64, ptrs.len()) };
        let r = unsafe {
            cublasGemmBatchedEx(
                h,
                T,
                T,
                m as c_int,
                n as c_int,
                k as c_int,
                (&alpha as *const f32).cast(),
                lists.at::<u64>(0) as *const *const c_void,
                CUDA_R_32F,
                k as c_int,
                lists.at::<u64>(count) as *const *const c_void,
                CUDA_R_32F,
                n as c_int,
                (&beta as *const f32).cast(),
                lists.at::<u64>(2 * count) as *const *mut c_void,
                CUDA_R_32F,
                m as c_int,
                count as c_int,
                COMPUTE_32F,
                -1,
            )
        };
        assert_eq!(r, status::SUCCESS);
        let r = unsafe {
            cublasGemmStridedBatchedEx(
                h,
                T,
                T,
                m as c_int,
                n as c_int,
                k as c_int,
                (&alpha as *const f32).cast(),
                ab.at::<f32>(0),
                CUDA_R_32F,
                k as c_int,
                sa as c_longlong,
                bb.at::<f32>(0),
                CUDA_R_32F,
                n as c_int,
                sb as c_longlong,
                (&beta as *const f32).cast(),
                strided.at::<f32>(0),
                CUDA_R_32F,
                m as c_int,
                sc as c_longlong,
                count as c_int,
                COMPUTE_32F,
                -1,
            )
        };
        assert_eq!(r, status::SUCCESS);
        let (got, got_strided): (Vec<f32>, Vec<f32>) =
            (cb.read(sc * count), strided.read(sc * count));
        for j in 0..count {
            let want = reference(
                (true, true),
                (m, n, k),
                alpha,
                &a[j * sa..],
                k,
                &b[j * sb..],
                n,
                beta,
                &vec![f32::NAN; m * n],
                m,
            );
            assert_eq!(&got_strided[j * sc..][..sc], &want[..], "strided item {j}");
            assert_eq!(
                &got[(count - 1 - j) * sc..][..sc],
                &want[..],
                "listed item {j}"
            );
        }
        unsafe { cublasDestroy_v2(h) };
        // Items interleaved column by column (ldc 2m, stride m: attention's heads) are
        // disjoint; a stride shorter than a matrix makes the Cs overlap, which a GPU would race.
        // On a GPU of its own: the second call faults it.
        const GPU_OVERLAP: i32 = 44;
        let wide = Buf::new(GPU_OVERLAP, 4 * 2 * m * n * count);
        let (ab, bb) = (Buf::of(GPU_OVERLAP, &a), Buf::of(GPU_OVERLAP, &b));
        let h = handle_on(GPU_OVERLAP);
        for (ldc, stride, want) in [
            (2 * m, m, status::SUCCESS),
            (m, m, status::EXECUTION_FAILED),
        ] {
            let r = unsafe {
                cublasGemmStridedBatchedEx(
                    h,
                    T,
                    T,
                    m as c_int,
                    n as c_int,
                    k as c_int,
                    (&alpha as *const f32).cast(),
                    ab.at::<f32>(0),
                    CUDA_R_32F,
                    k as c_int,
                    sa as c_longlong,
                    bb.at::<f32>(0),
                    CUDA_R_32F,
                    n as c_int,
                    sb as c_longlong,
                    (&beta as *const f32).cast(),
                    wide.at::<f32>(0),
                    CUDA_R_32F,
                    ldc as c_int,
                    stride as c_longlong,
                    2,
                    COMPUTE_32F,
                    -1,
                )
            };
            assert_eq!(r, want, "ldc {ldc}, stride {stride}");
        }
    }

    /// A matrix outside every live allocation faults the GPU (the call fails, and so does
    /// every later one on it); so does an operand running past its allocation's end.
    #[test]
    fn a_range_outside_the_allocations_faults_the_gpu() {
        let h = handle_on(GPU_FAULT);
        let (m, n, k) = (4, 4, 4);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ab = Buf::of(GPU_FAULT, &values(m * k, 13));
        let cb = Buf::new(GPU_FAULT, 4 * m * n);
        let host = values(k * n, 14); // not a device allocation
        let sgemm = |b: *const f32, ldb: c_int| unsafe {
            cublasSgemm_v2(
                h,
                N,
                N,
                m as c_int,
                n as c_int,
                k as c_int,
                &alpha,
                ab.at::<f32>(0).cast(),
                m as c_int,
                b,
                ldb,
                &beta,
                cb.at::<f32>(0).cast(),
                m as c_int,
            )
        };
        assert_eq!(sgemm(host.as_ptr(), k as c_int), status::EXECUTION_FAILED);
        // The GPU stays failed, even for a correct call.
        assert_eq!(
            sgemm(ab.at::<f32>(0).cast(), k as c_int),
            status::EXECUTION_FAILED
        );
        unsafe { cublasDestroy_v2(h) };

        // Past the end: B's leading dimension reaches beyond its 16 floats.
        let h = handle_on(GPU_FAULT_END);
        let ab = Buf::of(GPU_FAULT_END, &values(m * k, 13));
        let cb = Buf::new(GPU_FAULT_END, 4 * m * n);
        let r = unsafe {
            cublasSgemm_v2(
                h,
                N,
                N,
                m as c_int,
                n as c_int,
                k as c_int,
                &alpha,
                ab.at::<f32>(0).cast(),
                m as c_int,
                ab.at::<f32>(0).cast(),
                5,
                &beta,
                cb.at::<f32>(0).cast(),
                m as c_int,
            )
        };
        assert_eq!(r, status::EXECUTION_FAILED);
        unsafe { cublasDestroy_v2(h) };
    }

    /// A workspace freed while the handle still holds it faults the next GEMM.
    #[test]
    fn a_freed_workspace_faults_the_next_gemm() {
        let h = handle_on(GPU_FREED_WORKSPACE);
        let ws = Buf::new(GPU_FREED_WORKSPACE, 4096);
        assert_eq!(
            unsafe { cublasSetWorkspace_v2(h, ws.at::<u8>(0), 4096) },
            status::SUCCESS
        );
        let ab = Buf::of(GPU_FREED_WORKSPACE, &values(4, 15));
        let cb = Buf::new(GPU_FREED_WORKSPACE, 16);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let sgemm = || unsafe {
            cublasSgemm_v2(
                h,
                N,
                N,
                2,
                2,
                2,
                &alpha,
                ab.at::<f32>(0).cast(),
                2,
                ab.at::<f32>(0).cast(),
                2,
                &beta,
                cb.at::<f32>(0).cast(),
                2,
            )
        };
        assert_eq!(sgemm(), status::SUCCESS);
        ws.unregister();
        assert_eq!(sgemm(), status::EXECUTION_FAILED);
        unsafe { cublasDestroy_v2(h) };
    }

    /// Arguments cuBLAS rejects are refused before anything runs: C keeps its bytes.
    #[test]
    fn arguments_cublas_rejects_are_refused_before_queueing() {
        let h = handle_on(GPU);
        let ab = Buf::of(GPU, &values(64, 16));
        let cb = Buf::new(GPU, 4 * 64);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ex = |ta: u32, m: c_int, lda: c_int, types: [u32; 3], compute: u32, algo: i32| unsafe {
            cublasGemmEx(
                h,
                ta,
                N,
                m,
                4,
                4,
                (&alpha as *const f32).cast(),
                ab.at::<f32>(0),
                types[0],
                lda,
                ab.at::<f32>(0),
                types[1],
                4,
                (&beta as *const f32).cast(),
                cb.at::<f32>(0),
                types[2],
                4,
                compute,
                algo,
            )
        };
        let f32s = [CUDA_R_32F; 3];
        let (h16, b16) = (CUDA_R_16F, CUDA_R_16BF);
        let cases = [
            // lda below m (N) or below k (T); a negative size; a bad transpose or algorithm.
            (ex(N, 4, 3, f32s, COMPUTE_32F, -1), status::INVALID_VALUE),
            (ex(T, 4, 3, f32s, COMPUTE_32F, -1), status::INVALID_VALUE),
            (ex(N, -1, 4, f32s, COMPUTE_32F, -1), status::INVALID_VALUE),
            (ex(5, 4, 4, f32s, COMPUTE_32F, -1), status::INVALID_VALUE),
            (ex(N, 4, 4, f32s, COMPUTE_32F, 50), status::INVALID_VALUE),
            // Mixed operand types, f32 operands into a 16-bit C, 16-bit operands under a
            // fast compute type, a 16-bit compute type, an unknown data type.
            (
                ex(N, 4, 4, [h16, CUDA_R_32F, CUDA_R_32F], COMPUTE_32F, -1),
                status::NOT_SUPPORTED,
            ),
            (
                ex(N, 4, 4, [CUDA_R_32F, CUDA_R_32F, h16], COMPUTE_32F, -1),
                status::NOT_SUPPORTED,
            ),
            (
                ex(N, 4, 4, [b16, b16, CUDA_R_32F], COMPUTE_32F_FAST_16BF, -1),
                status::NOT_SUPPORTED,
            ),
            (ex(N, 4, 4, [h16, h16, h16], 64, -1), status::NOT_SUPPORTED),
            (
                ex(N, 4, 4, [1, 1, 1], COMPUTE_32F, -1),
                status::NOT_SUPPORTED,
            ),
            // A valid but empty GEMM does nothing.
            (ex(N, 0, 1, f32s, COMPUTE_32F, -1), status::SUCCESS),
        ];
        for (i, (got, want)) in cases.into_iter().enumerate() {
            assert_eq!(got, want, "case {i}");
        }
        let null = unsafe {
            cublasSgemm_v2(
                h,
                N,
                N,
                4,
                4,
                4,
                std::ptr::null(),
                ab.at::<f32>(0).cast(),
                4,
                ab.at::<f32>(0).cast(),
                4,
                &beta,
                cb.at::<f32>(0).cast(),
                4,
            )
        };
        assert_eq!(null, status::INVALID_VALUE);
        let batched = unsafe {
            cublasGemmStridedBatchedEx(
                h,
                N,
                N,
                4,
                4,
                4,
                (&alpha as *const f32).cast(),
                ab.at::<f32>(0),
                CUDA_R_32F,
                4,
                0,
                ab.at::<f32>(0),
                CUDA_R_32F,
                4,
                0,
                (&beta as *const f32).cast(),
                cb.at::<f32>(0),
                CUDA_R_32F,
                4,
                16,
                -1,
                COMPUTE_32F,
                -1,
            )
        };
        assert_eq!(batched, status::INVALID_VALUE);
        assert!(
            cb.read::<f32>(64).iter().all(|x| x.to_bits() == u32::MAX),
            "C written"
        );
        unsafe { cublasDestroy_v2(h) };
    }

    /// A handle keeps its stream, math mode and workspace; device pointer mode is refused; a
    /// destroyed handle is not live.
    #[test]
    fn handles_keep_their_settings_and_die_once() {
        let h = handle_on(GPU);
        let mut v = 0;
        assert_eq!(unsafe { cublasGetVersion_v2(h, &mut v) }, status::SUCCESS);
        assert_eq!(v, 130100);
        let mut s = null_mut();
        assert_eq!(
            unsafe { cublasSetStream_v2(h, 0x1230 as *mut c_void) },
            status::SUCCESS
        );
        assert_eq!(unsafe { cublasGetStream_v2(h, &mut s) }, status::SUCCESS);
        assert_eq!(s as usize, 0x1230);
        assert_eq!(
            unsafe { cublasSetStream_v2(h, null_mut()) },
            status::SUCCESS
        );
        let mode = DISALLOW_REDUCED_PRECISION_REDUCTION;
        assert_eq!(unsafe { cublasSetMathMode(h, mode) }, status::SUCCESS);
        let mut got = 99;
        assert_eq!(unsafe { cublasGetMathMode(h, &mut got) }, status::SUCCESS);
        assert_eq!(got, mode);
        assert_eq!(unsafe { cublasSetMathMode(h, 7) }, status::INVALID_VALUE);
        let mut pm = 99;
        assert_eq!(
            unsafe { cublasSetPointerMode_v2(h, POINTER_MODE_HOST) },
            status::SUCCESS
        );
        assert_eq!(
            unsafe { cublasGetPointerMode_v2(h, &mut pm) },
            status::SUCCESS
        );
        assert_eq!(pm, POINTER_MODE_HOST);
        assert_eq!(
            unsafe { cublasSetPointerMode_v2(h, POINTER_MODE_DEVICE) },
            status::NOT_SUPPORTED
        );
        // Workspaces: 256-byte aligned, inside a live allocation of this GPU.
        let ws = Buf::new(GPU, 1024);
        let host = vec![0u8; 2048];
        let host = host[host.as_ptr().align_offset(256)..].as_ptr();
        let set = |p: *mut c_void, n: usize| unsafe { cublasSetWorkspace_v2(h, p, n) };
        assert_eq!(set(ws.at::<u8>(16), 512), status::INVALID_VALUE);
        assert_eq!(set(ws.at::<u8>(0), 2048), status::INVALID_VALUE);
        assert_eq!(set(host as *mut c_void, 512), status::INVALID_VALUE);
        assert_eq!(set(ws.at::<u8>(0), 1024), status::SUCCESS);
        assert_eq!(set(null_mut(), 0), status::SUCCESS);
        assert_eq!(unsafe { cublasDestroy_v2(h) }, status::SUCCESS);
        assert_eq!(unsafe { cublasDestroy_v2(h) }, status::NOT_INITIALIZED);
        assert_eq!(
            unsafe { cublasGetVersion_v2(h, &mut v) },
            status::NOT_INITIALIZED
        );
        let (alpha, beta) = (1.0f32, 0.0f32);
        let r = unsafe {
            cublasSgemm_v2(
                h,
                N,
                N,
                1,
                1,
                1,
                &alpha,
                ws.at::<u8>(0).cast(),
                1,
                ws.at::<u8>(0).cast(),
                1,
                &beta,
                ws.at::<u8>(0).cast(),
                1,
            )
        };
        assert_eq!(r, status::NOT_INITIALIZED);
    }

    /// cuBLASLt's matmul: a strided bf16 batch with a bf16 output is the bits of cuBLAS's
    /// strided GEMM (with `DISALLOW_REDUCED_PRECISION_REDUCTION`) when the preference rules out
    /// split-K sums in the output's type, and not without that mask; an address less aligned
    /// than the heuristic was told, a workspace short of the algorithm's, an algorithm run on
    /// other layouts and layouts that make no product are refused.
    #[test]
    fn cublaslt_matmul_is_the_strided_gemm_and_refuses_misuse() {
        use crate::cublaslt::*;
        const GPU_LT: i32 = 45;
        let h = handle_on(GPU_LT);
        let math = DISALLOW_REDUCED_PRECISION_REDUCTION;
        assert_eq!(unsafe { cublasSetMathMode(h, math) }, status::SUCCESS);
        let mut lt = null_mut();
        assert_eq!(unsafe { cublasLtCreate(&mut lt) }, status::SUCCESS);
        // A m × k (N), B stored n × k (T), C m × n, three items; A's stride is odd, so its
        // items are only 2-byte aligned.
        let (m, n, k, count) = (5usize, 6usize, 40usize, 3usize);
        let strides = [(m * k + 1) as i64, (n * k) as i64, (m * n + 3) as i64];
        let bf = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let a = Buf::of(GPU_LT, &bf(values(strides[0] as usize * count, 1)));
        let b = Buf::of(GPU_LT, &bf(values(strides[1] as usize * count, 2)));
        let c_len = strides[2] as usize * count;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = Buf::of(GPU_LT, &vec![bf16::ZERO; c_len]);
        let r = unsafe {
            cublasGemmStridedBatchedEx(
                h,
                N,
                T,
                m as c_int,
                n as c_int,
                k as c_int,
                (&alpha as *const f32).cast(),
                a.at::<bf16>(0),
                CUDA_R_16BF,
                m as c_int,
                strides[0],
                b.at::<bf16>(0),
                CUDA_R_16BF,
                n as c_int,
                strides[1],
                (&beta as *const f32).cast(),
                blas.at::<bf16>(0),
                CUDA_R_16BF,
                m as c_int,
                strides[2],
                count as c_int,
                COMPUTE_32F,
                -1,
            )
        };
        assert_eq!(r, status::SUCCESS);
        let want: Vec<u16> = blas
            .read::<bf16>(c_len)
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let ws = Buf::new(GPU_LT, 1 << 20);
        // Descriptors for (rows, cols) of A, B, C and a preference; returns the algorithm and
        // its workspace, or the heuristic's status.
        let plan = |c_rows: u64, mask: Option<u32>, align_a: u32| unsafe {
            let mut desc = null_mut();
            assert_eq!(
                cublasLtMatmulDescCreate(&mut desc, COMPUTE_32F, CUDA_R_32F),
                0
            );
            let trans_b: i32 = 1;
            let tb = (&trans_b as *const i32).cast();
            assert_eq!(cublasLtMatmulDescSetAttribute(desc, 4, tb, 4), 0);
            let mut layouts = [null_mut(); 3];
            let dims = [
                (m as u64, k as u64),
                (n as u64, k as u64),
                (c_rows, n as u64),
            ];
            for (i, (rows, cols)) in dims.into_iter().enumerate() {
                let ld = rows as i64;
                assert_eq!(
                    cublasLtMatrixLayoutCreate(&mut layouts[i], CUDA_R_16BF, rows, cols, ld),
                    0
                );
                let cnt = count as i32;
                let set_count =
                    cublasLtMatrixLayoutSetAttribute(layouts[i], 5, (&cnt as *const i32).cast(), 4);
                assert_eq!(set_count, 0);
                let st = (&strides[i] as *const i64).cast();
                assert_eq!(cublasLtMatrixLayoutSetAttribute(layouts[i], 6, st, 8), 0);
            }
            let mut pref = null_mut();
            assert_eq!(cublasLtMatmulPreferenceCreate(&mut pref), 0);
            let bytes: u64 = 1 << 20;
            let wb = (&bytes as *const u64).cast();
            assert_eq!(cublasLtMatmulPreferenceSetAttribute(pref, 1, wb, 8), 0);
            if let Some(mask) = mask {
                let mb = (&mask as *const u32).cast();
                assert_eq!(cublasLtMatmulPreferenceSetAttribute(pref, 3, mb, 4), 0);
            }
            // A as the caller says; B's items are 32-byte aligned, C's (and D's) 2-byte.
            for (attr, align) in [(5, align_a), (6, 32u32), (7, 2), (8, 2)] {
                let ab = (&align as *const u32).cast();
                assert_eq!(cublasLtMatmulPreferenceSetAttribute(pref, attr, ab, 4), 0);
            }
            let mut found = std::mem::MaybeUninit::<HeuristicResult>::uninit();
            let mut got = 0;
            let [la, lb, lc] = layouts;
            let r = cublasLtMatmulAlgoGetHeuristic(
                lt,
                desc,
                la,
                lb,
                lc,
                lc,
                pref,
                1,
                found.as_mut_ptr(),
                &mut got,
            );
            assert_eq!(cublasLtMatmulPreferenceDestroy(pref), 0);
            let found = (r == 0 && got == 1).then(|| found.assume_init());
            (r, desc, layouts, found)
        };
        // (mask, alignment of A promised, workspace bytes given) → status, and C's bits.
        let run = |mask: Option<u32>, align_a: u32, ws_bytes: usize| unsafe {
            let (r, desc, [la, lb, lc], found) = plan(m as u64, mask, align_a);
            assert_eq!(r, status::SUCCESS);
            let found = found.unwrap();
            let out = Buf::of(GPU_LT, &vec![bf16::ZERO; c_len]);
            let r = cublasLtMatmul(
                lt,
                desc,
                (&alpha as *const f32).cast(),
                a.at::<bf16>(0),
                la,
                b.at::<bf16>(0),
                lb,
                (&beta as *const f32).cast(),
                out.at::<bf16>(0),
                lc,
                out.at::<bf16>(0),
                lc,
                &found.algo,
                ws.at::<u8>(0),
                ws_bytes,
                null_mut(),
            );
            let bits: Vec<u16> = out
                .read::<bf16>(c_len)
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (r, bits)
        };
        // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | _NONE (0).
        let f32_only = 2;
        assert_eq!(
            run(Some(f32_only), 2, 1 << 20),
            (status::SUCCESS, want.clone())
        );
        // cuBLASLt's default mask allows split-K sums in bf16: another rounding.
        let (r, bits) = run(None, 2, 1 << 20);
        assert_eq!(r, status::SUCCESS);
        assert_ne!(bits, want, "no extra rounding without the mask");
        // A's items are 2-byte aligned; promising 4 is refused.
        assert_eq!(run(Some(f32_only), 4, 1 << 20).0, status::INVALID_VALUE);
        // The algorithm was given a workspace; running it without is refused.
        assert_eq!(run(Some(f32_only), 2, 0).0, status::INVALID_VALUE);
        // C's rows do not match op(A)'s: no product.
        assert_eq!(plan(m as u64 + 1, None, 2).0, status::INVALID_VALUE);
        unsafe {
            assert_eq!(cublasLtDestroy(lt), 0);
            cublasDestroy_v2(h);
        }
    }
}
