//! `gpumem`: a thin command line over the gpumem libraries. It parses, calls the libraries and
//! renders the reports they return (the commands are in the library target, `lib.rs`).

use std::process::ExitCode;

fn main() -> ExitCode {
    gpumem_cli::run_from(std::env::args_os())
}
