//! cuBLASLt on the CPU: handles, matmul descriptors, matrix layouts, preferences, the
//! heuristic and `cublasLtMatmul`, as much of them as the CUDA backend uses
//! (runtime/src/backend/cuda/lt.rs): column-major f32/fp16/bf16 matrices, transposes, strided
//! batches, host alpha and beta, C overwritten in place. The arithmetic is cuBLAS's here
//! ([`crate::cublas`]: f32 sums in k order, one rounding to C's type).
//!
//! What it checks, where a real cuBLASLt would misbehave silently or fail later:
//! - layouts that do not fit the descriptor's transposes (A is m × k or k × m, B k × n or
//!   n × k, C and D m × n, every batch count the same), and attributes it does not emulate
//!   (refused, not ignored);
//! - an algorithm used with descriptors other than those the heuristic was asked about;
//! - an address less aligned than the preference promised the heuristic (the real heuristic
//!   assumes 256 bytes unless told, and may pick a kernel that needs them);
//! - a workspace smaller than the algorithm's, or outside the live allocations;
//! - a 16-bit output whose preference allows split-K sums in the output's type
//!   (`CUBLASLT_REDUCTION_SCHEME_INPLACE` or `_OUTPUT_TYPE`, both allowed by default): its
//!   partial sums are then rounded to it, as cuBLAS's without
//!   `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION` ([`crate::cublas`]), so a caller that
//!   forgets the mask sees the extra rounding in its results.
//!
//! `RECIPE_FAKE_CUBLASLT_NO_ALGORITHM=1` makes the heuristic find nothing, and
//! `RECIPE_FAKE_CUBLASLT_REFUSE=1` makes `cublasLtMatmul` refuse every call (`NOT_SUPPORTED`,
//! nothing queued), for the callers' fallbacks to cuBLAS. For a caller that chooses among the
//! heuristic's answers (`RECIPE_GEMM_ALGO=fastest`): with `RECIPE_FAKE_CUBLASLT_DISTINCT=1` the
//! answers after the first split `k` in two with f32 partial sums (other bits than the first's
//! one sum), and `RECIPE_FAKE_CUBLASLT_SLOW=0,2` makes the answers of those ranks take at least
//! 10 ms a call: far beyond what a busy machine's scheduling adds to another answer's timing (at
//! 1 ms, a CI run with the tests in parallel once timed the first answer slower than a slow one).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use crate::complain;
use crate::cublas::{
    queue, status, Call, Gemm, Items, CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F,
    DISALLOW_REDUCED_PRECISION_REDUCTION,
};

/// What `cublasLtGetVersion` reports: cuBLASLt 13.1, as the fake cuBLAS.
const VERSION: usize = 130100;

// cublasLtMatmulDescAttributes_t.
const DESC_POINTER_MODE: u32 = 2;
const DESC_TRANSA: u32 = 3;
const DESC_TRANSB: u32 = 4;
const DESC_EPILOGUE: u32 = 7;
const EPILOGUE_DEFAULT: u32 = 1;

// cublasLtMatrixLayoutAttribute_t.
const LAYOUT_ORDER: u32 = 1;
const LAYOUT_BATCH_COUNT: u32 = 5;
const LAYOUT_STRIDED_BATCH_OFFSET: u32 = 6;
const ORDER_COL: i32 = 0;

// cublasLtMatmulPreferenceAttributes_t.
const PREF_SEARCH_MODE: u32 = 0;
const PREF_MAX_WORKSPACE_BYTES: u32 = 1;
const PREF_REDUCTION_SCHEME_MASK: u32 = 3;
const PREF_MIN_ALIGNMENT_A: u32 = 5;
const PREF_MIN_ALIGNMENT_D: u32 = 8;

// cublasLtReductionScheme_t.
const REDUCTION_INPLACE: u32 = 1;
const REDUCTION_OUTPUT_TYPE: u32 = 4;
const REDUCTION_MASK: u32 = 7;

/// The bytes an algorithm asks of the workspace when offered at least as much: so that a
/// caller passing none, or a short one, is caught.
const ALGO_WORKSPACE: usize = 1 << 16;

/// Marks an algorithm this heuristic returned (`cublasLtMatmulAlgo_t.data[0]`).
const ALGO_TAG: u64 = 0x5245_4349_5045_4c54;

/// A matmul descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Desc {
    compute: u32,
    scale: u32,
    trans: [u32; 2],
}

/// A matrix layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    dtype: u32,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: i32,
    stride: i64,
}

/// A preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pref {
    max_workspace: u64,
    reductions: u32,
    /// A, B, C, D.
    align: [u32; 4],
}

/// What an algorithm was chosen for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chosen {
    desc: Desc,
    /// A, B, C, D.
    layouts: [Layout; 4],
    align: [u32; 4],
    workspace: usize,
    /// Split-K sums may be added in a 16-bit output's type.
    reduced: bool,
    /// Its rank in the heuristic's answer.
    rank: usize,
}

#[derive(Default)]
struct Objects {
    handles: BTreeMap<usize, i32>,
    descs: BTreeMap<usize, Desc>,
    layouts: BTreeMap<usize, Layout>,
    prefs: BTreeMap<usize, Pref>,
    algos: BTreeMap<u64, Chosen>,
}

static OBJECTS: Mutex<Option<Objects>> = Mutex::new(None);

fn objects() -> MutexGuard<'static, Option<Objects>> {
    let mut g = OBJECTS.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(Objects::default);
    g
}

/// Runs `f` on the objects (always there after [`objects`]).
fn with<R>(f: impl FnOnce(&mut Objects) -> R) -> R {
    f(objects().as_mut().expect("initialised"))
}

/// A new object id, unique with the driver's handles.
fn new_id() -> usize {
    crate::state().handle()
}

/// Writes a new object made by `make` into `*out`.
unsafe fn create(what: &str, out: *mut *mut c_void, make: impl FnOnce(&mut Objects, usize)) -> u32 {
    if out.is_null() {
        complain(what, "a null output pointer");
        return status::INVALID_VALUE;
    }
    let id = new_id();
    with(|o| make(o, id));
    *out = id as *mut c_void;
    status::SUCCESS
}

/// Removes object `h` from the map `pick` selects; a dead one is refused.
fn destroy<T>(what: &str, h: *mut c_void, pick: impl FnOnce(&mut Objects) -> Option<T>) -> u32 {
    if h.is_null() {
        return status::SUCCESS; // cuBLASLt accepts a null descriptor here
    }
    match with(pick) {
        Some(_) => status::SUCCESS,
        None => {
            complain(what, &format!("{h:p} is not live (destroyed twice?)"));
            status::INVALID_VALUE
        }
    }
}

/// An attribute's value of type `T`, its buffer's size checked.
unsafe fn value<T: Copy>(what: &str, buf: *const c_void, size: usize) -> Result<T, u32> {
    if buf.is_null() || size != std::mem::size_of::<T>() {
        complain(
            what,
            &format!(
                "an attribute buffer of {size} bytes at {buf:p}, where its type has {}",
                std::mem::size_of::<T>()
            ),
        );
        return Err(status::INVALID_VALUE);
    }
    Ok(std::ptr::read_unaligned(buf as *const T))
}

fn not_emulated(what: &str, attr: u32) -> u32 {
    complain(what, &format!("attribute {attr} is not emulated"));
    status::NOT_SUPPORTED
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtCreate(handle: *mut *mut c_void) -> u32 {
    let what = "cublasLtCreate";
    let device = crate::current().unwrap_or(-1);
    create(what, handle, |o, id| {
        o.handles.insert(id, device);
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtDestroy(handle: *mut c_void) -> u32 {
    let id = handle as usize;
    if with(|o| o.handles.remove(&id)).is_some() {
        return status::SUCCESS;
    }
    complain(
        "cublasLtDestroy",
        &format!("{handle:p} is not a live cuBLASLt handle"),
    );
    status::NOT_INITIALIZED
}

#[no_mangle]
pub extern "C" fn cublasLtGetVersion() -> usize {
    VERSION
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescCreate(
    desc: *mut *mut c_void,
    compute: u32,
    scale: u32,
) -> u32 {
    let what = "cublasLtMatmulDescCreate";
    if scale != CUDA_R_32F {
        complain(
            what,
            &format!("scale type {scale}: only CUDA_R_32F is emulated"),
        );
        return status::NOT_SUPPORTED;
    }
    create(what, desc, |o, id| {
        o.descs.insert(
            id,
            Desc {
                compute,
                scale,
                trans: [0, 0],
            },
        );
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescDestroy(desc: *mut c_void) -> u32 {
    destroy("cublasLtMatmulDescDestroy", desc, |o| {
        o.descs.remove(&(desc as usize))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescSetAttribute(
    desc: *mut c_void,
    attr: u32,
    buf: *const c_void,
    size: usize,
) -> u32 {
    let what = "cublasLtMatmulDescSetAttribute";
    let v: i32 = match attr {
        DESC_TRANSA | DESC_TRANSB | DESC_POINTER_MODE | DESC_EPILOGUE => {
            match value(what, buf, size) {
                Ok(v) => v,
                Err(e) => return e,
            }
        }
        _ => return not_emulated(what, attr),
    };
    match attr {
        DESC_TRANSA | DESC_TRANSB if !(0..=2).contains(&v) => {
            complain(what, &format!("{v} is not a cublasOperation_t"));
            return status::INVALID_VALUE;
        }
        // Host scalars only (read when the matmul is queued), no epilogue.
        DESC_POINTER_MODE if v != 0 => return not_emulated(what, attr),
        DESC_EPILOGUE if v as u32 != EPILOGUE_DEFAULT => return not_emulated(what, attr),
        _ => {}
    }
    let found = with(|o| match o.descs.get_mut(&(desc as usize)) {
        Some(d) => {
            match attr {
                DESC_TRANSA => d.trans[0] = v as u32,
                DESC_TRANSB => d.trans[1] = v as u32,
                _ => {}
            }
            true
        }
        None => false,
    });
    if !found {
        complain(what, &format!("{desc:p} is not a live matmul descriptor"));
        return status::INVALID_VALUE;
    }
    status::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutCreate(
    layout: *mut *mut c_void,
    dtype: u32,
    rows: u64,
    cols: u64,
    ld: i64,
) -> u32 {
    let what = "cublasLtMatrixLayoutCreate";
    if ![CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF].contains(&dtype) {
        complain(what, &format!("type {dtype} is not emulated"));
        return status::NOT_SUPPORTED;
    }
    // cuBLASLt: the leading dimension of a column-major matrix is at least its rows.
    if ld < rows.max(1) as i64 {
        complain(
            what,
            &format!("leading dimension {ld} < max(1, rows {rows})"),
        );
        return status::INVALID_VALUE;
    }
    create(what, layout, |o, id| {
        o.layouts.insert(
            id,
            Layout {
                dtype,
                rows,
                cols,
                ld,
                batch: 1,
                stride: 0,
            },
        );
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutDestroy(layout: *mut c_void) -> u32 {
    destroy("cublasLtMatrixLayoutDestroy", layout, |o| {
        o.layouts.remove(&(layout as usize))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutSetAttribute(
    layout: *mut c_void,
    attr: u32,
    buf: *const c_void,
    size: usize,
) -> u32 {
    let what = "cublasLtMatrixLayoutSetAttribute";
    enum Set {
        Batch(i32),
        Stride(i64),
        Order,
    }
    let set = match attr {
        LAYOUT_BATCH_COUNT => match value::<i32>(what, buf, size) {
            Ok(v) if v >= 1 => Set::Batch(v),
            Ok(v) => {
                complain(what, &format!("batch count {v}"));
                return status::INVALID_VALUE;
            }
            Err(e) => return e,
        },
        LAYOUT_STRIDED_BATCH_OFFSET => match value::<i64>(what, buf, size) {
            Ok(v) => Set::Stride(v),
            Err(e) => return e,
        },
        LAYOUT_ORDER => match value::<i32>(what, buf, size) {
            Ok(ORDER_COL) => Set::Order,
            Ok(_) => return not_emulated(what, attr),
            Err(e) => return e,
        },
        _ => return not_emulated(what, attr),
    };
    let found = with(|o| match o.layouts.get_mut(&(layout as usize)) {
        Some(l) => {
            match set {
                Set::Batch(v) => l.batch = v,
                Set::Stride(v) => l.stride = v,
                Set::Order => {}
            }
            true
        }
        None => false,
    });
    if !found {
        complain(what, &format!("{layout:p} is not a live matrix layout"));
        return status::INVALID_VALUE;
    }
    status::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceCreate(pref: *mut *mut c_void) -> u32 {
    create("cublasLtMatmulPreferenceCreate", pref, |o, id| {
        o.prefs.insert(
            id,
            Pref {
                max_workspace: 0,
                // Everything allowed, and 256-byte alignment assumed: cuBLASLt's defaults.
                reductions: REDUCTION_MASK,
                align: [256; 4],
            },
        );
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceDestroy(pref: *mut c_void) -> u32 {
    destroy("cublasLtMatmulPreferenceDestroy", pref, |o| {
        o.prefs.remove(&(pref as usize))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceSetAttribute(
    pref: *mut c_void,
    attr: u32,
    buf: *const c_void,
    size: usize,
) -> u32 {
    let what = "cublasLtMatmulPreferenceSetAttribute";
    let apply: Box<dyn FnOnce(&mut Pref)> = match attr {
        PREF_MAX_WORKSPACE_BYTES => match value::<u64>(what, buf, size) {
            Ok(v) => Box::new(move |p| p.max_workspace = v),
            Err(e) => return e,
        },
        PREF_REDUCTION_SCHEME_MASK => match value::<u32>(what, buf, size) {
            Ok(v) => Box::new(move |p| p.reductions = v & REDUCTION_MASK),
            Err(e) => return e,
        },
        PREF_MIN_ALIGNMENT_A..=PREF_MIN_ALIGNMENT_D => match value::<u32>(what, buf, size) {
            Ok(v) => {
                let i = (attr - PREF_MIN_ALIGNMENT_A) as usize;
                Box::new(move |p| p.align[i] = v)
            }
            Err(e) => return e,
        },
        PREF_SEARCH_MODE => match value::<u32>(what, buf, size) {
            Ok(0) => Box::new(|_| {}),
            Ok(_) => return not_emulated(what, attr),
            Err(e) => return e,
        },
        _ => return not_emulated(what, attr),
    };
    let found = with(|o| match o.prefs.get_mut(&(pref as usize)) {
        Some(p) => {
            apply(p);
            true
        }
        None => false,
    });
    if !found {
        complain(what, &format!("{pref:p} is not a live preference"));
        return status::INVALID_VALUE;
    }
    status::SUCCESS
}

/// `cublasLtMatmulHeuristicResult_t`.
#[repr(C)]
pub struct HeuristicResult {
    pub algo: [u64; 8],
    pub workspace_size: usize,
    pub state: u32,
    pub waves_count: f32,
    pub reserved: [c_int; 4],
}

/// The problem the descriptors describe, as cuBLAS's call, checked: the layouts fit the
/// transposes and each other.
fn problem(what: &str, desc: &Desc, l: &[Layout; 4]) -> Result<(Call, [i64; 3]), u32> {
    let invalid = |why: String| {
        complain(what, &why);
        status::INVALID_VALUE
    };
    let [a, b, c, d] = *l;
    if c != d {
        return Err(invalid(format!("C's layout {c:?} differs from D's {d:?}")));
    }
    let (m, n) = (c.rows, c.cols);
    let t = |i: usize| desc.trans[i] != 0;
    let (a_mk, b_kn) = (
        if t(0) {
            (a.cols, a.rows)
        } else {
            (a.rows, a.cols)
        },
        if t(1) {
            (b.cols, b.rows)
        } else {
            (b.rows, b.cols)
        },
    );
    let k = a_mk.1;
    if a_mk.0 != m || b_kn != (k, n) {
        return Err(invalid(format!(
            "op(A) {}×{}, op(B) {}×{} and C {m}×{n} do not make a product (transposes {:?})",
            a_mk.0, a_mk.1, b_kn.0, b_kn.1, desc.trans
        )));
    }
    if a.batch != c.batch || b.batch != c.batch {
        return Err(invalid(format!(
            "batch counts A {}, B {}, C {}",
            a.batch, b.batch, c.batch
        )));
    }
    let int = |x: u64| c_int::try_from(x).map_err(|_| invalid(format!("{x} past an int")));
    let ld = |x: i64| c_int::try_from(x).map_err(|_| invalid(format!("{x} past an int")));
    Ok((
        Call {
            trans: desc.trans,
            dims: [int(m)?, int(n)?, int(k)?],
            lds: [ld(a.ld)?, ld(b.ld)?, ld(c.ld)?],
            // Filled in by the matmul; the heuristic checks types only.
            scalars: [std::ptr::null(); 2],
            types: [a.dtype, b.dtype, c.dtype],
            compute: desc.compute,
            algo: -1,
            count: c.batch,
        },
        [a.stride, b.stride, c.stride],
    ))
}

/// The live descriptor and layouts named, or why not.
fn lookup(
    what: &str,
    desc: *mut c_void,
    layouts: [*mut c_void; 4],
) -> Result<(Desc, [Layout; 4]), u32> {
    let found = with(|o| {
        let d = *o.descs.get(&(desc as usize))?;
        let mut l = [None; 4];
        for (slot, &p) in l.iter_mut().zip(&layouts) {
            *slot = o.layouts.get(&(p as usize)).copied();
        }
        Some((d, l))
    });
    let Some((d, l)) = found else {
        complain(what, &format!("{desc:p} is not a live matmul descriptor"));
        return Err(status::INVALID_VALUE);
    };
    let mut out = [Layout {
        dtype: 0,
        rows: 0,
        cols: 0,
        ld: 0,
        batch: 0,
        stride: 0,
    }; 4];
    for (i, (slot, found)) in out.iter_mut().zip(l).enumerate() {
        match found {
            Some(x) => *slot = x,
            None => {
                complain(
                    what,
                    &format!(
                        "{:p} ({}) is not a live matrix layout",
                        layouts[i],
                        ["A", "B", "C", "D"][i]
                    ),
                );
                return Err(status::INVALID_VALUE);
            }
        }
    }
    Ok((d, out))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasLtMatmulAlgoGetHeuristic(
    handle: *mut c_void,
    desc: *mut c_void,
    a: *mut c_void,
    b: *mut c_void,
    c: *mut c_void,
    d: *mut c_void,
    pref: *mut c_void,
    requested: c_int,
    results: *mut HeuristicResult,
    returned: *mut c_int,
) -> u32 {
    let what = "cublasLtMatmulAlgoGetHeuristic";
    if !with(|o| o.handles.contains_key(&(handle as usize))) {
        complain(what, &format!("{handle:p} is not a live cuBLASLt handle"));
        return status::NOT_INITIALIZED;
    }
    if requested < 1 || results.is_null() || returned.is_null() {
        complain(what, "no room for a result");
        return status::INVALID_VALUE;
    }
    let Some(p) = with(|o| o.prefs.get(&(pref as usize)).copied()) else {
        complain(what, &format!("{pref:p} is not a live preference"));
        return status::INVALID_VALUE;
    };
    let (desc, layouts) = match lookup(what, desc, [a, b, c, d]) {
        Ok(x) => x,
        Err(e) => return e,
    };
    let (call, _) = match problem(what, &desc, &layouts) {
        Ok(x) => x,
        Err(e) => return e,
    };
    // The type table is cuBLAS's (`Gemm::check`), with alpha and beta not read yet.
    let one = 1.0f32;
    let typed = Call {
        scalars: [(&one as *const f32).cast(); 2],
        ..call
    };
    if let Err(e) = Gemm::check(what, &typed, 0) {
        return e;
    }
    if std::env::var("RECIPE_FAKE_CUBLASLT_NO_ALGORITHM").as_deref() == Ok("1") {
        *returned = 0;
        return status::NOT_SUPPORTED;
    }
    for (i, &x) in p.align.iter().enumerate() {
        if !x.is_power_of_two() {
            complain(
                what,
                &format!(
                    "alignment {x} of {} is not a power of two",
                    ["A", "B", "C", "D"][i]
                ),
            );
            return status::INVALID_VALUE;
        }
    }
    let workspace = if p.max_workspace >= ALGO_WORKSPACE as u64 {
        ALGO_WORKSPACE
    } else {
        0
    };
    let chosen = Chosen {
        desc,
        layouts,
        align: p.align,
        workspace,
        reduced: p.reductions & (REDUCTION_INPLACE | REDUCTION_OUTPUT_TYPE) != 0,
        rank: 0,
    };
    // Up to three algorithms (the real heuristic offers several; they compute alike here,
    // unless RECIPE_FAKE_CUBLASLT_DISTINCT), their waves made up, decreasing.
    let count = requested.min(3);
    for j in 0..count as usize {
        let id = new_id() as u64;
        with(|o| o.algos.insert(id, Chosen { rank: j, ..chosen }));
        results.add(j).write(HeuristicResult {
            algo: [ALGO_TAG, id, 0, 0, 0, 0, 0, 0],
            workspace_size: workspace,
            state: status::SUCCESS,
            waves_count: 1.0 / (j + 1) as f32,
            reserved: [0; 4],
        });
    }
    *returned = count;
    status::SUCCESS
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasLtMatmul(
    handle: *mut c_void,
    desc: *mut c_void,
    alpha: *const c_void,
    a: *const c_void,
    a_desc: *mut c_void,
    b: *const c_void,
    b_desc: *mut c_void,
    beta: *const c_void,
    c: *const c_void,
    c_desc: *mut c_void,
    d: *mut c_void,
    d_desc: *mut c_void,
    algo: *const [u64; 8],
    workspace: *mut c_void,
    workspace_bytes: usize,
    stream: *mut c_void,
) -> u32 {
    let what = "cublasLtMatmul";
    if std::env::var("RECIPE_FAKE_CUBLASLT_REFUSE").as_deref() == Ok("1") {
        return status::NOT_SUPPORTED;
    }
    if !with(|o| o.handles.contains_key(&(handle as usize))) {
        complain(what, &format!("{handle:p} is not a live cuBLASLt handle"));
        return status::NOT_INITIALIZED;
    }
    let (desc, layouts) = match lookup(what, desc, [a_desc, b_desc, c_desc, d_desc]) {
        Ok(x) => x,
        Err(e) => return e,
    };
    if algo.is_null() {
        // cuBLASLt would run its own heuristic; the backend always passes the one it chose.
        complain(what, "no algorithm (the heuristic's is expected)");
        return status::NOT_SUPPORTED;
    }
    let [tag, id, ..] = *algo;
    let chosen = with(|o| o.algos.get(&id).copied());
    let Some(chosen) = chosen.filter(|_| tag == ALGO_TAG) else {
        complain(what, "an algorithm this heuristic did not return");
        return status::INVALID_VALUE;
    };
    if chosen.desc != desc || chosen.layouts != layouts {
        complain(
            what,
            &format!(
                "the algorithm was chosen for {:?} {:?}, and is run with {desc:?} {layouts:?}",
                chosen.desc, chosen.layouts
            ),
        );
        return status::INVALID_VALUE;
    }
    let (call, strides) = match problem(what, &desc, &layouts) {
        Ok(x) => x,
        Err(e) => return e,
    };
    if c as u64 != d as u64 {
        complain(
            what,
            "D apart from C is not emulated (the backend writes C in place)",
        );
        return status::NOT_SUPPORTED;
    }
    let call = Call {
        scalars: [alpha, beta],
        ..call
    };
    let math = if chosen.reduced {
        0
    } else {
        DISALLOW_REDUCED_PRECISION_REDUCTION
    };
    let mut g = match Gemm::check(what, &call, math) {
        Ok(g) => g,
        Err(e) => return e,
    };
    if chosen.rank > 0 && std::env::var("RECIPE_FAKE_CUBLASLT_DISTINCT").as_deref() == Ok("1") {
        g = g.with_f32_split();
    }
    let slow = std::env::var("RECIPE_FAKE_CUBLASLT_SLOW").unwrap_or_default();
    if slow.split(',').any(|r| r.trim() == chosen.rank.to_string()) {
        g = g.with_delay(std::time::Duration::from_millis(10));
    }
    let count = call.count as usize;
    // Every item's address against the alignment the heuristic was promised.
    let bytes = g.elem_bytes();
    let bases = [a as u64, b as u64, c as u64];
    for i in 0..3 {
        let step = strides[i].unsigned_abs() * bytes[i] as u64;
        let worst = if count > 1 { bases[i] | step } else { bases[i] };
        let promised = u64::from(chosen.align[i]);
        if worst % promised != 0 {
            complain(
                what,
                &format!(
                    "{}'s addresses ({:#x}, stride {step} bytes) are not aligned to the {promised} \
                     bytes the heuristic was told",
                    ["A", "B", "C"][i],
                    bases[i]
                ),
            );
            return status::INVALID_VALUE;
        }
    }
    if workspace_bytes < chosen.workspace || (chosen.workspace > 0 && workspace.is_null()) {
        complain(
            what,
            &format!(
                "a workspace of {workspace_bytes} bytes at {workspace:p}; the algorithm needs {}",
                chosen.workspace
            ),
        );
        return status::INVALID_VALUE;
    }
    if g.is_empty() {
        return status::SUCCESS;
    }
    let Some(device) = crate::current() else {
        complain(what, "no current context");
        return status::EXECUTION_FAILED;
    };
    if crate::device_of(stream as usize) != Some(device) {
        complain(
            what,
            &format!("stream {stream:p} is not a stream of GPU {device}, the current context's"),
        );
        return status::EXECUTION_FAILED;
    }
    let items = if count > 1 {
        Items::Strided(bases, strides)
    } else {
        Items::One(bases[0], bases[1], bases[2])
    };
    let ws = (chosen.workspace > 0).then_some((workspace as u64, chosen.workspace));
    queue(what, device, stream as usize, ws, g, items, count)
}
