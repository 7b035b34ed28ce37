//! Whether this machine can run the CUDA backend, found without a call that could panic
//! (cudarc panics when a library it calls is missing): the driver, a GPU, the driver's CUDA
//! version, NVRTC and cuBLAS; and [`CudaError`], what the backend says when it cannot run.

use cudarc::driver::{result as drv, sys as drv_sys};

use super::compile;

/// Why the CUDA backend cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// libcuda.so.1 cannot be loaded.
    #[error("no CUDA driver (libcuda.so.1) found; use --device cpu")]
    NoDriver,
    /// The driver loads but reports no device.
    #[error("the CUDA driver reports no GPU; use --device cpu")]
    NoDevice,
    /// The driver is older than the CUDA 13 the kernels and cuBLAS are built for.
    #[error(
        "the CUDA driver supports CUDA {0}.{1}; the kernels (NVRTC 13.0) and cuBLAS 13 need CUDA 13.0 or newer (driver 580 or newer): update the driver, or use --device cpu"
    )]
    OldDriver(i32, i32),
    /// libnvrtc cannot be loaded.
    #[error(
        "NVRTC (libnvrtc.so.13) not found: install the pinned wheel (`pip install nvidia-cuda-nvrtc==13.0.88`) and put its nvidia/cu13/lib folder on LD_LIBRARY_PATH (docs/cuda.md)"
    )]
    NoNvrtc,
    /// libcublas cannot be loaded.
    #[error(
        "cuBLAS (libcublas.so.13) not found: install `nvidia-cublas` and put its nvidia/cu13/lib folder on LD_LIBRARY_PATH (docs/cuda.md)"
    )]
    NoCublas,
    /// NVRTC refused the kernels (the log says where).
    #[error("the CUDA kernels did not compile: {0}")]
    Compile(String),
    /// A driver or cuBLAS call failed.
    #[error("CUDA: {0}")]
    Driver(String),
    /// An environment setting of the CUDA backend has a value it does not know.
    #[error("{0}")]
    Setting(String),
}

/// What this machine offers, without touching anything that could panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// libcuda loads.
    pub driver: bool,
    /// GPUs the driver reports (0 without a driver).
    pub devices: usize,
    /// The CUDA version the driver supports, as `cuDriverGetVersion` gives it (13000 for 13.0;
    /// 0 without a driver).
    pub driver_version: i32,
    /// libnvrtc loads.
    pub nvrtc: bool,
    /// libcublas loads.
    pub cublas: bool,
}

/// Looks for the driver, GPUs, NVRTC and cuBLAS.
pub fn probe() -> Probe {
    // SAFETY: each check only tries to dlopen a library by its candidate names.
    let driver = unsafe { drv_sys::is_culib_present() };
    let init = driver && drv::init().is_ok();
    let devices = if init {
        drv::device::get_count().map_or(0, |n| n.max(0) as usize)
    } else {
        0
    };
    let mut driver_version = 0;
    if init {
        // SAFETY: the driver is loaded and initialised; the call writes one int.
        let r = unsafe { drv_sys::cuDriverGetVersion(&mut driver_version) };
        if r != drv_sys::CUresult::CUDA_SUCCESS {
            driver_version = 0;
        }
    }
    Probe {
        driver,
        devices,
        driver_version,
        nvrtc: compile::nvrtc_present(),
        cublas: unsafe { cudarc::cublas::sys::is_culib_present() },
    }
}

/// Everything a run needs, or the first thing missing.
pub fn require() -> Result<Probe, CudaError> {
    let p = probe();
    if !p.driver {
        return Err(CudaError::NoDriver);
    }
    if p.devices == 0 {
        return Err(CudaError::NoDevice);
    }
    if p.driver_version < 13000 {
        let v = p.driver_version;
        return Err(CudaError::OldDriver(v / 1000, v % 1000 / 10));
    }
    if !p.nvrtc {
        return Err(CudaError::NoNvrtc);
    }
    if !p.cublas {
        return Err(CudaError::NoCublas);
    }
    Ok(p)
}
