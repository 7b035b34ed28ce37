//! `recipe lsp`: the language server on stdio (src/lsp/).

use std::path::Path;
use std::time::Duration;

use super::{RecipeFlags, OK, USAGE};

pub fn run(debounce_ms: u64, flags: &RecipeFlags) -> i32 {
    // Every document gets its own directory as the base for relative paths (src/lsp/mod.rs).
    let options = match flags.options(Path::new("-")) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    let config = recipe::lsp::Config {
        options,
        debounce: Duration::from_millis(debounce_ms),
        ..Default::default()
    };
    match recipe::lsp::run_stdio(config) {
        Ok(()) => OK,
        Err(e) => {
            eprintln!("error: language server: {e}");
            USAGE
        }
    }
}
