//! NVRTC (`libnvrtc.so`): a "compile" that checks the program defines every kernel the
//! emulator runs and that an architecture was named, and whose image (CUBIN) and PTX name the
//! kernels for [`crate::driver`]'s modules. The real compile is the compile gate's
//! (scripts/check-kernels.sh); the kernels' CPU builds are runtime/emu's. Asked for ptxas's
//! report (`--ptxas-options=-v`), it writes one in ptxas's form with no registers and no
//! spills, except a spill for each kernel `RECIPE_FAKE_CUDA_SPILLS` names (comma-separated):
//! how a test sees the gate refuse a spill.

use std::ffi::{c_char, c_int, CStr, CString};

/// The first bytes of every image this NVRTC hands out (and the only images `cuModuleLoadData`
/// accepts).
pub const IMAGE: &[u8] = b"RECIPE-FAKE-CUBIN\n";

const SUCCESS: c_int = 0;
const INVALID_INPUT: c_int = 3;
const INVALID_PROGRAM: c_int = 4;
const INVALID_OPTION: c_int = 5;
const COMPILATION: c_int = 6;

/// A program (opaque to callers): its source, then (once compiled) its image, PTX and log.
pub struct Program {
    source: String,
    compiled: Option<(Vec<u8>, CString)>,
    log: CString,
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> c_int {
    *major = 13;
    *minor = 0;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcCreateProgram(
    prog: *mut *mut Program,
    src: *const c_char,
    _name: *const c_char,
    headers: c_int,
    _sources: *const *const c_char,
    _names: *const *const c_char,
) -> c_int {
    if prog.is_null() || src.is_null() || headers < 0 {
        return INVALID_INPUT;
    }
    let source = CStr::from_ptr(src).to_string_lossy().into_owned();
    *prog = Box::into_raw(Box::new(Program {
        source,
        compiled: None,
        log: CString::default(),
    }));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcDestroyProgram(prog: *mut *mut Program) -> c_int {
    if prog.is_null() || (*prog).is_null() {
        return INVALID_PROGRAM;
    }
    drop(Box::from_raw(*prog));
    *prog = std::ptr::null_mut();
    SUCCESS
}

/// Whether `source` defines kernel `name` (`__global__ … name(`).
fn defines(source: &str, name: &str) -> bool {
    source.match_indices(name).any(|(i, _)| {
        let before = &source[..i];
        let after = &source[i + name.len()..];
        after.trim_start().starts_with('(')
            && !before.ends_with(|c: char| c.is_alphanumeric() || c == '_')
            && before
                .rfind("__global__")
                .is_some_and(|g| !before[g..].contains([';', '{', '}']))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcCompileProgram(
    prog: *mut Program,
    count: c_int,
    options: *const *const c_char,
) -> c_int {
    let Some(p) = prog.as_mut() else {
        return INVALID_PROGRAM;
    };
    let options: Vec<String> = (0..count.max(0) as usize)
        .map(|i| {
            CStr::from_ptr(*options.add(i))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let Some(arch) = options.iter().find_map(|o| {
        o.strip_prefix("--gpu-architecture=")
            .or_else(|| o.strip_prefix("-arch="))
    }) else {
        p.log = CString::new("fake NVRTC: no --gpu-architecture given").expect("no NUL");
        return INVALID_OPTION;
    };
    let kernels = recipe_kernel_emu::kernels();
    let missing: Vec<&String> = kernels.iter().filter(|k| !defines(&p.source, k)).collect();
    if !missing.is_empty() {
        p.log = CString::new(format!(
            "fake NVRTC: the program does not define the kernels {missing:?}, which the emulator was built with"
        ))
        .expect("no NUL");
        return COMPILATION;
    }
    let mut image = IMAGE.to_vec();
    image.extend_from_slice(arch.as_bytes());
    image.push(b'\n');
    let ptx = kernels.iter().fold(
        format!("// fake PTX for {arch} (runtime/fake-cuda)\n"),
        |mut s, k| {
            s.push_str(&format!(".entry {k}\n"));
            s
        },
    );
    p.compiled = Some((image, CString::new(ptx).expect("no NUL")));
    let report = options.iter().any(|o| {
        o.strip_prefix("--ptxas-options=")
            .is_some_and(|v| v.split_whitespace().any(|v| v == "-v"))
    });
    p.log = if report {
        CString::new(ptxas_report(arch, &kernels)).expect("no NUL")
    } else {
        CString::default()
    };
    SUCCESS
}

/// ptxas's `-v` report, as NVRTC's log holds it, for `kernels` (see the module's comment).
fn ptxas_report(arch: &str, kernels: &[String]) -> String {
    let spills = std::env::var("RECIPE_FAKE_CUDA_SPILLS").unwrap_or_default();
    let spills: Vec<&str> = spills.split(',').map(str::trim).collect();
    let mut log = String::from("ptxas info    : 0 bytes gmem\n");
    for k in kernels {
        let bytes = if spills.contains(&k.as_str()) { 8 } else { 0 };
        log.push_str(&format!(
            "ptxas info    : Compiling entry function '{k}' for '{arch}'\n\
             ptxas info    : Function properties for {k}\n\
             ptxas         .     {bytes} bytes stack frame, {bytes} bytes spill stores, {bytes} bytes spill loads\n\
             ptxas info    : Used 0 registers, used 0 barriers\n"
        ));
    }
    log
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTXSize(prog: *mut Program, size: *mut usize) -> c_int {
    match prog.as_ref().and_then(|p| p.compiled.as_ref()) {
        Some((_, ptx)) => {
            *size = ptx.as_bytes_with_nul().len();
            SUCCESS
        }
        None => INVALID_PROGRAM,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTX(prog: *mut Program, out: *mut c_char) -> c_int {
    match prog.as_ref().and_then(|p| p.compiled.as_ref()) {
        Some((_, ptx)) => {
            let b = ptx.as_bytes_with_nul();
            std::ptr::copy_nonoverlapping(b.as_ptr() as *const c_char, out, b.len());
            SUCCESS
        }
        None => INVALID_PROGRAM,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBINSize(prog: *mut Program, size: *mut usize) -> c_int {
    match prog.as_ref().and_then(|p| p.compiled.as_ref()) {
        Some((image, _)) => {
            *size = image.len();
            SUCCESS
        }
        None => INVALID_PROGRAM,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBIN(prog: *mut Program, out: *mut c_char) -> c_int {
    match prog.as_ref().and_then(|p| p.compiled.as_ref()) {
        Some((image, _)) => {
            std::ptr::copy_nonoverlapping(image.as_ptr() as *const c_char, out, image.len());
            SUCCESS
        }
        None => INVALID_PROGRAM,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLogSize(prog: *mut Program, size: *mut usize) -> c_int {
    match prog.as_ref() {
        Some(p) => {
            *size = p.log.as_bytes_with_nul().len();
            SUCCESS
        }
        None => INVALID_PROGRAM,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLog(prog: *mut Program, out: *mut c_char) -> c_int {
    match prog.as_ref() {
        Some(p) => {
            let b = p.log.as_bytes_with_nul();
            std::ptr::copy_nonoverlapping(b.as_ptr() as *const c_char, out, b.len());
            SUCCESS
        }
        None => INVALID_PROGRAM,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetErrorString(e: c_int) -> *const c_char {
    match e {
        0 => c"NVRTC_SUCCESS",
        3 => c"NVRTC_ERROR_INVALID_INPUT",
        4 => c"NVRTC_ERROR_INVALID_PROGRAM",
        5 => c"NVRTC_ERROR_INVALID_OPTION",
        6 => c"NVRTC_ERROR_COMPILATION",
        _ => c"NVRTC_ERROR (fake)",
    }
    .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::defines;

    #[test]
    fn a_kernel_is_found_by_its_definition_only() {
        let src = "__global__ void add(float* x) { x[0] += 1; }\nvoid add_host(int);\n";
        assert!(defines(src, "add"));
        assert!(!defines(src, "add_host"), "not a kernel");
        assert!(
            !defines("__global__ void dd(int);", "d"),
            "a name inside another"
        );
        assert!(!defines("__global__ void x(); void y(int);", "y"));
    }
}
