//! `recipe fmt FILE... [--check]`

use std::io::Write;
use std::path::PathBuf;

use recipe::diagnostics::render_human;

use super::{read, style, FAILED, OK, USAGE};

pub fn run(files: &[PathBuf], check: bool) -> i32 {
    let mut code = OK;
    for path in files {
        let Some(file) = read(path) else {
            code = USAGE;
            continue;
        };
        let formatted = match recipe::commands::format::format_source(&file.text) {
            Ok(f) => f,
            Err(diagnostics) => {
                for d in &diagnostics {
                    eprint!("{}", render_human(d, &file, style()));
                }
                eprintln!("{}: not formatted (syntax errors)", file.name);
                code = code.max(FAILED);
                continue;
            }
        };
        if path.as_os_str() == "-" && !check {
            let mut out = std::io::stdout().lock();
            if out.write_all(formatted.as_bytes()).is_err() {
                return USAGE;
            }
            continue;
        }
        if formatted == file.text {
            continue;
        }
        if check {
            eprintln!(
                "{}: not formatted (run `recipe fmt {}`)",
                file.name, file.name
            );
            code = code.max(FAILED);
        } else if let Err(e) = recipe::commands::atomic::write(path, formatted.as_bytes()) {
            eprintln!("error: cannot write `{}`: {e}", path.display());
            code = USAGE;
        } else {
            eprintln!("{}: formatted", file.name);
        }
    }
    code
}
