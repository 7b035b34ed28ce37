//! The [`Device`] trait's GEMMs on a GPU: cuBLASLt first ([`super::lt`], the shape's plan and
//! algorithm), cuBLAS where cuBLASLt has none; half-precision operands packed to 16 bits
//! ([`super::memo`] keeps the packs a later GEMM reads again); batches through a list of
//! operand addresses or a stride.

use std::ffi::c_void;

use cudarc::driver::CudaSlice;

use super::*;

/// Packed operand slots: a GEMM's two, and two more so that the operands a following GEMM
/// reads again (the output gradient of a linear, the input of Q, K and V) are still there
/// ([`memo`]).
pub(super) const PACK_SLOTS: usize = 4;

/// [`Device::gemm_half`]'s packed operands.
pub(super) struct Packs {
    pub(super) memo: Memo,
    pub(super) bufs: Vec<Option<CudaSlice<u16>>>,
}

/// [`Device::gemm_batched`]'s scratch, each grown to the largest seen.
#[derive(Default)]
pub(super) struct Batched {
    /// The operand addresses of the last batch: `A`'s, `B`'s, then `C`'s.
    pub(super) list: Option<CudaSlice<u64>>,
    /// An f32 batch's 16-bit `A`, `B` and `C` widened to f32 (each operand's extent, its
    /// layout kept, so the items' offsets stay the same).
    pub(super) wide: [Option<CudaSlice<f32>>; 3],
}

impl CudaDevice {
    /// Runs a GEMM through cuBLASLt ([`lt`]) and says so, or says it did not: no cuBLASLt
    /// (`RECIPE_GEMM_LIBRARY=cublas`), an empty GEMM (cuBLAS's quick return), no algorithm for
    /// the shape, or a `cublasLtMatmul` that refused the call (a status, nothing queued: the
    /// shape then stays on cuBLAS, and the self-test names it); the caller then runs cuBLAS's
    /// call. `ptrs` are the column-major call's first operand (our `B`), second (our `A`) and
    /// C.
    ///
    /// `direct`: the operands are the caller's buffers, not scratch a later GEMM's packs may
    /// overwrite, so inside an [`Device::aside`] call the GEMM may go to the side stream
    /// ([`CudaDevice::side_lane`]).
    pub(super) fn through_lt(
        &self,
        shape: &lt::Shape,
        g: &Gemm,
        ptrs: [u64; 3],
        name: &'static str,
        direct: bool,
    ) -> bool {
        let Some(lt) = &self.lt else {
            return false;
        };
        if shape.cm.m == 0 || shape.cm.n == 0 || shape.cm.k == 0 {
            return false;
        }
        self.choose_algorithm(lt, shape, (g.alpha, g.beta), ptrs);
        if !lt.ready(shape) {
            return false;
        }
        let (stream, workspace) = match self.side_lane(direct) {
            Some(side) => (
                side.stream.cu_stream(),
                Some(cudarc::driver::DevicePtr::device_ptr(&side.workspace, &side.stream).0),
            ),
            None => (self.stream.cu_stream(), None),
        };
        // SAFETY: the callers check that the operands hold every item's extent for the shape,
        // whose alignments are their addresses' (`lt::alignment`); the stream is this device's
        // (the compute stream, or the side stream with its own workspace, as long as the
        // main one), its context bound by the caller.
        let r = self.timed(name, || unsafe {
            lt.matmul(
                shape,
                (g.alpha, g.beta),
                ptrs,
                stream as *mut c_void,
                workspace,
            )
        });
        match r {
            Ok(()) => true,
            Err(lt::Refused::Failed(e)) => {
                lt.refuse(shape, format!("cublasLtMatmul: {e:?}"));
                false
            }
            // `ready` made the plan, so not reached; cuBLAS would run it.
            Err(lt::Refused::NoAlgorithm) => false,
        }
    }

    /// The address of the half bits of the `n` floats at `src`, and its slot: a slot that
    /// still holds them ([`Memo`]), else the least recently used one but `keep` (grown when
    /// shorter), packed now. Address 0 when that allocation failed (recorded).
    fn pack(
        &self,
        packs: &mut Packs,
        src: u64,
        n: usize,
        half: Dtype,
        keep: &[usize],
    ) -> (u64, usize) {
        let found = packs.memo.find(src, n, half, keep);
        let slot = &mut packs.bufs[found.slot];
        if !found.hit
            && self
                .grow_scratch(slot, n, "an allocation of half operands")
                .is_none()
        {
            packs.memo.forget(found.slot);
            return (0, found.slot);
        }
        let Some(dst) = slot.as_mut() else {
            packs.memo.forget(found.slot);
            return (0, found.slot);
        };
        let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(dst, &self.stream);
        if !found.hit && n > 0 {
            // Writes only the slot: not a write the memo must hear of.
            self.launch_raw(
                "pack_half",
                grid1(n),
                &[Arg::Ptr(ptr), Arg::Ptr(src), int(n), dtype_arg(half)],
            );
        }
        (ptr, found.slot)
    }

    /// [`Device::gemm`] on this GPU.
    pub(super) fn run_gemm(&self, g: &Gemm, a: DevView<'_>, b: DevView<'_>, c: DevViewMut<'_>) {
        let f32s = [a.elem, b.elem, c.elem] == [Dtype::F32; 3];
        assert!(f32s, "an f32 GEMM on a 16-bit buffer");
        if self.failed() {
            return;
        }
        self.bind();
        let cm = gemm::col_major(g);
        let shape = lt::Shape {
            cm,
            types: [lt::Elem::F32; 3],
            compute: lt::Compute::F32,
            count: 1,
            strides: [0; 3],
            align: [b.ptr, a.ptr, c.ptr].map(|p| lt::alignment(p, 0)),
        };
        // The views are live allocations large enough for the shapes (the model checks its
        // shapes before calling).
        if self.through_lt(&shape, g, [b.ptr, a.ptr, c.ptr], "cublasLt gemm f32", true) {
            self.gemm_wrote(c.ptr, g.spans().2);
            return;
        }
        let (op, int) = (gemm::op, gemm::dim);
        // SAFETY: the views are live allocations large enough for the shapes (the model checks
        // its shapes before calling); cuBLAS runs on this device's stream.
        let r = self.timed("cublas gemm f32", || unsafe {
            cudarc::cublas::result::sgemm(
                *self.blas.handle(),
                op(cm.trans_first),
                op(cm.trans_second),
                int(cm.m),
                int(cm.n),
                int(cm.k),
                &g.alpha,
                b.ptr as *const f32,
                int(cm.ld_first),
                a.ptr as *const f32,
                int(cm.ld_second),
                &g.beta,
                c.ptr as *mut f32,
                int(cm.ldc),
            )
        });
        self.gemm_wrote(c.ptr, g.spans().2);
        if let Err(e) = r {
            self.record("cublasSgemm", e);
        }
    }

    /// [`Device::gemm_half`] on this GPU.
    pub(super) fn run_gemm_half(
        &self,
        g: &Gemm,
        a: DevView<'_>,
        b: DevView<'_>,
        c: DevViewMut<'_>,
        half: Dtype,
    ) {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        if self.failed() {
            return;
        }
        self.bind();
        let dtype = match half {
            Dtype::F16 => cudaDataType::CUDA_R_16F,
            // Tensor cores take bf16 from sm_80 (Ampere) on; before, the fp32 GEMM on the same
            // values gives what the f32 accumulation would.
            Dtype::Bf16 if self.major >= 8 => cudaDataType::CUDA_R_16BF,
            Dtype::Bf16 | Dtype::F32 => return self.gemm(g, a, b, c),
        };
        let (span_a, span_b, _) = g.spans();
        assert!(
            span_a <= a.len && span_b <= b.len,
            "GEMM operands shorter than their shapes"
        );
        let sixteen = |elem: Dtype| {
            assert!(elem == Dtype::F32 || elem == half, "a {elem:?} operand");
            elem == half
        };
        let (a16, b16, c16) = (sixteen(a.elem), sixteen(b.elem), sixteen(c.elem));
        let mut packs = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        // The operands as cuBLAS reads them, their type, the compute type and the profile's name.
        // cuBLAS converts the f32 operands itself (HalfOperands::Convert) only when both are
        // f32 and so is the output: it reads both in one type, and writes 16 bits only from
        // 16-bit operands.
        let convert = self.operands == HalfOperands::Convert && !a16 && !b16 && !c16;
        // The profile's names: on cuBLAS, on cuBLASLt.
        let ((pa, pb), operand, compute, (name, lt_name)) = if convert {
            (
                (a.ptr, b.ptr),
                cudaDataType::CUDA_R_32F,
                fast_compute(half),
                if half == Dtype::F16 {
                    ("cublas gemm fp16←f32", "cublasLt gemm fp16←f32")
                } else {
                    ("cublas gemm bf16←f32", "cublasLt gemm bf16←f32")
                },
            )
        } else {
            // A 16-bit buffer is read as it is, an f32 one packed. The same stream runs the
            // packs and the GEMM in order, so the next GEMM's packs cannot overwrite operands
            // this one still reads.
            let (pa, kept) = if a16 {
                (a.ptr, None)
            } else {
                let (p, slot) = self.pack(&mut packs, a.ptr, span_a, half, &[]);
                (p, Some(slot))
            };
            let pb = if b16 {
                b.ptr
            } else {
                let keep: Vec<usize> = kept.into_iter().collect();
                self.pack(&mut packs, b.ptr, span_b, half, &keep).0
            };
            (
                (pa, pb),
                dtype,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                if half == Dtype::F16 {
                    ("cublas gemm fp16", "cublasLt gemm fp16")
                } else {
                    ("cublas gemm bf16", "cublasLt gemm bf16")
                },
            )
        };
        if pa == 0 || pb == 0 {
            return; // out of memory for the packed operands: recorded
        }
        let cm = gemm::col_major(g);
        let lt_operand = lt_elem(operand);
        let shape = lt::Shape {
            cm,
            types: [
                lt_operand,
                lt_operand,
                if c16 { lt_elem(dtype) } else { lt::Elem::F32 },
            ],
            compute: lt_compute(compute),
            count: 1,
            strides: [0; 3],
            align: [pb, pa, c.ptr].map(|p| lt::alignment(p, 0)),
        };
        // The operands hold the spans the shapes read (asserted above).
        let direct = pa == a.ptr && pb == b.ptr;
        if self.through_lt(&shape, g, [pb, pa, c.ptr], lt_name, direct) {
            packs.memo.written(c.ptr, size(c.elem) * g.spans().2 as u64);
            return;
        }
        let (op, int) = (gemm::op, gemm::dim);
        // SAFETY: the operands (packed, or the views themselves) hold the spans the shapes read
        // (asserted above), `c` is a live allocation large enough for the shape; cuBLAS runs on
        // this device's stream. f32 output and accumulation on the tensor cores.
        let r = self.timed(name, || unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op(cm.trans_first),
                op(cm.trans_second),
                int(cm.m),
                int(cm.n),
                int(cm.k),
                (&g.alpha as *const f32).cast(),
                pb as *const c_void,
                operand,
                int(cm.ld_first),
                pa as *const c_void,
                operand,
                int(cm.ld_second),
                (&g.beta as *const f32).cast(),
                c.ptr as *mut c_void,
                // A 16-bit output: the f32 result rounded to nearest even (`st`'s rounding).
                if c16 { dtype } else { cudaDataType::CUDA_R_32F },
                int(cm.ldc),
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        });
        packs.memo.written(c.ptr, size(c.elem) * g.spans().2 as u64);
        if let Err(e) = r {
            self.record("cublasGemmEx", e);
        }
    }

    /// [`Device::gemm_batched`] on this GPU.
    pub(super) fn run_gemm_batched(
        &self,
        g: &Gemm,
        batch: &Batch,
        a: DevView<'_>,
        b: DevView<'_>,
        c: DevViewMut<'_>,
        operands: Dtype,
    ) {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        if self.failed() || batch.count == 0 {
            return;
        }
        self.bind();
        let (span_a, span_b, span_c) = g.spans();
        let ext = (
            batch.extent(batch.a, span_a),
            batch.extent(batch.b, span_b),
            batch.extent(batch.c, span_c),
        );
        assert!(
            ext.0 <= a.len && ext.1 <= b.len && ext.2 <= c.len,
            "batched GEMM operands shorter than their batch"
        );
        // A 16-bit buffer holds the run's half dtype: the operands' in a half batch.
        let sixteen = |elem: Dtype| {
            assert!(
                !elem.is_half() || operands == Dtype::F32 || elem == operands,
                "a {elem:?} operand of a {operands:?} batch"
            );
            elem.is_half()
        };
        let (a16, b16, c16) = (sixteen(a.elem), sixteen(b.elem), sixteen(c.elem));
        let half = match operands {
            Dtype::F16 => Some(cudaDataType::CUDA_R_16F),
            // As in `gemm_half`: bf16 tensor cores from sm_80 on, else the f32 GEMM (whose
            // buffers are all f32 there: 16-bit bf16 buffers need sm_80 too).
            Dtype::Bf16 if self.major >= 8 => Some(cudaDataType::CUDA_R_16BF),
            Dtype::Bf16 | Dtype::F32 => None,
        };
        let f32t = cudaDataType::CUDA_R_32F;
        let mut packs = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        let mut scratch = self.batched.lock().unwrap_or_else(|p| p.into_inner());
        // What cuBLAS reads and writes: addresses, types and element sizes of A, B and C, the
        // compute type, and the f32 room C's results go through to a 16-bit `c`.
        let (ptrs, types, compute, through) = match half {
            // cuBLAS converts f32 operands itself (HalfOperands::Convert) only when nothing is
            // 16-bit: it reads both operands in one type, and writes 16 bits only from 16-bit
            // operands.
            Some(_) if self.operands == HalfOperands::Convert && !(a16 || b16 || c16) => (
                (a.ptr, b.ptr, c.ptr),
                [f32t; 3],
                fast_compute(operands),
                None,
            ),
            // A 16-bit buffer is read as it is, an f32 one packed (the half bits of its extent,
            // the layout kept); a 16-bit `c` gets the results rounded by cuBLAS.
            Some(t) => {
                let (pa, kept) = if a16 {
                    (a.ptr, None)
                } else {
                    let (p, slot) = self.pack(&mut packs, a.ptr, ext.0, operands, &[]);
                    (p, Some(slot))
                };
                let pb = if b16 {
                    b.ptr
                } else {
                    let keep: Vec<usize> = kept.into_iter().collect();
                    self.pack(&mut packs, b.ptr, ext.1, operands, &keep).0
                };
                (
                    (pa, pb, c.ptr),
                    [t, t, if c16 { t } else { f32t }],
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    None,
                )
            }
            // f32 products of 16-bit buffers (the model has none since attention's `ds` is a
            // stored value; `recipe kernels --selftest` checks the path,
            // `stored.gemm_batched_f32`): each through an
            // f32 copy of its extent (widening is exact); a 16-bit `c` gets the f32 results
            // rounded into it afterwards, as the kernels would round an f32 output. Its room
            // starts as `c`'s values unless the batch overwrites them all
            // (`Batch::overwrites_all`).
            None => {
                let mut wide = |i: usize, v: (u64, Dtype), n: usize, fill: bool| -> u64 {
                    let what = "an allocation of f32 GEMM operands";
                    let Some(room) = self.grow_scratch(&mut scratch.wide[i], n, what) else {
                        return 0;
                    };
                    if fill {
                        self.convert_raw((room, Dtype::F32), v, n);
                    }
                    room
                };
                let pa = if a16 {
                    wide(0, (a.ptr, a.elem), ext.0, true)
                } else {
                    a.ptr
                };
                let pb = if b16 {
                    wide(1, (b.ptr, b.elem), ext.1, true)
                } else {
                    b.ptr
                };
                let (pc, through) = if c16 {
                    let room = wide(2, (c.ptr, c.elem), ext.2, !batch.overwrites_all(g));
                    (room, Some(room))
                } else {
                    (c.ptr, None)
                };
                (
                    (pa, pb, pc),
                    [f32t; 3],
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    through,
                )
            }
        };
        if ptrs.0 == 0 || ptrs.1 == 0 || ptrs.2 == 0 {
            return; // out of memory for the packed or widened operands: recorded
        }
        let cm = gemm::col_major(g);
        let (op, dim) = (gemm::op, gemm::dim);
        // The profile's names: on cuBLAS, on cuBLASLt.
        let (name, lt_name) = match (types[0], compute) {
            (cudaDataType::CUDA_R_16F, _) => ("cublas batched fp16", "cublasLt batched fp16"),
            (cudaDataType::CUDA_R_16BF, _) => ("cublas batched bf16", "cublasLt batched bf16"),
            (_, cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16F) => {
                ("cublas batched fp16←f32", "cublasLt batched fp16←f32")
            }
            (_, cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF) => {
                ("cublas batched bf16←f32", "cublasLt batched bf16←f32")
            }
            _ => ("cublas batched f32", "cublasLt batched f32"),
        };
        let lt_shape = |count: usize| lt::Shape {
            cm,
            types: [lt_elem(types[1]), lt_elem(types[0]), lt_elem(types[2])],
            compute: lt_compute(compute),
            count,
            strides: [batch.b.outer, batch.a.outer, batch.c.outer].map(|s| s as i64),
            align: [
                (ptrs.1, batch.b.outer, types[1]),
                (ptrs.0, batch.a.outer, types[0]),
                (ptrs.2, batch.c.outer, types[2]),
            ]
            .map(|(p, s, t)| lt::alignment(p, (s as u64 * lt_elem(t).bytes()) as i64)),
        };
        // A strided batch (one stride per operand) through cuBLASLt; item j's operands start j
        // strides into the operands (or their copies), inside their extents (asserted above).
        let in_lt = batch.inner == 1
            && self.through_lt(
                &lt_shape(batch.count),
                g,
                [ptrs.1, ptrs.0, ptrs.2],
                lt_name,
                (ptrs.0, ptrs.1, ptrs.2) == (a.ptr, b.ptr, c.ptr),
            );
        let r = if in_lt {
            Ok(())
        } else if batch.inner == 1 {
            // One stride per operand (a linear layer's projections of one input, their weight
            // gradients): a strided batch, no address list to write first. A packed or widened
            // copy keeps its operand's layout, so the strides hold for it too.
            let stride = |s: crate::backend::Stride| s.outer as std::ffi::c_longlong;
            // SAFETY: item j's operands start j strides into the operands (or their copies),
            // inside their extents (asserted above); cuBLAS runs on this device's stream. f32
            // accumulation; with half operands, cuBLAS's tensor-core path.
            self.timed(name, || unsafe {
                cudarc::cublas::sys::cublasGemmStridedBatchedEx(
                    *self.blas.handle(),
                    op(cm.trans_first),
                    op(cm.trans_second),
                    dim(cm.m),
                    dim(cm.n),
                    dim(cm.k),
                    (&g.alpha as *const f32).cast(),
                    ptrs.1 as *const c_void,
                    types[1],
                    dim(cm.ld_first),
                    stride(batch.b),
                    ptrs.0 as *const c_void,
                    types[0],
                    dim(cm.ld_second),
                    stride(batch.a),
                    (&g.beta as *const f32).cast(),
                    ptrs.2 as *mut c_void,
                    types[2],
                    dim(cm.ldc),
                    stride(batch.c),
                    dim(batch.count),
                    compute,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .result()
            })
        } else {
            let bytes = |t: cudaDataType| if t == f32t { 4 } else { 2 };
            let sizes = (bytes(types[0]), bytes(types[1]), bytes(types[2]));
            let what = "an allocation of GEMM addresses";
            let Some(list) = self.grow_scratch(&mut scratch.list, 3 * batch.count, what) else {
                return;
            };
            let (l, args) = gemm_pointers(list, ptrs, batch, sizes);
            // Writes only the address list.
            self.launch_raw("gemm_pointers", l, &args);
            let n = batch.count as u64;
            let (list_a, list_b, list_c) = (list, list + 8 * n, list + 16 * n);
            // SAFETY: `gemm_pointers` (queued before, on this stream) wrote every item's
            // addresses into `list`, each inside the operands' extents (asserted above) or their
            // packed or widened copies; cuBLAS runs on this device's stream, and the next
            // batch's addresses are written after this call has read them (stream order). f32
            // accumulation; with half operands, cuBLAS's tensor-core path.
            self.timed(name, || unsafe {
                cudarc::cublas::sys::cublasGemmBatchedEx(
                    *self.blas.handle(),
                    op(cm.trans_first),
                    op(cm.trans_second),
                    dim(cm.m),
                    dim(cm.n),
                    dim(cm.k),
                    (&g.alpha as *const f32).cast(),
                    list_b as *const *const c_void,
                    types[1],
                    dim(cm.ld_first),
                    list_a as *const *const c_void,
                    types[0],
                    dim(cm.ld_second),
                    (&g.beta as *const f32).cast(),
                    list_c as *const *mut c_void,
                    types[2],
                    dim(cm.ldc),
                    dim(batch.count),
                    compute,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .result()
            })
        };
        if let Some(room) = through {
            self.convert_raw((c.ptr, c.elem), (room, Dtype::F32), ext.2);
        }
        packs.memo.written(c.ptr, size(c.elem) * ext.2 as u64);
        if let Err(e) = r {
            self.record(
                if batch.inner == 1 {
                    "cublasGemmStridedBatchedEx"
                } else {
                    "cublasGemmBatchedEx"
                },
                e,
            );
        }
    }

    /// [`Device::reserve_gemm_batched`] on this GPU.
    pub(super) fn run_reserve_gemm_batched(&self, count: usize, wide: usize) {
        let mut scratch = self.batched.lock().unwrap_or_else(|p| p.into_inner());
        self.grow_scratch(
            &mut scratch.list,
            3 * count,
            "an allocation of GEMM addresses",
        );
        if wide > 0 {
            for slot in &mut scratch.wide {
                self.grow_scratch(slot, wide, "an allocation of f32 GEMM operands");
            }
        }
    }

    /// [`Device::reserve_gemm_half`] on this GPU.
    pub(super) fn run_reserve_gemm_half(&self, elems: usize) {
        if self.operands == HalfOperands::Convert {
            return; // nothing packed
        }
        let mut packs = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        for s in 0..packs.bufs.len() {
            let before = packs.bufs[s].as_ref().map(|b| b.len());
            self.grow_scratch(&mut packs.bufs[s], elems, "an allocation of half operands");
            if packs.bufs[s].as_ref().map(|b| b.len()) != before {
                packs.memo.forget(s); // a new buffer: its old contents are gone
            }
        }
    }
}
