//! Links the `recipe` binary as a position-dependent executable on Linux (glibc): `recipe
//! check` is a short process, and a position-independent one spends about a millisecond at
//! every start in the dynamic loader, applying some 26,000 relocations and copying the pages
//! they touch (README, "Checker speed"). The code is still compiled position-independent, so
//! only the final link differs. Set `RECIPE_PIE=1` when building to keep the default PIE link
//! (address-space randomisation of the executable itself).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RECIPE_PIE");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let pie = !matches!(var("RECIPE_PIE").as_str(), "" | "0");
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" && !pie {
        println!("cargo:rustc-link-arg-bin=recipe=-no-pie");
    }
}
