//! NVRTC: the kernel program (runtime/kernels/, one translation unit) to PTX and CUBIN.
//!
//! The same path serves a run (CUBIN for the device's own architecture, so a driver older than
//! the NVRTC never has to JIT a newer PTX ISA: ../../docs/cuda.md, "Versions") and the compile
//! gate (`recipe kernels`, scripts/check-kernels.sh: NVRTC's own assembly of that CUBIN reports
//! registers and spills per kernel).

use std::ffi::{c_char, CStr, CString};

use cudarc::nvrtc::{result, sys};

use super::CudaError;
use crate::backend::kernels;

/// One compiled program.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The architecture, e.g. `sm_90`.
    pub arch: String,
    /// PTX text.
    pub ptx: String,
    /// The device binary for `arch`.
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings), empty when clean; for [`compile_fresh`], also ptxas's report of
    /// each kernel ([`super::ptxas::parse`]).
    pub log: String,
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Compile(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// The options every compile uses: header-free kernels, C++17, IEEE division and square root
/// (the CPU reference's), fused multiply-add allowed (as PyTorch's kernels build), NVRTC's
/// optimizations on every core (`--split-compile=0`: the program's 45 kernels, 10.9 MB of PTX,
/// took 20.1 s for sm_90 on 2 cores and take 13.1 s; the PTX is the same whatever the number
/// of threads, the CUBIN differs only in the option it records); with
/// `early`, `RECIPE_PDL_EARLY` (`GRID_WAIT` in common.cuh then also lets the next kernel be
/// scheduled: `RECIPE_PDL=early`, [`super::Pdl::Early`]).
fn options(arch: &str, early: bool) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
        "--fmad=true".into(),
        "-lineinfo".into(),
        "--split-compile=0".into(),
    ];
    if early {
        o.push("-DRECIPE_PDL_EARLY=1".into());
    }
    o
}

/// Whether `arch`'s program is compiled with the early signal for `pdl` ([`options`]): for
/// `RECIPE_PDL=early` on sm_90 and newer (griddepcontrol is Hopper's; before, the kernels
/// launch in order and the program is the default one).
pub fn early_for(arch: &str, pdl: super::Pdl) -> bool {
    let number = arch
        .trim_start_matches("sm_")
        .trim_end_matches(|c: char| c.is_alphabetic());
    pdl == super::Pdl::Early && number.parse::<u32>().is_ok_and(|n| n >= 90)
}

/// Compiles every kernel for `arch` (`sm_80`, `sm_90`, …), `early` as [`options`]: PTX, and a
/// CUBIN for that architecture. A compile error comes back with NVRTC's log. With `report`, the
/// assembler NVRTC runs for the CUBIN writes its `-v` report (registers, shared memory, stack,
/// spills per kernel) into the log: the gate's figures are those of the CUBIN a run loads, for
/// no second assembly (which took a quarter of the gate's time).
pub fn compile(arch: &str, early: bool, report: bool) -> Result<Compiled, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let src = CString::new(kernels::program()).expect("kernel sources contain no NUL");
    let name = CString::new("recipe_kernels.cu").expect("no NUL");
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| CudaError::Compile(format!("nvrtcCreateProgram: {e:?}")))?;
    let mut opts = options(arch, early);
    if report {
        // Changes what is printed, not what is assembled.
        opts.push("--ptxas-options=-v".into());
    }
    // SAFETY: `prog` is a live program; the options outlive the call.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let log = program_log(prog);
    let out = match compiled {
        Err(e) => Err(CudaError::Compile(format!(
            "NVRTC ({e:?}) for {arch}:\n{log}"
        ))),
        // A closure, so that a failed getter still reaches the program's release below.
        Ok(()) => (|| {
            // SAFETY: the program compiled; both getters fill buffers of the sizes NVRTC reports.
            let ptx = unsafe { result::get_ptx(prog) }
                .map_err(|e| CudaError::Compile(format!("nvrtcGetPTX: {e:?}")))?;
            let ptx = unsafe { CStr::from_ptr(ptx.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            let cubin = get_cubin(prog)?;
            Ok(Compiled {
                arch: arch.to_string(),
                ptx,
                cubin,
                log: log.trim().to_string(),
            })
        })(),
    };
    // SAFETY: destroys the program created above, once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// [`compile`] once per architecture per process: a run on several GPUs of one kind opens each
/// with the same program, and NVRTC takes seconds for it. Across processes too when the disk
/// cache is on ([`super::kernel_cache`]).
pub fn compile_cached(arch: &str, early: bool) -> Result<std::sync::Arc<Compiled>, CudaError> {
    once_per_process(arch, early, true)
}

/// [`compile`] now, whatever the disk cache holds, and neither read from it nor written to it,
/// with ptxas's report in the log: the compile gate (`recipe kernels`), which proves that NVRTC
/// compiles the program and reads each kernel's registers and spills. Kept for
/// the rest of the process, as [`compile_cached`] keeps its program (the self-test's device
/// opens with it).
pub fn compile_fresh(arch: &str, early: bool) -> Result<std::sync::Arc<Compiled>, CudaError> {
    once_per_process(arch, early, false)
}

fn once_per_process(
    arch: &str,
    early: bool,
    disk: bool,
) -> Result<std::sync::Arc<Compiled>, CudaError> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    /// One program's slot, locked while it compiles: a second device of the same kind waits for
    /// the first's program, while another architecture's compiles beside it (`recipe kernels`
    /// compiles its architectures at once).
    type Slot = Arc<Mutex<Option<Arc<Compiled>>>>;
    static DONE: OnceLock<Mutex<HashMap<(String, bool), Slot>>> = OnceLock::new();
    let slot = DONE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((arch.to_string(), early))
        .or_default()
        .clone();
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = slot.as_ref() {
        return Ok(c.clone());
    }
    let c = if disk {
        let opts = options(arch, early);
        let key = super::kernel_cache::key(arch, nvrtc_version()?, &opts, &kernels::program());
        match super::kernel_cache::get(arch, &key) {
            Some(c) => c,
            None => {
                let c = compile(arch, early, false)?;
                super::kernel_cache::put(&c, &key);
                c
            }
        }
    } else {
        compile(arch, early, true)?
    };
    let c = Arc::new(c);
    *slot = Some(c.clone());
    Ok(c)
}

fn program_log(prog: sys::nvrtcProgram) -> String {
    // SAFETY: `prog` is live; the buffer has the size NVRTC reports.
    match unsafe { result::get_program_log(prog) } {
        Ok(buf) => unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
        Err(e) => format!("(no log: {e:?})"),
    }
}

fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, CudaError> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled for a real architecture (sm_XY), so it has a CUBIN.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| CudaError::Compile(format!("nvrtcGetCUBINSize: {e:?}")))?;
    let mut buf = vec![0u8; size];
    unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(|e| CudaError::Compile(format!("nvrtcGetCUBIN: {e:?}")))?;
    Ok(buf)
}
