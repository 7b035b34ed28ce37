//! The progress bar `recipe run` draws on stderr (indicatif): steps, loss, LR, samples/s.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `total` optimizer steps, starting at `done`.
pub fn bar(total: u64, done: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}  (eta {eta})",
        )
        .expect("the template is valid")
        .progress_chars("=> "),
    );
    bar.set_position(done);
    bar
}
