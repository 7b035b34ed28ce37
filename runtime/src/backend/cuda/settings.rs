//! The CUDA backend's environment settings (`RECIPE_HALF_GEMM`, `RECIPE_CUDA_GRAPHS`,
//! `RECIPE_GEMM_LIBRARY`, `RECIPE_STEP_ASIDE`, `RECIPE_PDL`, `RECIPE_SIDE_STREAM`; docs/cuda.md,
//! "Running on a GPU"): each read once when a GPU opens, an unknown value refused by name.

use super::CudaError;

/// How [`Device::gemm_half`] and [`Device::gemm_batched`] hand their operands, f32 buffers
/// holding fp16/bf16 values, to the tensor cores. Both give the same products (the values
/// convert exactly) with f32 accumulation; which is faster is the GPU's and cuBLAS's to say, so
/// `RECIPE_HALF_GEMM` picks it and `scripts/gpu-throughput.sh` measures both (docs/cuda.md,
/// "Half-precision GEMMs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfOperands {
    /// `pack_half` writes each operand's 16-bit copy (a pass over it: 4 bytes read, 2 written)
    /// and cuBLAS runs its fp16/bf16 GEMM on the copies (`RECIPE_HALF_GEMM=pack`, the default).
    Pack,
    /// cuBLAS reads the f32 operands and converts them itself (`CUBLAS_COMPUTE_32F_FAST_16F` /
    /// `_16BF`: "automatic down-conversion" to fp16/bf16, or to TF32, which holds fp16 and bf16
    /// values exactly too), no pass of ours (`RECIPE_HALF_GEMM=convert`).
    Convert,
}

impl HalfOperands {
    /// `RECIPE_HALF_GEMM`'s choice; `Err` names a value it does not know.
    pub fn from_env() -> Result<HalfOperands, CudaError> {
        Self::parse(std::env::var("RECIPE_HALF_GEMM").ok().as_deref())
    }

    /// The choice a value of `RECIPE_HALF_GEMM` (`None`: unset) makes.
    pub fn parse(v: Option<&str>) -> Result<HalfOperands, CudaError> {
        match v {
            None | Some("" | "pack") => Ok(HalfOperands::Pack),
            Some("convert") => Ok(HalfOperands::Convert),
            Some(other) => Err(CudaError::Setting(format!(
                "RECIPE_HALF_GEMM={other}: expected `pack` (the default) or `convert` (docs/cuda.md, \"Half-precision GEMMs\")"
            ))),
        }
    }
}

/// Whether the device captures passes as CUDA graphs ([`Device::begin_capture`]): yes unless
/// `RECIPE_CUDA_GRAPHS=0`. On by default since they paid on an H200 (1.08× on BERT-base, 1.16×
/// on the main job, the same losses bit for bit: docs/cuda.md, "CUDA graphs"). `Err` names a
/// value it does not know.
pub fn graphs_from_env() -> Result<bool, CudaError> {
    graphs_parse(std::env::var("RECIPE_CUDA_GRAPHS").ok().as_deref())
}

/// The choice a value of `RECIPE_CUDA_GRAPHS` (`None`: unset) makes.
fn graphs_parse(v: Option<&str>) -> Result<bool, CudaError> {
    switch(
        ("RECIPE_CUDA_GRAPHS", v),
        ["1", "0"],
        "`1` (capture, the default) or `0` (direct launches) (docs/cuda.md, \"CUDA graphs\")",
    )
}

/// A two-way setting `(name, value)`: `on` (or unset, or empty) is true, `off` false, and
/// anything else refused by name with what `expected` says.
pub(super) fn switch(
    (name, v): (&str, Option<&str>),
    [on, off]: [&str; 2],
    expected: &str,
) -> Result<bool, CudaError> {
    match v {
        None | Some("") => Ok(true),
        Some(x) if x == on => Ok(true),
        Some(x) if x == off => Ok(false),
        Some(other) => Err(CudaError::Setting(format!(
            "{name}={other}: expected {expected}"
        ))),
    }
}

/// Whether the GEMMs run through cuBLASLt ([`lt`]): yes unless `RECIPE_GEMM_LIBRARY=cublas`,
/// which runs them through cuBLAS's `cublasGemmEx` family as before (for an A/B on a GPU,
/// `scripts/gpu-throughput.sh`). `Err` names a value it does not know.
pub fn lt_from_env() -> Result<bool, CudaError> {
    lt_parse(std::env::var("RECIPE_GEMM_LIBRARY").ok().as_deref())
}

/// The choice a value of `RECIPE_GEMM_LIBRARY` (`None`: unset) makes.
fn lt_parse(v: Option<&str>) -> Result<bool, CudaError> {
    switch(
        ("RECIPE_GEMM_LIBRARY", v),
        ["cublaslt", "cublas"],
        "`cublaslt` (the default) or `cublas` (docs/cuda.md, \"GEMMs\")",
    )
}

/// Whether a step's parameter updates run on the side stream beside the next forward
/// ([`Device::update_aside`]): yes unless `RECIPE_STEP_ASIDE=0` (an A/B for
/// `scripts/gpu-throughput.sh`; docs/cuda.md, "The step beside the forward"). Without a side
/// stream they run on the compute stream either way. `Err` names a value it does not know.
pub fn step_aside_from_env() -> Result<bool, CudaError> {
    step_aside_parse(std::env::var("RECIPE_STEP_ASIDE").ok().as_deref())
}

/// The choice a value of `RECIPE_STEP_ASIDE` (`None`: unset) makes.
fn step_aside_parse(v: Option<&str>) -> Result<bool, CudaError> {
    switch(
        ("RECIPE_STEP_ASIDE", v),
        ["1", "0"],
        "`1` (the optimizer's step beside the next forward, the default) or `0` (before it) (docs/cuda.md, \"The step beside the forward\")",
    )
}

/// Whether a step by segments puts off the word embeddings' update to the next micro-batch,
/// the rows its tokens name updated before its forward and the rest beside it
/// (`RECIPE_ROWS_FIRST=1`; `Kernels::with_rows_first`, docs/cuda.md, "The step beside the
/// forward"): off by default until timed (an A/B for `scripts/gpu-throughput.sh`). `Err` names
/// a value it does not know.
pub fn rows_first_from_env() -> Result<bool, CudaError> {
    rows_first_parse(std::env::var("RECIPE_ROWS_FIRST").ok().as_deref())
}

/// The choice a value of `RECIPE_ROWS_FIRST` (`None`: unset) makes.
fn rows_first_parse(v: Option<&str>) -> Result<bool, CudaError> {
    let whole = switch(
        ("RECIPE_ROWS_FIRST", v),
        ["0", "1"],
        "`0` (the word embeddings' step whole before the next forward, the default) or `1` (the rows the next micro-batch names first, the rest beside its forward) (docs/cuda.md, \"The step beside the forward\")",
    )?;
    Ok(!whole)
}

/// How our kernels are launched (`RECIPE_PDL`; docs/cuda.md, "Programmatic dependent
/// launch"; off by default until timed: A/Bs for `scripts/gpu-throughput.sh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdl {
    /// Each after the kernel ahead of it in its stream has finished (`0`, the default).
    Off,
    /// As programmatic dependent launches on sm_90 and newer (`1`): a kernel may be scheduled
    /// while the kernel ahead of it finishes (its blocks exiting), and waits for it in its
    /// first statement (`GRID_WAIT` in common.cuh).
    On,
    /// As `On`, and each kernel signals right after that wait that the next may be scheduled
    /// (`early`: `griddepcontrol.launch_dependents`, the program compiled with
    /// `RECIPE_PDL_EARLY`), so that the next kernel's blocks take the SMs the last of this
    /// one's leave, instead of being launched once those have exited.
    Early,
}

impl Pdl {
    /// Whether kernels go as programmatic dependent launches.
    pub fn launches(self) -> bool {
        self != Pdl::Off
    }
}

/// [`Pdl`]'s choice. `Err` names a value it does not know.
pub fn pdl_from_env() -> Result<Pdl, CudaError> {
    pdl_parse(std::env::var("RECIPE_PDL").ok().as_deref())
}

/// The choice a value of `RECIPE_PDL` (`None`: unset) makes.
fn pdl_parse(v: Option<&str>) -> Result<Pdl, CudaError> {
    match v {
        None | Some("") | Some("0") => Ok(Pdl::Off),
        Some("1") => Ok(Pdl::On),
        Some("early") => Ok(Pdl::Early),
        Some(other) => Err(CudaError::Setting(format!(
            "RECIPE_PDL={other}: expected `0` (each kernel launched after the one ahead of it, the default), `1` (programmatic dependent launches on sm_90 and newer) or `early` (those, each kernel letting the next be scheduled once it has waited) (docs/cuda.md, \"Programmatic dependent launch\")"
        ))),
    }
}

/// Where [`Device::aside`]'s work runs (`RECIPE_SIDE_STREAM`; docs/cuda.md, "GEMMs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideStream {
    /// On a second stream, behind the compute stream: with CUDA graphs the compute and copy
    /// streams get a higher priority than the side stream's default one (kernel nodes keep
    /// their stream's priority from the capture: `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`),
    /// so the block scheduler starts the critical path's pending blocks first and the side
    /// stream's fill the SMs left over (`1`, the default).
    Behind,
    /// On a second stream of the same priority (`equal`, for an A/B on a GPU).
    Equal,
    /// On the compute stream (`0`).
    Off,
}

/// [`SideStream`]'s choice (`scripts/gpu-throughput.sh` times each). `Err` names a value it
/// does not know.
pub fn side_from_env() -> Result<SideStream, CudaError> {
    side_parse(std::env::var("RECIPE_SIDE_STREAM").ok().as_deref())
}

/// The choice a value of `RECIPE_SIDE_STREAM` (`None`: unset) makes.
fn side_parse(v: Option<&str>) -> Result<SideStream, CudaError> {
    match v {
        None | Some("" | "1") => Ok(SideStream::Behind),
        Some("equal") => Ok(SideStream::Equal),
        Some("0") => Ok(SideStream::Off),
        Some(other) => Err(CudaError::Setting(format!(
            "RECIPE_SIDE_STREAM={other}: expected `1` (weight gradients on a second stream behind the compute stream, the default), `equal` (a second stream of the same priority) or `0` (one stream) (docs/cuda.md, \"GEMMs\")"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::compile;
    use super::*;

    /// Graphs are on unless `RECIPE_CUDA_GRAPHS=0`; another value is refused by name.
    #[test]
    fn graphs_are_on_unless_turned_off() {
        assert!(graphs_parse(None).unwrap());
        assert!(graphs_parse(Some("")).unwrap());
        assert!(!graphs_parse(Some("0")).unwrap());
        assert!(graphs_parse(Some("1")).unwrap());
        let e = graphs_parse(Some("yes")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_CUDA_GRAPHS=yes: expected `1`"), "{e}");
    }

    /// GEMMs run on cuBLASLt unless `RECIPE_GEMM_LIBRARY=cublas`; another value is refused by
    /// name.
    #[test]
    fn gemms_run_on_cublaslt_unless_told_cublas() {
        assert!(lt_parse(None).unwrap());
        assert!(lt_parse(Some("")).unwrap());
        assert!(lt_parse(Some("cublaslt")).unwrap());
        assert!(!lt_parse(Some("cublas")).unwrap());
        let e = lt_parse(Some("lt")).unwrap_err().to_string();
        assert!(
            e.contains("RECIPE_GEMM_LIBRARY=lt: expected `cublaslt`"),
            "{e}"
        );
    }

    /// Weight gradients go to a second stream unless `RECIPE_SIDE_STREAM=0`; another value is
    /// refused by name.
    #[test]
    fn weight_gradients_go_aside_unless_told_0() {
        assert_eq!(side_parse(None).unwrap(), SideStream::Behind);
        assert_eq!(side_parse(Some("")).unwrap(), SideStream::Behind);
        assert_eq!(side_parse(Some("1")).unwrap(), SideStream::Behind);
        assert_eq!(side_parse(Some("equal")).unwrap(), SideStream::Equal);
        assert_eq!(side_parse(Some("0")).unwrap(), SideStream::Off);
        let e = side_parse(Some("off")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_SIDE_STREAM=off: expected `1`"), "{e}");
    }

    /// A step's updates go beside the next forward unless `RECIPE_STEP_ASIDE=0`; another value
    /// is refused by name.
    #[test]
    fn the_step_goes_aside_unless_told_0() {
        assert_eq!(pdl_parse(None).unwrap(), Pdl::Off);
        assert_eq!(pdl_parse(Some("0")).unwrap(), Pdl::Off);
        assert_eq!(pdl_parse(Some("1")).unwrap(), Pdl::On);
        assert_eq!(pdl_parse(Some("early")).unwrap(), Pdl::Early);
        assert!(Pdl::Early.launches() && Pdl::On.launches() && !Pdl::Off.launches());
        // The early signal is compiled in for sm_90 and newer only.
        assert!(
            compile::early_for("sm_90", Pdl::Early) && compile::early_for("sm_100a", Pdl::Early)
        );
        assert!(!compile::early_for("sm_80", Pdl::Early) && !compile::early_for("sm_90", Pdl::On));
        let e = pdl_parse(Some("on")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_PDL=on") && e.contains("`early`"), "{e}");
        assert!(step_aside_parse(None).unwrap());
        assert!(step_aside_parse(Some("1")).unwrap());
        assert!(!step_aside_parse(Some("0")).unwrap());
        let e = step_aside_parse(Some("no")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_STEP_ASIDE=no: expected `1`"), "{e}");
    }

    /// The word embeddings' rows first only with `RECIPE_ROWS_FIRST=1`; another value is
    /// refused by name.
    #[test]
    fn the_rows_go_first_only_when_told_1() {
        assert!(!rows_first_parse(None).unwrap());
        assert!(!rows_first_parse(Some("")).unwrap());
        assert!(!rows_first_parse(Some("0")).unwrap());
        assert!(rows_first_parse(Some("1")).unwrap());
        let e = rows_first_parse(Some("yes")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_ROWS_FIRST=yes: expected `0`"), "{e}");
    }

    /// Unset or empty packs; `convert` converts in cuBLAS; anything else is refused by name.
    #[test]
    fn half_gemm_setting_parses_its_two_values_and_names_a_third() {
        assert_eq!(HalfOperands::parse(None), Ok(HalfOperands::Pack));
        assert_eq!(HalfOperands::parse(Some("")), Ok(HalfOperands::Pack));
        assert_eq!(HalfOperands::parse(Some("pack")), Ok(HalfOperands::Pack));
        assert_eq!(
            HalfOperands::parse(Some("convert")),
            Ok(HalfOperands::Convert)
        );
        let e = HalfOperands::parse(Some("tf32")).unwrap_err().to_string();
        assert!(
            e.starts_with("RECIPE_HALF_GEMM=tf32: expected `pack` (the default) or `convert`"),
            "{e}"
        );
    }
}
