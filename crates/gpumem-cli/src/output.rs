//! What every command prints goes through [`print()`], so that `gpumem … | head` ends quietly:
//! a reader that closes standard output early (EPIPE) ends the command as a success, while any
//! other write error is reported like every other failure.

use std::io::{ErrorKind, Write};

/// Why a command stopped before finishing.
#[derive(Debug)]
pub enum CommandError {
    /// A failure to report: the message printed after `gpumem: `, exit status 2.
    Failed(String),
    /// The reader of standard output went away (a closed pipe): nothing is left to do and
    /// nothing to report, exit status 0.
    OutputClosed,
}

impl From<String> for CommandError {
    fn from(message: String) -> Self {
        CommandError::Failed(message)
    }
}

impl From<std::io::Error> for CommandError {
    /// A broken pipe is [`CommandError::OutputClosed`]; every other error is a failure naming
    /// what went wrong with standard output.
    fn from(error: std::io::Error) -> Self {
        if error.kind() == ErrorKind::BrokenPipe {
            CommandError::OutputClosed
        } else {
            CommandError::Failed(format!("cannot write to standard output: {error}"))
        }
    }
}

/// Prints `text` and a newline to standard output and flushes it.
pub fn print(text: &str) -> Result<(), CommandError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}
