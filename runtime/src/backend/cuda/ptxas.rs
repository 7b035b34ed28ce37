//! Reading `ptxas -v`, as NVRTC's log holds it when the gate compiles with
//! `--ptxas-options=-v` ([`super::compile::compile_fresh`]): registers, shared memory, stack and
//! spills per kernel, for the compile gate (`recipe kernels`, scripts/check-kernels.sh). A spill
//! means a kernel needs more registers than the architecture gives it: slow local-memory
//! traffic, so the gate refuses it.

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

/// Whether `line` is part of ptxas's `-v` report: its `info` lines and their stack-and-spills
/// continuations (`ptxas         .     0 bytes stack frame, …` in NVRTC's log).
fn is_report(line: &str) -> bool {
    line.starts_with("ptxas info") || line.contains("bytes stack frame")
}

/// `log` without ptxas's report: what NVRTC has to say besides (warnings), trimmed.
pub fn without_report(log: &str) -> String {
    log.lines()
        .filter(|l| !is_report(l))
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
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
        assert_eq!(without_report(log), "");
    }

    /// NVRTC's log: the report's continuation lines as NVRTC writes them, and a warning that
    /// must still be shown.
    #[test]
    fn reads_nvrtc_s_log_and_keeps_its_warnings() {
        let log = "recipe_kernels.cu(12): warning #177-D: variable \"x\" was declared but never referenced\n\
ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
ptxas info    : Function properties for k\n\
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
ptxas info    : Used 255 registers, used 0 barriers\n\
ptxas info    : Compile time = 24.933 ms\n";
        let r = parse(log);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (
                r[0].registers,
                r[0].stack,
                r[0].spill_stores,
                r[0].spill_loads
            ),
            (255, 16, 8, 8)
        );
        assert_eq!(
            without_report(log),
            "recipe_kernels.cu(12): warning #177-D: variable \"x\" was declared but never referenced"
        );
    }
}
