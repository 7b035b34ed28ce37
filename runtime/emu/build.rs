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
    cc::Build::new()
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
