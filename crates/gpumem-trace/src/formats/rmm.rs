//! RAPIDS RMM's logging CSV (`rmm::mr::logging_resource_adaptor`).
//!
//! Header `Thread,Time,Action,Pointer,Size,Stream`; columns are found by name, in any order
//! (`Action`, `Pointer` and `Size` are required). Actions: `allocate`, `free`, and
//! `allocate failure` (skipped, and counted as `skipped.allocate_failure_rows` in the
//! metadata: see [`crate::TraceMeta::skipped_notes`]). Pointers are `0x…` hex; a null pointer
//! (`(nil)` or 0) marks a row that moved no memory and is skipped and counted
//! (`skipped.null_pointer_rows`). A line longer than [`crate::MAX_LINE_BYTES`] is refused. Streams are hex (`0` =
//! default stream). Time is `HH:MM:SS.micro` (checked, not used: events keep file order).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufReader, Read, Write};

use crate::error::ReadError;
use crate::text::{excerpt, read_line};
use crate::trace::{Event, LiveBlocks, Trace, TraceMeta};

/// The header RMM writes and [`write_rmm`] reproduces.
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

const HEADER_EXPECTED: &str =
    "a CSV header naming the columns Action, Pointer and Size (RMM writes Thread,Time,Action,Pointer,Size,Stream)";

/// Column positions found in the header.
struct Columns {
    count: usize,
    thread: Option<usize>,
    time: Option<usize>,
    action: usize,
    pointer: usize,
    size: usize,
    stream: Option<usize>,
}

impl Columns {
    fn from_header(header: &str, line: u64) -> Result<Self, ReadError> {
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let find = |name: &str| names.iter().position(|&column| column == name);
        let require = |name: &str| {
            find(name).ok_or_else(|| ReadError::Malformed {
                line,
                expected: HEADER_EXPECTED,
                detail: format!("no column {name:?} in {}", excerpt(header)),
            })
        };
        Ok(Self {
            count: names.len(),
            thread: find("Thread"),
            time: find("Time"),
            action: require("Action")?,
            pointer: require("Pointer")?,
            size: require("Size")?,
            stream: find("Stream"),
        })
    }
}

/// Reads an RMM log. Frees must release a live pointer with the size it was allocated with.
pub fn read_rmm(reader: impl Read) -> Result<Trace, ReadError> {
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    let mut raw = Vec::with_capacity(128);
    let mut line_number = 0u64;
    let mut columns = None;

    let mut live = LiveBlocks::default();
    let mut events = Vec::new();
    let mut threads = HashSet::new();
    let mut allocate_failures = 0u64;
    let mut null_pointer_rows = 0u64;

    loop {
        if read_line(&mut reader, &mut raw, line_number + 1)? == 0 {
            break;
        }
        line_number += 1;
        let line = std::str::from_utf8(&raw)
            .map_err(|error| ReadError::Malformed {
                line: line_number,
                expected: "UTF-8 text",
                detail: error.to_string(),
            })?
            .trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        let Some(columns) = &columns else {
            columns = Some(Columns::from_header(line, line_number)?);
            continue;
        };

        let row = Row::split(line, line_number, columns)?;
        if let Some(thread) = row.thread {
            if !threads.contains(thread) {
                threads.insert(thread.to_owned());
            }
        }
        if let Some(time) = row.time {
            check_time(time).map_err(|detail| row.malformed("a time HH:MM:SS.micro", detail))?;
        }
        let invalid = |violation| ReadError::InvalidEvent {
            line: line_number,
            violation,
        };
        match row.action {
            "allocate" | "free" => {
                let size = parse_decimal(row.size)
                    .map_err(|detail| row.malformed("a size in bytes (decimal)", detail))?;
                let stream = row.stream.map_or(Ok(0), parse_hex).map_err(|detail| {
                    row.malformed("a stream in hex (0 for the default stream)", detail)
                })?;
                let Some(addr) = parse_pointer(row.pointer)
                    .map_err(|detail| row.malformed("a pointer 0x… in hex, or (nil)", detail))?
                else {
                    null_pointer_rows += 1;
                    continue;
                };
                if row.action == "allocate" {
                    live.alloc(addr, size).map_err(invalid)?;
                    events.push(Event::Alloc { addr, size, stream });
                } else {
                    live.free_sized(addr, Some(size)).map_err(invalid)?;
                    events.push(Event::Free { addr, stream });
                }
            }
            "allocate failure" => allocate_failures += 1,
            other => {
                return Err(row.malformed(
                    "an action allocate, free or allocate failure",
                    excerpt(other),
                ))
            }
        }
    }
    if columns.is_none() {
        return Err(ReadError::Empty {
            expected: HEADER_EXPECTED,
        });
    }

    let mut meta = TraceMeta {
        name: String::new(),
        source: "rmm-log".to_owned(),
        device_total: None,
        extra: BTreeMap::from([("threads".to_owned(), threads.len().to_string())]),
    };
    meta.add_skipped("allocate_failure_rows", allocate_failures);
    meta.add_skipped("null_pointer_rows", null_pointer_rows);
    Ok(Trace::new(meta, events))
}

/// Writes `trace` as an RMM log. RMM has no step marker, so steps are dropped; the time
/// column counts microseconds from midnight by event index; thread is 0. A block at address
/// 0 cannot be represented (RMM's null pointer) and is dropped by [`read_rmm`].
pub fn write_rmm(trace: &Trace, writer: impl Write) -> std::io::Result<()> {
    let mut writer = std::io::BufWriter::with_capacity(1 << 16, writer);
    writeln!(writer, "{HEADER}")?;
    let mut live = LiveBlocks::default();
    for (index, event) in trace.events.iter().enumerate() {
        let time = format_time(index as u64);
        match *event {
            Event::Alloc { addr, size, stream } => {
                // An invalid trace is written as it is; the reader will point at it.
                let _ = live.alloc(addr, size);
                writeln!(writer, "0,{time},allocate,{addr:#x},{size},{stream:x}")?;
            }
            Event::Free { addr, stream } => {
                let size = live.free(addr).unwrap_or(0);
                writeln!(writer, "0,{time},free,{addr:#x},{size},{stream:x}")?;
            }
            Event::Step { .. } => {}
        }
    }
    writer.flush()
}

/// Whether a document starting with `head` looks like an RMM log (its header line).
pub(crate) fn looks_like_rmm(head: &[u8]) -> bool {
    let first_line = head.split(|&byte| byte == b'\n').next().unwrap_or_default();
    let first_line = String::from_utf8_lossy(first_line);
    let names: Vec<&str> = first_line.split(',').map(str::trim).collect();
    ["Action", "Pointer", "Size"]
        .iter()
        .all(|required| names.contains(required))
}

/// The fields of one data row that the reader uses.
struct Row<'a> {
    line: u64,
    thread: Option<&'a str>,
    time: Option<&'a str>,
    action: &'a str,
    pointer: &'a str,
    size: &'a str,
    stream: Option<&'a str>,
}

impl<'a> Row<'a> {
    fn split(line: &'a str, line_number: u64, columns: &Columns) -> Result<Self, ReadError> {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != columns.count {
            return Err(ReadError::Malformed {
                line: line_number,
                expected: "as many comma-separated fields as the header has columns",
                detail: format!(
                    "{} fields, header has {}: {}",
                    fields.len(),
                    columns.count,
                    excerpt(line)
                ),
            });
        }
        Ok(Self {
            line: line_number,
            thread: columns.thread.map(|column| fields[column]),
            time: columns.time.map(|column| fields[column]),
            action: fields[columns.action],
            pointer: fields[columns.pointer],
            size: fields[columns.size],
            stream: columns.stream.map(|column| fields[column]),
        })
    }

    fn malformed(&self, expected: &'static str, detail: String) -> ReadError {
        ReadError::Malformed {
            line: self.line,
            expected,
            detail,
        }
    }
}

fn parse_decimal(text: &str) -> Result<u64, String> {
    text.parse().map_err(|_| excerpt(text))
}

fn parse_hex(text: &str) -> Result<u64, String> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u64::from_str_radix(digits, 16).map_err(|_| excerpt(text))
}

/// A pointer, or `None` for a null pointer.
fn parse_pointer(text: &str) -> Result<Option<u64>, String> {
    if text == "(nil)" {
        return Ok(None);
    }
    if !(text.starts_with("0x") || text.starts_with("0X")) {
        return Err(excerpt(text));
    }
    parse_hex(text).map(|pointer| (pointer != 0).then_some(pointer))
}

/// Checks `HH:MM:SS.micro` (hours, minutes, seconds of two digits; 1–9 fraction digits).
fn check_time(text: &str) -> Result<(), String> {
    let all_digits = |part: &str, lengths: std::ops::RangeInclusive<usize>| {
        lengths.contains(&part.len()) && part.bytes().all(|byte| byte.is_ascii_digit())
    };
    let mut parts = text.split(':');
    let well_formed = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(hours), Some(minutes), Some(seconds), None) => match seconds.split_once('.') {
            Some((whole, fraction)) => {
                all_digits(hours, 2..=2)
                    && all_digits(minutes, 2..=2)
                    && all_digits(whole, 2..=2)
                    && all_digits(fraction, 1..=9)
            }
            None => false,
        },
        _ => false,
    };
    if well_formed {
        Ok(())
    } else {
        Err(excerpt(text))
    }
}

/// `HH:MM:SS.micro` for `micros` microseconds after midnight (wrapping at 24 h).
fn format_time(micros: u64) -> String {
    let seconds = micros / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
        micros % 1_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Violation;

    #[test]
    fn reads_rmm_rows_by_column_name() {
        let log = "Thread,Time,Action,Pointer,Size,Stream\n\
            140221,14:03:22.123456,allocate,0x7f1e40000000,1048576,0\n\
            140221,14:03:22.123500,allocate failure,(nil),1099511627776,0x5a\n\
            140222,14:03:22.123600,allocate,0x7f1e40100000,256,5a\n\
            140221,14:03:22.123700,free,0x7f1e40000000,1048576,0\n";
        let trace = read_rmm(log.as_bytes()).unwrap();
        assert_eq!(
            trace.events,
            vec![
                Event::Alloc {
                    addr: 0x7f1e40000000,
                    size: 1 << 20,
                    stream: 0
                },
                Event::Alloc {
                    addr: 0x7f1e40100000,
                    size: 256,
                    stream: 0x5a
                },
                Event::Free {
                    addr: 0x7f1e40000000,
                    stream: 0
                },
            ]
        );
        assert_eq!(trace.meta.skipped("allocate_failure_rows"), 1);
        assert_eq!(trace.meta.extra["threads"], "2");
        assert_eq!(trace.meta.source, "rmm-log");
    }

    #[test]
    fn columns_in_any_order_and_optional_stream_and_time() {
        let log = "Size,Pointer,Action\r\n64,0x40,allocate\r\n64,0x40,free\r\n0,(nil),allocate\r\n";
        let trace = read_rmm(log.as_bytes()).unwrap();
        assert_eq!(trace.events.len(), 2);
        assert_eq!(trace.meta.skipped("null_pointer_rows"), 1);
    }

    #[test]
    fn errors_name_line_and_expectation() {
        let cases = [
            (
                "Thread,Time,Pointer,Size\n",
                "line 1: expected a CSV header",
            ),
            (
                "Action,Pointer,Size\nallocate,0x10\n",
                "line 2: expected as many comma-separated fields",
            ),
            (
                "Action,Pointer,Size\nrealloc,0x10,5\n",
                "line 2: expected an action",
            ),
            (
                "Action,Pointer,Size\nallocate,16,5\n",
                "line 2: expected a pointer",
            ),
            (
                "Action,Pointer,Size\nallocate,0x10,-5\n",
                "line 2: expected a size",
            ),
            (
                "Time,Action,Pointer,Size\n1:2:3,allocate,0x10,5\n",
                "line 2: expected a time HH:MM:SS.micro",
            ),
            ("", "empty input"),
        ];
        for (log, expected) in cases {
            let message = read_rmm(log.as_bytes()).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{log:?}: {message}");
        }
    }

    #[test]
    fn free_must_match_a_live_allocation_and_its_size() {
        let error =
            read_rmm("Action,Pointer,Size\nallocate,0x10,8\nfree,0x10,4\n".as_bytes()).unwrap_err();
        assert!(matches!(
            error,
            ReadError::InvalidEvent {
                line: 3,
                violation: Violation::FreeSizeMismatch { .. }
            }
        ));
    }

    #[test]
    fn writer_round_trips_blocks_and_drops_steps() {
        let trace = Trace::new(
            TraceMeta::default(),
            vec![
                Event::Step { index: 0 },
                Event::Alloc {
                    addr: 0x7f00_0000_0000,
                    size: 3 << 20,
                    stream: 0x1234,
                },
                Event::Free {
                    addr: 0x7f00_0000_0000,
                    stream: 0,
                },
            ],
        );
        let mut bytes = Vec::new();
        write_rmm(&trace, &mut bytes).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with(HEADER));
        assert!(text.contains("0,00:00:00.000001,allocate,0x7f0000000000,3145728,1234"));
        let back = read_rmm(bytes.as_slice()).unwrap();
        assert_eq!(back.events, trace.events[1..]);
    }

    #[test]
    fn time_format_and_check_agree() {
        for micros in [0, 1, 59_999_999, 86_399_999_999, 86_400_000_001] {
            check_time(&format_time(micros)).unwrap();
        }
        assert_eq!(format_time(3_723_000_004), "01:02:03.000004");
    }
}
