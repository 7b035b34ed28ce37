//! GEMMs through cuBLASLt (`cublasLtMatmul`), with cuBLAS's `cublasGemmEx` family behind them
//! where cuBLASLt has no algorithm for a GEMM (docs/cuda.md, "GEMMs").
//!
//! A GEMM's shape, types, batch and pointer alignments make a [`Shape`]. Its first call creates
//! the matmul descriptor and the three layouts and asks cuBLASLt's heuristic for an algorithm
//! (`cublasLtMatmulAlgoGetHeuristic`: its first answer, or with `RECIPE_GEMM_ALGO=fastest` the
//! one [`super::gemm_choice`] chose among its answers); later calls reuse them. Those are host
//! objects only: nothing is allocated on the GPU and nothing is asked of a stream, so a first
//! call may come during a CUDA graph's capture. The heuristic answers the same for the same
//! shape on the same GPU, library and workspace, so a GEMM gets the same algorithm, and the
//! same bits, run after run, as with `cublasGemmEx` (which asks the same heuristic inside).
//!
//! Two preferences keep the numerics the CPU's (runtime/src/backend/cpu.rs):
//! - split-K partial sums are added in f32 or not at all
//!   (`CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | _NONE`), never in a 16-bit output's type
//!   (`_INPLACE`, `_OUTPUT_TYPE`), which would round a 16-bit output more than once: cuBLAS's
//!   `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION` ([`super::set_math`]), and what PyTorch
//!   sets when `allow_bf16_reduced_precision_reduction` is off (aten/src/ATen/cuda/CUDABlas.cpp);
//! - each operand's alignment is the one its addresses have (the heuristic otherwise assumes
//!   256 bytes and may pick a kernel that needs them; PyTorch does the same there).
//!
//! No TF32: an f32 GEMM computes in `CUBLAS_COMPUTE_32F`, which cuBLASLt never narrows.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::sys;

use super::gemm::ColMajor;

/// A matrix's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    F16,
    Bf16,
}

impl Elem {
    fn data_type(self) -> sys::cudaDataType {
        match self {
            Elem::F32 => sys::cudaDataType::CUDA_R_32F,
            Elem::F16 => sys::cudaDataType::CUDA_R_16F,
            Elem::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        }
    }

    /// Bytes an element.
    pub fn bytes(self) -> u64 {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }
}

/// How the products are computed: always with f32 accumulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compute {
    /// The operands as they are (fp16/bf16 on the tensor cores, f32 exactly).
    F32,
    /// f32 operands converted to fp16 (or bf16) by cuBLASLt ([`super::HalfOperands::Convert`]).
    Fast16F,
    Fast16Bf,
}

impl Compute {
    fn compute_type(self) -> sys::cublasComputeType_t {
        use sys::cublasComputeType_t as C;
        match self {
            Compute::F32 => C::CUBLAS_COMPUTE_32F,
            Compute::Fast16F => C::CUBLAS_COMPUTE_32F_FAST_16F,
            Compute::Fast16Bf => C::CUBLAS_COMPUTE_32F_FAST_16BF,
        }
    }
}

/// Everything a plan depends on: the column-major call ([`ColMajor`]: its first operand is our
/// `B`, its second our `A`), the first's, the second's and C's types, the batch and the
/// alignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub cm: ColMajor,
    pub types: [Elem; 3],
    pub compute: Compute,
    /// Items of a strided batch (1: one GEMM).
    pub count: usize,
    /// Elements from one item's first, second and C to the next's (0 for one GEMM).
    pub strides: [i64; 3],
    /// The bytes every item's first, second and C are aligned to ([`alignment`]).
    pub align: [u32; 3],
}

/// The largest power of two, at most 256 (what the heuristic assumes unless told), that
/// divides `address` and every `stride` bytes after it.
pub fn alignment(address: u64, stride_bytes: i64) -> u32 {
    let bits = (address | stride_bytes.unsigned_abs() | 256).trailing_zeros();
    1 << bits.min(8)
}

/// Why a GEMM did not run through cuBLASLt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The heuristic has no algorithm for the shape (or refused its descriptors): the caller
    /// runs cuBLAS's call instead. Asked once a shape.
    NoAlgorithm,
    /// `cublasLtMatmul` refused the call (its status): nothing was queued, so the caller may
    /// run it on cuBLAS instead ([`Lt::refuse`]).
    Failed(sys::cublasStatus_t),
}

/// One shape's matmul descriptor and layouts.
pub struct Descs {
    desc: sys::cublasLtMatmulDesc_t,
    /// The first operand's, the second's and C's (also D's: C is overwritten in place).
    layouts: [sys::cublasLtMatrixLayout_t; 3],
}

/// One shape's descriptors and algorithm (the heuristic's first, or the one chosen).
struct Plan {
    descs: Descs,
    cand: Candidate,
}

/// An algorithm the heuristic offers for a shape ([`Lt::candidates`]).
#[derive(Clone, Copy)]
pub struct Candidate {
    algo: sys::cublasLtMatmulAlgo_t,
    /// Workspace bytes it needs.
    pub workspace: usize,
    /// The heuristic's estimate of its waves over the GPU's SMs.
    pub waves: f32,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: created by `Descs::new` and used by no call after this (the device waits for
        // its stream before it drops). Null ones were never created.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = sys::cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.desc.is_null() {
                let _ = sys::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

/// A status as a `Result`.
fn ok(s: sys::cublasStatus_t) -> Result<(), sys::cublasStatus_t> {
    if s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(s)
    }
}

/// `value`'s bytes as an attribute's buffer.
fn attr<T>(value: &T) -> (*const c_void, usize) {
    ((value as *const T).cast(), std::mem::size_of::<T>())
}

impl Plan {
    /// The descriptors of `s`, and the algorithm of rank `rank` among the heuristic's first
    /// `asked` answers for them with at most `workspace` bytes (its first where it offers
    /// fewer).
    fn new(
        handle: sys::cublasLtHandle_t,
        s: &Shape,
        workspace: usize,
        (rank, asked): (usize, usize),
    ) -> Result<Plan, String> {
        let descs = Descs::new(s)?;
        let list = descs.ask(handle, s, workspace, asked.max(rank + 1))?;
        let cand = list.get(rank).copied().unwrap_or(list[0]);
        Ok(Plan { descs, cand })
    }
}

/// `shape` as the key of its choice ([`super::gemm_choice`]): every field, so a shape differing
/// in any is another shape.
pub fn shape_key(shape: &Shape) -> String {
    format!("{shape:?}")
}

impl Shape {
    /// Bytes from C's first element to the end of its last item (the column-major C is
    /// `m × n`, columns `ldc` apart).
    pub fn c_bytes(&self) -> usize {
        let cm = &self.cm;
        let one = if cm.m == 0 || cm.n == 0 {
            0
        } else {
            (cm.n - 1) * cm.ldc + cm.m
        };
        let items = self.count.saturating_sub(1) * self.strides[2].unsigned_abs() as usize;
        (items + one) * self.types[2].bytes() as usize
    }
}

impl Descs {
    /// The descriptor and layouts of `s`.
    pub fn new(s: &Shape) -> Result<Descs, String> {
        let mut plan = Descs {
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
        };
        let cm = &s.cm;
        let err = |what: &'static str| move |e: sys::cublasStatus_t| format!("{what}: {e:?}");
        // SAFETY: every call writes or reads the objects created just before it, with
        // attribute buffers of the attribute's documented type; `plan` destroys what was
        // created if a later call fails.
        unsafe {
            ok(sys::cublasLtMatmulDescCreate(
                &mut plan.desc,
                s.compute.compute_type(),
                sys::cudaDataType::CUDA_R_32F,
            ))
            .map_err(err("cublasLtMatmulDescCreate"))?;
            // cublasOperation_t as int32: CUBLAS_OP_N 0, CUBLAS_OP_T 1.
            let trans = [i32::from(cm.trans_first), i32::from(cm.trans_second)];
            for (a, t) in [
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            ]
            .into_iter()
            .zip(&trans)
            {
                let (p, n) = attr(t);
                ok(sys::cublasLtMatmulDescSetAttribute(plan.desc, a, p, n))
                    .map_err(err("cublasLtMatmulDescSetAttribute"))?;
            }
            // The stored matrices, column-major: the first is k × m (m × k transposed), the
            // second n × k (k × n), C m × n.
            let stored = [
                if cm.trans_first {
                    (cm.k, cm.m, cm.ld_first)
                } else {
                    (cm.m, cm.k, cm.ld_first)
                },
                if cm.trans_second {
                    (cm.n, cm.k, cm.ld_second)
                } else {
                    (cm.k, cm.n, cm.ld_second)
                },
                (cm.m, cm.n, cm.ldc),
            ];
            for (i, &(rows, cols, ld)) in stored.iter().enumerate() {
                ok(sys::cublasLtMatrixLayoutCreate(
                    &mut plan.layouts[i],
                    s.types[i].data_type(),
                    rows as u64,
                    cols as u64,
                    ld as i64,
                ))
                .map_err(err("cublasLtMatrixLayoutCreate"))?;
                if s.count > 1 {
                    use sys::cublasLtMatrixLayoutAttribute_t as L;
                    let count = i32::try_from(s.count).map_err(|_| "batch count".to_string())?;
                    let (p, n) = attr(&count);
                    ok(sys::cublasLtMatrixLayoutSetAttribute(
                        plan.layouts[i],
                        L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        p,
                        n,
                    ))
                    .map_err(err("cublasLtMatrixLayoutSetAttribute"))?;
                    let (p, n) = attr(&s.strides[i]);
                    ok(sys::cublasLtMatrixLayoutSetAttribute(
                        plan.layouts[i],
                        L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        p,
                        n,
                    ))
                    .map_err(err("cublasLtMatrixLayoutSetAttribute"))?;
                }
            }
        }
        Ok(plan)
    }

    /// Up to `max` (at least 1) of the heuristic's algorithms for these descriptors, best first
    /// as it ranks them, each needing at most `workspace` bytes, with the preferences of the
    /// module docs for `s`.
    fn ask(
        &self,
        handle: sys::cublasLtHandle_t,
        s: &Shape,
        workspace: usize,
        max: usize,
    ) -> Result<Vec<Candidate>, String> {
        let mut pref: sys::cublasLtMatmulPreference_t = std::ptr::null_mut();
        // SAFETY: writes one preference, destroyed below.
        ok(unsafe { sys::cublasLtMatmulPreferenceCreate(&mut pref) })
            .map_err(|e| format!("cublasLtMatmulPreferenceCreate: {e:?}"))?;
        // SAFETY: `pref` and the descriptors are live.
        let answer = unsafe { self.ask_with(handle, pref, s, workspace, max.max(1)) };
        // SAFETY: created above, not used after.
        let _ = unsafe { sys::cublasLtMatmulPreferenceDestroy(pref) };
        answer
    }

    /// [`Descs::ask`] with its preference.
    ///
    /// # Safety
    /// `pref` and the descriptors are live.
    unsafe fn ask_with(
        &self,
        handle: sys::cublasLtHandle_t,
        pref: sys::cublasLtMatmulPreference_t,
        s: &Shape,
        workspace: usize,
        max: usize,
    ) -> Result<Vec<Candidate>, String> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        use sys::cublasLtReductionScheme_t as R;
        let set = |a: P, (p, n): (*const c_void, usize)| {
            ok(sys::cublasLtMatmulPreferenceSetAttribute(pref, a, p, n))
                .map_err(|e| format!("cublasLtMatmulPreferenceSetAttribute({a:?}): {e:?}"))
        };
        let bytes = workspace as u64;
        set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, attr(&bytes))?;
        let reductions = R::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32
            | R::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        set(
            P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
            attr(&reductions),
        )?;
        let [first, second, c] = s.align;
        set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, attr(&first))?;
        set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, attr(&second))?;
        set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, attr(&c))?;
        set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, attr(&c))?;
        let mut found: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); max];
        let mut count = 0;
        let [la, lb, lc] = self.layouts;
        let requested = i32::try_from(max).unwrap_or(i32::MAX);
        ok(sys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            self.desc,
            la,
            lb,
            lc,
            lc,
            pref,
            requested,
            found.as_mut_ptr(),
            &mut count,
        ))
        .map_err(|e| format!("cublasLtMatmulAlgoGetHeuristic: {e:?}"))?;
        found.truncate(usize::try_from(count).unwrap_or(0).min(max));
        // The heuristic's order kept; an answer it marks failed, or past the workspace, is
        // left out (the first one's reason is the error when none is left).
        let mut why = "cublasLtMatmulAlgoGetHeuristic: no algorithm".to_string();
        let list: Vec<Candidate> = found
            .iter()
            .filter(|f| match ok(f.state) {
                Err(e) => {
                    why = format!("the heuristic's algorithm: {e:?}");
                    false
                }
                Ok(()) if f.workspaceSize > workspace => {
                    why = format!(
                        "the heuristic's algorithm needs {} bytes of workspace, past the {workspace} it was offered",
                        f.workspaceSize
                    );
                    false
                }
                Ok(()) => true,
            })
            .map(|f| Candidate {
                algo: f.algo,
                workspace: f.workspaceSize,
                waves: f.wavesCount,
            })
            .collect();
        if list.is_empty() {
            return Err(why);
        }
        Ok(list)
    }
}

/// A cuBLASLt handle and its plans, one per [`Shape`] seen (`None`: cuBLASLt has none).
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    /// The workspace every GEMM of the device's compute stream shares (cuBLAS's: the stream
    /// runs its GEMMs one after another; the side stream's pass their own), and its bytes.
    workspace: (u64, usize),
    plans: Mutex<HashMap<Shape, Option<Plan>>>,
    /// The first reason a shape got no plan, for [`Lt::describe`].
    first_refusal: Mutex<Option<String>>,
    version: usize,
    /// The device's name in [`super::gemm_choice`]'s books, with `RECIPE_GEMM_ALGO=fastest`:
    /// a shape's plan takes the algorithm chosen there.
    book: Option<String>,
}

// SAFETY: the handle and descriptors are host objects cuBLASLt lets any thread use; the
// descriptors are only read, and only under `plans`' lock. The handle is used by the owning
// device's calls, which its rank's thread makes.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

impl Lt {
    /// A handle, the GEMMs' workspace at `workspace` (`bytes` long, alive as long as this),
    /// and no plans yet. `Err` says why cuBLASLt cannot be used.
    pub fn new(workspace: u64, bytes: usize) -> Result<Lt, String> {
        // SAFETY: checks that the library loads before cudarc's first call, which would panic.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcublasLt not found".into());
        }
        let mut handle: sys::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: writes one handle.
        ok(unsafe { sys::cublasLtCreate(&mut handle) })
            .map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        // SAFETY: no arguments.
        let version = unsafe { sys::cublasLtGetVersion() };
        Ok(Lt {
            handle,
            workspace: (workspace, bytes),
            plans: Mutex::default(),
            first_refusal: Mutex::new(None),
            version,
            book: None,
        })
    }

    /// From now on a shape's plan takes the algorithm [`super::gemm_choice`] chose for it on
    /// `device` (the GPU, this library and the workspace, which make the heuristic's answers).
    pub fn keep_choices(&mut self, device: String) {
        self.book = Some(device);
    }

    /// This device's book, for `shape`, when a choice is to be made: choices are kept, the
    /// shape has no plan yet and its book no choice.
    pub fn needs_choice(&self, shape: &Shape) -> Option<&str> {
        let device = self.book.as_deref()?;
        let planned = self
            .plans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(shape);
        (!planned && super::gemm_choice::chosen(device, &shape_key(shape)).is_none())
            .then_some(device)
    }

    /// The device's name for choices, with the cuBLASLt version and workspace they depend on.
    pub fn device_key(&self, name: &str, arch: &str) -> String {
        format!(
            "{name}, {arch}, cuBLASLt {}, {}-byte workspace",
            self.version, self.workspace.1
        )
    }

    /// Keeps the first reason a shape went to cuBLAS, for [`Lt::describe`].
    fn note_refusal(&self, shape: &Shape, why: String) {
        let mut first = self.first_refusal.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| format!("{shape:?}: {why}"));
    }

    /// Gives up cuBLASLt for `shape` (its call was refused, `why`): the caller runs it on cuBLAS
    /// from then on, and [`Lt::describe`] counts it.
    pub fn refuse(&self, shape: &Shape, why: String) {
        self.plans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(*shape, None);
        self.note_refusal(shape, why);
    }

    /// `f` of `shape`'s plan, made at its first call (see the module docs); `None` where it has
    /// none. One lookup, under the plans' lock.
    fn with_plan<R>(&self, shape: &Shape, f: impl FnOnce(&Plan) -> R) -> Option<R> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let plan = plans.entry(*shape).or_insert_with(|| {
            // With choices, the list asked as the choice's timing asked it (the rank is a place
            // in that list); without, the heuristic's first alone, as `cublasGemmEx` asks.
            let rank = match self.book.as_deref() {
                Some(d) => {
                    let chosen = super::gemm_choice::chosen(d, &shape_key(shape));
                    (chosen.unwrap_or(0), super::gemm_choice::CANDIDATES)
                }
                None => (0, 1),
            };
            Plan::new(self.handle, shape, self.workspace.1, rank)
                .map_err(|why| self.note_refusal(shape, why))
                .ok()
        });
        plan.as_ref().map(f)
    }

    /// Whether `shape` has a plan: made at its first call (see the module docs).
    pub fn ready(&self, shape: &Shape) -> bool {
        self.with_plan(shape, |_| ()).is_some()
    }

    /// `D = alpha·op(first)·op(second) + beta·C` into `c` (in place, as cuBLAS's calls), on
    /// `stream`.
    ///
    /// # Safety
    /// The operands hold every item's extent for `shape`, with the alignments it states;
    /// `stream` belongs to the context current on the calling thread; `workspace` (`None`: the
    /// handle's) is as long as the handle's and no GEMM on another stream uses it meanwhile. A
    /// shape without a plan ([`Lt::ready`]; made here if not yet) is refused before anything is
    /// queued.
    pub unsafe fn matmul(
        &self,
        shape: &Shape,
        (alpha, beta): (f32, f32),
        [first, second, c]: [u64; 3],
        stream: *mut c_void,
        workspace: Option<u64>,
    ) -> Result<(), Refused> {
        let run = |plan: &Plan| {
            let chosen = (&plan.descs, &plan.cand);
            self.matmul_on(chosen, (alpha, beta), [first, second, c], stream, workspace)
                .map_err(Refused::Failed)
        };
        self.with_plan(shape, run)
            .unwrap_or(Err(Refused::NoAlgorithm))
    }

    /// Up to `max` of the heuristic's algorithms for `shape`, in its order (the first is the
    /// one a plan takes), with the descriptors to run them ([`Lt::matmul_with`]): for measuring
    /// them against each other (`recipe kernels --gemm-candidates`).
    pub fn candidates(&self, shape: &Shape, max: usize) -> Result<(Descs, Vec<Candidate>), String> {
        let descs = Descs::new(shape)?;
        let list = descs.ask(self.handle, shape, self.workspace.1, max)?;
        Ok((descs, list))
    }

    /// [`Lt::matmul`] with a candidate of [`Lt::candidates`] and its descriptors.
    ///
    /// # Safety
    /// As [`Lt::matmul`], for the shape `descs` describes.
    pub unsafe fn matmul_with(
        &self,
        chosen: (&Descs, &Candidate),
        alpha_beta: (f32, f32),
        ptrs: [u64; 3],
        stream: *mut c_void,
    ) -> Result<(), sys::cublasStatus_t> {
        self.matmul_on(chosen, alpha_beta, ptrs, stream, None)
    }

    /// [`Lt::matmul_with`] with the workspace at `workspace` (as long as the handle's; `None`:
    /// the handle's), for a GEMM on another stream than the one the handle's workspace serves.
    unsafe fn matmul_on(
        &self,
        (descs, cand): (&Descs, &Candidate),
        (alpha, beta): (f32, f32),
        [first, second, c]: [u64; 3],
        stream: *mut c_void,
        workspace: Option<u64>,
    ) -> Result<(), sys::cublasStatus_t> {
        let [la, lb, lc] = descs.layouts;
        ok(sys::cublasLtMatmul(
            self.handle,
            descs.desc,
            (&alpha as *const f32).cast(),
            first as *const c_void,
            la,
            second as *const c_void,
            lb,
            (&beta as *const f32).cast(),
            c as *const c_void,
            lc,
            c as *mut c_void,
            lc,
            &cand.algo,
            workspace.unwrap_or(self.workspace.0) as *mut c_void,
            cand.workspace,
            stream as sys::cudaStream_t,
        ))
    }

    /// "cuBLASLt 130100" and, if some shape ran on cuBLAS instead, how many and the first
    /// reason.
    pub fn describe(&self) -> String {
        let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let refused = plans.values().filter(|p| p.is_none()).count();
        let mut s = format!("cuBLASLt {}", self.version);
        if let Some(d) = &self.book {
            s += &format!(
                " (the fastest algorithms: {} shapes chosen)",
                super::gemm_choice::known(d)
            );
        }
        if refused > 0 {
            let first = self.first_refusal.lock().unwrap_or_else(|p| p.into_inner());
            s += &format!(
                " ({refused} of {} GEMM shapes on cuBLAS: {})",
                plans.len(),
                first.as_deref().unwrap_or("?")
            );
        }
        s
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // SAFETY: created in `new`; its plans are destroyed just above, and nothing uses it
        // after this.
        let _ = unsafe { sys::cublasLtDestroy(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_dividing_every_item() {
        assert_eq!(alignment(0x1000, 0), 256);
        assert_eq!(alignment(0x1000, 768 * 2), 256);
        assert_eq!(alignment(0x1002, 0), 2);
        assert_eq!(alignment(0x1000, 3 * 2), 2);
        assert_eq!(alignment(0x1010, 4096), 16);
        assert_eq!(alignment(0x1000, -8), 8);
    }
}
