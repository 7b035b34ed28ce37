//! A row-major [`Gemm`] as the column-major call cuBLAS takes.
//!
//! A row-major `r × c` matrix with row stride `ld` is, to a column-major library, its transpose
//! (`c × r`, leading dimension `ld`). So `C = op(A)·op(B)` in row-major is
//! `Cᵀ = op(B)ᵀ·op(A)ᵀ` in column-major: swap the operands and keep each one's transpose flag.

use cudarc::cublas::sys::cublasOperation_t;

use crate::backend::Gemm;

/// A transpose flag as cuBLAS's operation.
pub fn op(transposed: bool) -> cublasOperation_t {
    if transposed {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// A dimension or leading dimension as cuBLAS's `int`.
pub fn dim(x: usize) -> i32 {
    i32::try_from(x).expect("GEMM dimension fits an int")
}

/// The arguments of one `cublasSgemm` (column-major), operand order already swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ColMajor {
    /// Transpose the first operand (our `B`).
    pub trans_first: bool,
    /// Transpose the second operand (our `A`).
    pub trans_second: bool,
    /// Rows of the column-major C (= our `n`).
    pub m: usize,
    /// Columns of the column-major C (= our `m`).
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Leading dimension of the first operand (our `ldb`).
    pub ld_first: usize,
    /// Leading dimension of the second operand (our `lda`).
    pub ld_second: usize,
    /// Leading dimension of C.
    pub ldc: usize,
}

/// See the module docs; the first operand of the call is `B`, the second `A`.
pub fn col_major(g: &Gemm) -> ColMajor {
    ColMajor {
        trans_first: g.trans_b,
        trans_second: g.trans_a,
        m: g.n,
        n: g.m,
        k: g.k,
        // cuBLAS refuses a leading dimension of 0 even for an empty operand (lda ≥ max(1,
        // rows)), which a dense GEMM with a zero dimension gets: at least 1, as it reads nothing
        // there (runtime/fake-cuda's cuBLAS checks the rule).
        ld_first: g.ldb.max(1),
        ld_second: g.lda.max(1),
        ldc: g.ldc.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Cpu};

    /// The reference BLAS semantics of `sgemm` (column-major, `C = alpha·op(X)·op(Y) + beta·C`).
    #[allow(clippy::too_many_arguments)]
    fn sgemm_col(
        tx: bool,
        ty: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        x: &[f32],
        ldx: usize,
        y: &[f32],
        ldy: usize,
        beta: f32,
        c: &mut [f32],
        ldc: usize,
    ) {
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f64;
                for p in 0..k {
                    let xv = if tx { x[p + i * ldx] } else { x[i + p * ldx] };
                    let yv = if ty { y[j + p * ldy] } else { y[p + j * ldy] };
                    acc += f64::from(xv) * f64::from(yv);
                }
                let old = if beta == 0.0 {
                    0.0
                } else {
                    beta * c[i + j * ldc]
                };
                c[i + j * ldc] = alpha * acc as f32 + old;
            }
        }
    }

    /// The spans cover every element the CPU's GEMM reads, and no more: an operand truncated to
    /// its span gives the same product, and the element past it is never read (a NaN there
    /// changes nothing).
    /// A GEMM with a zero dimension gets leading dimensions cuBLAS accepts (≥ 1).
    #[test]
    fn an_empty_gemm_has_leading_dimensions_cublas_accepts() {
        for (m, n, k) in [(0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0)] {
            for (ta, tb) in [(false, false), (true, true)] {
                let cm = col_major(&Gemm::dense(m, n, k, ta, tb, 0.0));
                assert!(
                    cm.ld_first >= 1 && cm.ld_second >= 1 && cm.ldc >= 1,
                    "{cm:?}"
                );
            }
        }
    }

    #[test]
    fn operand_spans_are_what_the_product_reads() {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut g = Gemm::dense(3, 4, 5, ta, tb, 0.0);
            g.lda += 2;
            g.ldb += 1;
            let (sa, sb, _) = g.spans();
            let a: Vec<f32> = (0..sa).map(|i| i as f32 * 0.5).collect();
            let b: Vec<f32> = (0..sb).map(|i| 1.0 - i as f32 * 0.25).collect();
            let mut want = vec![0.0f32; g.ldc * g.m];
            Cpu::new(1).gemm(&g, &a, &b, &mut want);
            let (mut a2, mut b2) = (a.clone(), b.clone());
            a2.push(f32::NAN);
            b2.push(f32::NAN);
            let mut got = vec![0.0f32; g.ldc * g.m];
            Cpu::new(1).gemm(&g, &a2, &b2, &mut got);
            assert_eq!(got, want, "ta{ta} tb{tb}");
            // The last element of each span is read: a NaN there shows.
            let (mut a3, mut b3) = (a.clone(), b.clone());
            *a3.last_mut().unwrap() = f32::NAN;
            *b3.last_mut().unwrap() = f32::NAN;
            for (x, y) in [(&a3, &b), (&a, &b3)] {
                let mut c = vec![0.0f32; g.ldc * g.m];
                Cpu::new(1).gemm(&g, x, y, &mut c);
                assert!(c.iter().any(|v| v.is_nan()), "ta{ta} tb{tb}");
            }
        }
        assert_eq!(Gemm::dense(0, 4, 5, false, false, 0.0).spans().0, 0);
    }

    /// A batch's extent is the largest item offset plus an item's span, for batches whose count
    /// is or is not a multiple of the inner count, with either stride the larger, and 0 for an
    /// empty batch or item.
    #[test]
    fn a_batchs_extent_is_its_last_elements_end() {
        use crate::backend::{Batch, Stride};
        for (count, inner) in [(1, 1), (6, 3), (7, 3), (4, 4), (5, 1), (2, 5), (13, 4)] {
            for (outer_s, inner_s) in [(100, 7), (3, 50), (0, 9), (11, 0)] {
                let st = Stride {
                    outer: outer_s,
                    inner: inner_s,
                };
                let b = Batch {
                    count,
                    inner,
                    a: st,
                    b: st,
                    c: st,
                };
                let brute = (0..count).map(|j| b.offset(st, j)).max().unwrap() + 5;
                assert_eq!(b.extent(st, 5), brute, "{b:?}");
                assert_eq!(b.extent(st, 0), 0);
                let none = Batch { count: 0, ..b };
                assert_eq!(none.extent(st, 5), 0);
            }
        }
    }

    #[test]
    fn the_column_major_call_computes_the_row_major_product() {
        let mut seed = 1u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        for (m, n, k) in [(1, 1, 1), (3, 5, 7), (8, 2, 9), (4, 6, 1)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                for beta in [0.0f32, 1.0] {
                    let mut g = Gemm::dense(m, n, k, ta, tb, beta);
                    // Wider strides than the shapes need, as the [CLS]-row GEMMs use.
                    g.lda += 2;
                    g.ldb += 1;
                    g.ldc += 3;
                    g.alpha = 0.5;
                    let a: Vec<f32> = (0..g.lda * m.max(k)).map(|_| next()).collect();
                    let b: Vec<f32> = (0..g.ldb * n.max(k)).map(|_| next()).collect();
                    let c0: Vec<f32> = (0..g.ldc * m).map(|_| next()).collect();
                    let mut want = c0.clone();
                    Cpu::new(1).gemm(&g, &a, &b, &mut want);
                    let cm = col_major(&g);
                    let mut got = c0.clone();
                    sgemm_col(
                        cm.trans_first,
                        cm.trans_second,
                        cm.m,
                        cm.n,
                        cm.k,
                        g.alpha,
                        &b,
                        cm.ld_first,
                        &a,
                        cm.ld_second,
                        beta,
                        &mut got,
                        cm.ldc,
                    );
                    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (x - y).abs() <= 1e-5,
                            "m{m} n{n} k{k} ta{ta} tb{tb} beta{beta}: [{i}] {x} vs {y}"
                        );
                    }
                }
            }
        }
    }
}
