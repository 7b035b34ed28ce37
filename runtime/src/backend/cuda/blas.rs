//! cuBLAS's handle set up once per GPU (its workspace, its math mode), and cuBLAS's types as
//! cuBLASLt's ([`super::lt`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::{driver_err, lt, CudaError};
use crate::precision::Dtype;

/// The compute type with which cuBLAS converts f32 operands to `half` itself
/// ([`HalfOperands::Convert`]).
pub(super) fn fast_compute(half: Dtype) -> cudarc::cublas::sys::cublasComputeType_t {
    use cudarc::cublas::sys::cublasComputeType_t as C;
    if half == Dtype::F16 {
        C::CUBLAS_COMPUTE_32F_FAST_16F
    } else {
        C::CUBLAS_COMPUTE_32F_FAST_16BF
    }
}

/// cuBLAS's element type as [`lt::Elem`] (the GEMMs here use these three).
pub(super) fn lt_elem(t: cudarc::cublas::sys::cudaDataType) -> lt::Elem {
    use cudarc::cublas::sys::cudaDataType as T;
    match t {
        T::CUDA_R_16F => lt::Elem::F16,
        T::CUDA_R_16BF => lt::Elem::Bf16,
        _ => lt::Elem::F32,
    }
}

/// cuBLAS's compute type as [`lt::Compute`].
pub(super) fn lt_compute(c: cudarc::cublas::sys::cublasComputeType_t) -> lt::Compute {
    use cudarc::cublas::sys::cublasComputeType_t as C;
    match c {
        C::CUBLAS_COMPUTE_32F_FAST_16F => lt::Compute::Fast16F,
        C::CUBLAS_COMPUTE_32F_FAST_16BF => lt::Compute::Fast16Bf,
        _ => lt::Compute::F32,
    }
}

/// Gives cuBLAS a workspace of its own, allocated once: the size cuBLAS's documentation
/// recommends (`cublasSetWorkspace`: 32 MiB on Hopper, 4 MiB before). Without one cuBLAS
/// allocates its own when it needs it, in the step loop, and inside a CUDA graph's capture
/// once per graph (PyTorch sets one for that reason, pytorch/pytorch#83461).
pub(super) fn set_workspace(
    blas: &cudarc::cublas::CudaBlas,
    stream: &Arc<CudaStream>,
    major: i32,
) -> Result<CudaSlice<u8>, CudaError> {
    let bytes: usize = if major >= 9 { 32 << 20 } else { 4 << 20 };
    let workspace = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(driver_err("cuBLAS's workspace"))?;
    let ptr = cudarc::driver::DevicePtr::device_ptr(&workspace, stream).0;
    // SAFETY: the handle is live, and the workspace a device allocation of `bytes` on its
    // context that outlives it (`CudaDevice` frees it after destroying the handle).
    let status = unsafe {
        cudarc::cublas::sys::cublasSetWorkspace_v2(
            *blas.handle(),
            ptr as *mut std::ffi::c_void,
            bytes,
        )
    };
    if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(CudaError::Driver(format!(
            "cuBLAS's workspace (cublasSetWorkspace): {status:?}"
        )));
    }
    Ok(workspace)
}

/// Sets the handle's math mode to the default's (no TF32: fp32 GEMMs stay exact fp32) with
/// `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`: without it cuBLAS may sum a split-K
/// GEMM's partial results in its fp16/bf16 output type, so a 16-bit output would be rounded
/// more than once, where the CPU rounds the fp32 sum once (docs/cuda.md "16-bit buffers";
/// PyTorch sets the same flag when `allow_fp16_reduced_precision_reduction` is off). Returns
/// cuBLAS's version.
pub(super) fn set_math(blas: &cudarc::cublas::CudaBlas) -> Result<i32, CudaError> {
    use cudarc::cublas::sys;
    let ok = sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
    // SAFETY: the handle is live.
    let status = unsafe {
        sys::cublasSetMathMode(
            *blas.handle(),
            sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
        )
    };
    if status != ok {
        return Err(CudaError::Driver(format!(
            "cuBLAS's math mode (cublasSetMathMode): {status:?}"
        )));
    }
    let mut version = 0;
    // SAFETY: the handle is live; the call writes one int.
    let status = unsafe { sys::cublasGetVersion_v2(*blas.handle(), &mut version) };
    if status != ok {
        return Err(CudaError::Driver(format!(
            "cuBLAS's version (cublasGetVersion): {status:?}"
        )));
    }
    Ok(version)
}
