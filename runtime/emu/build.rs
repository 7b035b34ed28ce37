//! Compiles `cpp/launch.cpp` with every `runtime/kernels/*.cu` included, and a table of the
//! kernels (`extern "C" __global__ void NAME(`) read from the sources, so the table cannot miss
//! a kernel the runtime launches.

use std::fmt::Write;
use std::path::Path;

fn main() {
    let kdir = Path::new("../kernels")
        .canonicalize()
        .expect("runtime/kernels");
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    println!("cargo:rerun-if-changed=../kernels");
    println!("cargo:rerun-if-changed=cpp");
    let mut sources: Vec<_> = std::fs::read_dir(&kdir)
        .expect("read runtime/kernels")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    let (mut includes, mut table) = (String::new(), String::new());
    const MARK: &str = "extern \"C\" __global__ void ";
    for src in &sources {
        let text = std::fs::read_to_string(src).expect("read a kernel source");
        let name = src.file_name().unwrap().to_string_lossy();
        writeln!(includes, "#include \"{name}\"").unwrap();
        for (i, _) in text.match_indices(MARK) {
            let rest = &text[i + MARK.len()..];
            if let Some(end) = rest.find('(') {
                writeln!(table, "KERNEL({})", rest[..end].trim()).unwrap();
            }
        }
    }
    std::fs::write(Path::new(&out).join("kernel_includes.inc"), includes).unwrap();
    std::fs::write(Path::new(&out).join("kernel_table.inc"), table).unwrap();
    let mut build = cc::Build::new();
    // Contract `a * b + c` into FMAs as NVRTC does (`--fmad=true`), where the machine has them,
    // so that a kernel whose bit-identity with the CPU a test checks fails it when it leaves
    // such an expression to the compiler instead of writing it with common.cuh's `op_*`
    // (which stay unfused: RECIPE_EMU_CONTRACT). Without FMA (not x86-64, or an old CPU) the
    // emulation cannot fuse, and these tests check less.
    #[cfg(target_arch = "x86_64")]
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && std::is_x86_feature_detected!("fma")
    {
        build
            .flag("-mfma")
            .flag("-ffp-contract=fast")
            .define("RECIPE_EMU_CONTRACT", "1");
    }
    // fp16 ⇄ f32 conversions (`_Float16` casts in common.cuh) as F16C instructions where the
    // machine has them, instead of libgcc's software routines: the same values (exact one way,
    // round to nearest even the other, as the MXCSR the fibers keep), a fifth of the emulated
    // tensor-core products' time before.
    #[cfg(target_arch = "x86_64")]
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && std::is_x86_feature_detected!("f16c")
    {
        build.flag("-mf16c");
    }
    // RECIPE_EMU_SANITIZE=address (scripts/emu-asan.sh): the kernels built with
    // AddressSanitizer, so that every test reports a kernel reading or writing outside a buffer
    // (the test binaries run with GCC's libasan preloaded, which then allocates the Rust side's
    // buffers too, with their redzones).
    println!("cargo:rerun-if-env-changed=RECIPE_EMU_SANITIZE");
    if std::env::var("RECIPE_EMU_SANITIZE").as_deref() == Ok("address") {
        build
            .flag("-fsanitize=address")
            .flag("-fno-omit-frame-pointer");
        println!("cargo:rustc-link-lib=dylib=asan");
    }
    build
        .cpp(true)
        .std("c++20")
        .file("cpp/launch.cpp")
        .include(&out)
        .include("cpp")
        .include(&kdir)
        .flag("-pthread")
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2)
        .compile("recipe_kernel_emu");
}
