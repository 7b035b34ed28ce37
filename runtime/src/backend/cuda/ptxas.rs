//! Reading `ptxas -v`: registers, shared memory, stack and spills per kernel, for the compile gate
//! (`recipe kernels --ptxas`, scripts/check-kernels.sh). A spill means a kernel needs more
//! registers than the architecture gives it: slow local-memory traffic, so the gate refuses it.

use std::path::Path;
use std::process::Command;

/// What ptxas reports for one kernel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelReport {
    /// The kernel.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, bytes.
    pub smem: u32,
    /// Stack frame, bytes.
    pub stack: u32,
    /// Spill stores, bytes.
    pub spill_stores: u32,
    /// Spill loads, bytes.
    pub spill_loads: u32,
}

/// The number just before `unit` in `line` (`"24 bytes smem"` → 24 for `"bytes smem"`).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Parses the `-v` output of ptxas (its standard error).
pub fn parse(text: &str) -> Vec<KernelReport> {
    let mut out: Vec<KernelReport> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            out.push(KernelReport {
                name: rest.trim().to_string(),
                ..KernelReport::default()
            });
            continue;
        }
        let Some(k) = out.last_mut() else { continue };
        if line.contains("stack frame") {
            k.stack = number_before(line, "bytes stack frame").unwrap_or(0);
            k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used ") && line.contains("registers") {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.smem = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

/// Assembles `ptx` for `arch` with `ptxas` and reads its report.
pub fn assemble(ptxas: &Path, ptx: &Path, arch: &str) -> Result<Vec<KernelReport>, String> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .args(["-O3", "-v", "-o", "/dev/null"])
        .arg(ptx)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("ptxas failed for {arch}:\n{log}"));
    }
    Ok(parse(&log))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_registers_shared_memory_and_spills() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'layernorm_fwd' for 'sm_90'\n\
ptxas info    : Function properties for layernorm_fwd\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 28 registers, used 1 barriers, 128 bytes smem, 400 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'gelu_fwd' for 'sm_90'\n\
ptxas info    : Function properties for gelu_fwd\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 12 registers, used 0 barriers, 376 bytes cmem[0]\n";
        let r = parse(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelReport {
                name: "layernorm_fwd".into(),
                registers: 28,
                smem: 128,
                stack: 8,
                spill_stores: 4,
                spill_loads: 12,
            }
        );
        assert_eq!(r[1].name, "gelu_fwd");
        assert_eq!((r[1].registers, r[1].smem, r[1].spill_stores), (12, 0, 0));
    }
}
