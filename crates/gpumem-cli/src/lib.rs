//! The `gpumem` command as a library, for programs that run it in-process (the Python
//! package's `python -m gpumem`): [`run_from`] is the binary's `main` with the arguments
//! given. The command is `main.rs`, included here whole so that the binary and this library are
//! one code.

// The binary's `main` is unused here; the binary target checks the same code for dead code.
#![allow(dead_code)]

include!("main.rs");
