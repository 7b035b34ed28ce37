//! The `recipe` command line.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
