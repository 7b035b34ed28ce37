//! `recipe diff A.lock B.lock`: what changed between two builds, with where each value came from.
//! Exit 0 when they are the same, 1 when they differ, 2 when a lock cannot be read.

use std::path::Path;

use recipe::emit::lock::{diff, Lock};

use super::{Format, FAILED, OK, USAGE};

fn read(path: &Path) -> Option<Lock> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| eprintln!("error: cannot read `{}`: {e}", path.display()))
        .ok()?;
    serde_json::from_str(&text)
        .map_err(|e| eprintln!("error: `{}` is not a recipe.lock: {e}", path.display()))
        .ok()
}

pub fn run(a: &Path, b: &Path, format: Format) -> i32 {
    let (Some(la), Some(lb)) = (read(a), read(b)) else {
        return USAGE;
    };
    let changes = diff(&la, &lb);
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string(&changes).expect("changes serialize")
        ),
        Format::Human => {
            if la.inputs_sha256 == lb.inputs_sha256 {
                println!("same inputs (sha256 {})", &la.inputs_sha256[..16]);
            }
            for c in &changes {
                let show = |l: &Option<recipe::emit::lock::Locked>| match l {
                    Some(l) => format!("{} ({})", l.value, l.from),
                    None => "(absent)".into(),
                };
                println!("{}\n  - {}\n  + {}", c.key, show(&c.before), show(&c.after));
            }
            if changes.is_empty() {
                println!("no differences");
            }
        }
    }
    if changes.is_empty() {
        OK
    } else {
        FAILED
    }
}
