//! What every text reader shares: reading a line of bounded length, and the short excerpts of
//! the input that error messages quote (never the whole of a line or value, which may be
//! megabytes).

use std::io::{BufRead, Read};

use crate::error::ReadError;

/// The longest line the line-based readers (native JSON lines, RMM CSV, a pickle's text
/// arguments) accept, without its newline: 1 MiB. Their real lines are under 200 bytes, so
/// this only refuses input that is no trace, before it takes memory. A native trace's header
/// is the exception ([`MAX_HEADER_BYTES`]).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// The longest native header line accepted, without its newline: 256 MiB. The header holds a
/// mid-process trace's whole pool, about 50 bytes per live block (a snapshot of a large job
/// with 50 000 live blocks writes 2.5 MB), so it gets room for millions of blocks.
pub const MAX_HEADER_BYTES: usize = 256 << 20;

/// How many characters of the input an error message quotes.
const EXCERPT_CHARS: usize = 80;
/// How many characters of a parser's message an error message keeps (the parser may quote
/// the input whole, e.g. serde_json's `unknown variant` with a megabyte-long name).
const MESSAGE_CHARS: usize = 300;

/// Reads the next line of `reader` into `line` (cleared first), newline included: the number
/// of bytes read, 0 at the end of the input. A line longer than [`MAX_LINE_BYTES`] is an
/// error ([`ReadError::LineTooLong`], naming `line_number`), found after reading no more
/// than the limit.
pub(crate) fn read_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    line_number: u64,
) -> Result<usize, ReadError> {
    read_line_within(reader, line, line_number, MAX_LINE_BYTES)
}

/// [`read_line`] with a line of up to `limit` bytes.
pub(crate) fn read_line_within(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    line_number: u64,
    limit: usize,
) -> Result<usize, ReadError> {
    line.clear();
    let read = reader.take(limit as u64 + 1).read_until(b'\n', line)?;
    if read > limit && line.last() != Some(&b'\n') {
        return Err(ReadError::LineTooLong {
            line: line_number,
            limit,
        });
    }
    Ok(read)
}

/// `text` quoted as Rust's `{:?}` does, cut to its first 80 characters when longer, with
/// how long it was: `"aaaa…" (1572864000 bytes)`.
pub(crate) fn excerpt(text: &str) -> String {
    match cut(text, EXCERPT_CHARS) {
        Some(start) => format!("{start:?}… ({} bytes)", text.len()),
        None => format!("{text:?}"),
    }
}

/// A message (a parser's, or one built around input) cut to its first 300 characters when
/// longer, saying so.
pub(crate) fn clip(message: String) -> String {
    match cut(&message, MESSAGE_CHARS) {
        Some(start) => format!("{start}… (message cut from {} bytes)", message.len()),
        None => message,
    }
}

/// The first `chars` characters of `text`, if it has more.
fn cut(text: &str, chars: usize) -> Option<&str> {
    text.char_indices().nth(chars).map(|(end, _)| &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short_and_say_how_long_the_text_was() {
        assert_eq!(excerpt("abc"), "\"abc\"");
        let long = "é".repeat(10_000);
        let quoted = excerpt(&long);
        assert!(quoted.ends_with("… (20000 bytes)"), "{quoted}");
        assert!(quoted.chars().count() < 120, "{quoted}");
        assert_eq!(clip("short".to_owned()), "short");
        assert!(clip("x".repeat(1 << 20)).len() < 400);
    }

    #[test]
    fn lines_up_to_the_limit_are_read_and_longer_ones_refused_by_number() {
        let exact = format!("{}\nnext\n", "a".repeat(MAX_LINE_BYTES));
        let mut reader = exact.as_bytes();
        let mut line = Vec::new();
        assert_eq!(
            read_line(&mut reader, &mut line, 1).unwrap(),
            MAX_LINE_BYTES + 1
        );
        assert_eq!(read_line(&mut reader, &mut line, 2).unwrap(), 5);
        assert_eq!(line, b"next\n");
        assert_eq!(read_line(&mut reader, &mut line, 3).unwrap(), 0);

        let unterminated = "a".repeat(MAX_LINE_BYTES);
        assert_eq!(
            read_line(&mut unterminated.as_bytes(), &mut line, 1).unwrap(),
            MAX_LINE_BYTES
        );

        let long = "a".repeat(MAX_LINE_BYTES + 1);
        let error = read_line(&mut long.as_bytes(), &mut line, 7).unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 7: longer than 1048576 bytes, the most a line may hold (real trace lines \
             are under a few kilobytes)"
        );
    }
}
