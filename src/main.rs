//! The `recipe` command line.

mod cli;

fn main() {
    // Rust ignores SIGPIPE, so `recipe explain … | head` would panic writing to the closed pipe;
    // the default action ends the process quietly, as other command-line tools do.
    #[cfg(unix)]
    // SAFETY: called first, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(cli::main());
}
