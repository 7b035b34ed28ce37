//! `recipe kernels --gemm-candidates`: the cuBLASLt heuristic's algorithms for BERT-base's
//! training GEMMs (issue 15's goal shape: 32 × 128 tokens, hidden 768, intermediate 3072, bf16),
//! each timed against the heuristic's first — the one a run takes by default ([`super::lt`]).
//! What a choice among them could save a step is the sum over the shapes of their calls a step
//! times the best candidate's gain, and what `RECIPE_GEMM_ALGO=fastest` would take by its rule
//! ([`super::gemm_choice`]) is printed beside it (docs/cuda.md, "GEMMs").

use std::ffi::c_void;

use cudarc::driver::{sys as drv_sys, CudaSlice, DevicePtr};

use super::gemm::col_major;
use super::lt::{self, Compute, Elem};
use super::{CudaDevice, CudaError};
use crate::backend::Gemm;

/// One of the measured GEMMs.
struct Case {
    name: &'static str,
    /// Calls a training step of BERT-base (12 layers; the pooler and head left out).
    per_step: usize,
    gemm: Gemm,
    /// Items of a strided batch (the q/k/v projections and their weight gradients).
    items: usize,
    /// C's type: the 16-bit activations, or the f32 weight gradients.
    c: Elem,
}

/// BERT-base's GEMMs at `tokens` tokens (row-major, as `model/bert.rs` calls them).
fn cases(tokens: usize) -> Vec<Case> {
    let (n, h, i) = (tokens, 768, 3072);
    let fwd = |m, o, k| Gemm::dense(m, o, k, false, true, 0.0);
    let dx = |m, o, k, beta| Gemm::dense(m, o, k, false, false, beta);
    let dw = |o, inp, k| Gemm::dense(o, inp, k, true, false, 1.0);
    let c16 = Elem::Bf16;
    vec![
        Case {
            name: "q/k/v forward (3 items)",
            per_step: 12,
            gemm: fwd(n, h, h),
            items: 3,
            c: c16,
        },
        Case {
            name: "attention output forward",
            per_step: 12,
            gemm: fwd(n, h, h),
            items: 1,
            c: c16,
        },
        Case {
            name: "feed-forward in, forward",
            per_step: 12,
            gemm: fwd(n, i, h),
            items: 1,
            c: c16,
        },
        Case {
            name: "feed-forward out, forward",
            per_step: 12,
            gemm: fwd(n, h, i),
            items: 1,
            c: c16,
        },
        Case {
            name: "dX of q/k/v and output (768←768)",
            per_step: 48,
            gemm: dx(n, h, h, 0.0),
            items: 1,
            c: c16,
        },
        Case {
            name: "dX of feed-forward out (3072←768)",
            per_step: 12,
            gemm: dx(n, i, h, 0.0),
            items: 1,
            c: c16,
        },
        Case {
            name: "dX of feed-forward in (768←3072)",
            per_step: 12,
            gemm: dx(n, h, i, 1.0),
            items: 1,
            c: c16,
        },
        Case {
            name: "dW of q/k/v (3 items)",
            per_step: 12,
            gemm: dw(h, h, n),
            items: 3,
            c: Elem::F32,
        },
        Case {
            name: "dW of attention output",
            per_step: 12,
            gemm: dw(h, h, n),
            items: 1,
            c: Elem::F32,
        },
        Case {
            name: "dW of feed-forward in (3072×768)",
            per_step: 12,
            gemm: dw(i, h, n),
            items: 1,
            c: Elem::F32,
        },
        Case {
            name: "dW of feed-forward out (768×3072)",
            per_step: 12,
            gemm: dw(h, i, n),
            items: 1,
            c: Elem::F32,
        },
    ]
}

/// One candidate of one case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Timing {
    pub case: &'static str,
    pub per_step: usize,
    /// Its place in the heuristic's order (0: the runtime's).
    pub rank: usize,
    pub waves: f32,
    pub workspace: usize,
    /// Mean µs a call.
    pub us: f64,
    /// The first candidate's µs over this one's (above 1: faster than the runtime's).
    pub speedup: f64,
}

/// µs a step the fastest candidate of each GEMM would save in place of its first (rank 0):
/// the difference a call times its calls a step, summed.
pub fn step_saving_us(rows: &[Timing]) -> f64 {
    rows.iter()
        .filter(|first| first.rank == 0)
        .map(|first| {
            let best = rows
                .iter()
                .filter(|r| r.case == first.case)
                .map(|r| r.us)
                .fold(first.us, f64::min);
            (first.us - best) * first.per_step as f64
        })
        .sum()
}

/// µs a step `RECIPE_GEMM_ALGO=fastest` would save by its rule ([`super::gemm_choice::pick`]:
/// another candidate only where it is faster than the first by more than the margin), from
/// these timings: what the run would actually take, where [`step_saving_us`] is the bound.
pub fn fastest_saving_us(rows: &[Timing]) -> f64 {
    rows.iter()
        .filter(|first| first.rank == 0)
        .map(|first| {
            let of_case: Vec<&Timing> = rows.iter().filter(|r| r.case == first.case).collect();
            let most = of_case.iter().map(|r| r.rank).max().unwrap_or(0);
            let mut us = vec![None; most + 1];
            for r in &of_case {
                us[r.rank] = Some(r.us);
            }
            let chosen = super::gemm_choice::pick(&us);
            (first.us - us[chosen].unwrap_or(first.us)) * first.per_step as f64
        })
        .sum()
}

impl CudaDevice {
    /// Times up to `max` heuristic candidates of each of BERT-base's GEMMs at `tokens` tokens,
    /// `reps` calls each after one warm-up call, the first candidate first.
    pub fn gemm_candidates(
        &self,
        tokens: usize,
        max: usize,
        reps: usize,
    ) -> Result<Vec<Timing>, CudaError> {
        let Some(lt) = &self.lt else {
            return Err(CudaError::Setting(
                "--gemm-candidates measures cuBLASLt's algorithms: unset RECIPE_GEMM_LIBRARY"
                    .into(),
            ));
        };
        self.bind();
        let cases = cases(tokens);
        // Operands as large as the largest case: values that are not all zero (bf16 in [1, 2)
        // with varied mantissas), C zeroed.
        let most = |f: fn(&Case) -> usize| cases.iter().map(f).max().unwrap_or(0);
        let len_a = most(|c| c.items * c.gemm.spans().0);
        let len_b = most(|c| c.items * c.gemm.spans().1);
        let len_c = most(|c| c.items * c.gemm.spans().2);
        let fill =
            |n: usize| -> Vec<u16> { (0..n).map(|j| 0x3f80 | (j * 37 % 128) as u16).collect() };
        let err = |what: &'static str| move |e| CudaError::Driver(format!("{what}: {e:?}"));
        let a: CudaSlice<u16> = self
            .stream
            .clone_htod(&fill(len_a))
            .map_err(err("operand A"))?;
        let b: CudaSlice<u16> = self
            .stream
            .clone_htod(&fill(len_b))
            .map_err(err("operand B"))?;
        let c: CudaSlice<f32> = self.stream.alloc_zeros(len_c).map_err(err("output C"))?;
        let pa = a.device_ptr(&self.stream).0;
        let pb = b.device_ptr(&self.stream).0;
        let pc = c.device_ptr(&self.stream).0;
        let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (
            self.ctx.new_event(flags).map_err(err("an event"))?,
            self.ctx.new_event(flags).map_err(err("an event"))?,
        );
        let stream = self.stream.cu_stream() as *mut c_void;
        let mut rows = Vec::new();
        for case in &cases {
            let g = &case.gemm;
            let (sa, sb, sc) = g.spans();
            let shape = lt::Shape {
                cm: col_major(g),
                types: [Elem::Bf16, Elem::Bf16, case.c],
                compute: Compute::F32,
                count: case.items,
                strides: if case.items > 1 {
                    [sb, sa, sc].map(|x| x as i64)
                } else {
                    [0; 3]
                },
                align: [256; 3],
            };
            let (descs, list) = lt
                .candidates(&shape, max)
                .map_err(|why| CudaError::Driver(format!("{}: {why}", case.name)))?;
            // The runtime's (rank 0) is the base; were it to refuse, the next that runs.
            let mut first = None;
            for (rank, cand) in list.iter().enumerate() {
                let run = || {
                    // SAFETY: the operands hold every item's extent (sized for the largest
                    // case), 256-byte aligned as the shape states; this device's stream.
                    unsafe { lt.matmul_with((&descs, cand), (1.0, g.beta), [pb, pa, pc], stream) }
                };
                // A candidate that refuses to run is skipped, not fatal.
                if run().is_err() {
                    continue;
                }
                start.record(&self.stream).map_err(err("an event"))?;
                for _ in 0..reps {
                    run().map_err(|e| CudaError::Driver(format!("{}: {e:?}", case.name)))?;
                }
                end.record(&self.stream).map_err(err("an event"))?;
                self.stream.synchronize().map_err(err("the GEMMs"))?;
                let ms = start.elapsed_ms(&end).map_err(err("an event's time"))?;
                let us = f64::from(ms) * 1e3 / reps.max(1) as f64;
                let base = *first.get_or_insert(us);
                rows.push(Timing {
                    case: case.name,
                    per_step: case.per_step,
                    rank,
                    waves: cand.waves,
                    workspace: cand.workspace,
                    us,
                    speedup: base / us,
                });
            }
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &'static str, per_step: usize, rank: usize, us: f64) -> Timing {
        Timing {
            case,
            per_step,
            rank,
            waves: 1.0,
            workspace: 0,
            us,
            speedup: 1.0,
        }
    }

    /// Each GEMM saves its first's time less its fastest's, times its calls a step; a GEMM
    /// whose first is fastest saves nothing.
    #[test]
    fn the_saving_is_each_gemms_best_gain_times_its_calls() {
        let rows = [
            row("a", 12, 0, 10.0),
            row("a", 12, 1, 8.0),
            row("a", 12, 2, 9.0),
            row("b", 48, 0, 5.0),
            row("b", 48, 1, 6.0),
        ];
        assert_eq!(step_saving_us(&rows), 24.0);
    }

    /// `fastest`'s rule keeps the first unless another is more than 3 % faster: 9.8 against
    /// 10 saves nothing, 8 against 10 saves 2 a call; a refused candidate (no row) is skipped.
    #[test]
    fn fastest_saves_what_its_rule_takes() {
        let rows = [
            row("a", 12, 0, 10.0),
            row("a", 12, 2, 9.8),
            row("b", 48, 0, 10.0),
            row("b", 48, 1, 8.0),
            row("b", 48, 2, 9.0),
        ];
        assert_eq!(fastest_saving_us(&rows), 96.0);
        assert!((step_saving_us(&rows) - (12.0 * 0.2 + 96.0)).abs() < 1e-9);
    }
}
