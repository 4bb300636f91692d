//! The native "gpumem-trace v1" format: JSON lines, optionally gzip-compressed.
//!
//! Line 1 is a header,
//! `{"gpumem_trace": 1, "name": str, "source": str, "device_total": int|null, "meta": {str: str}}`,
//! with, for a trace recorded in a process that already held memory, its
//! [`Trace::initial_segments`] as `"initial_segments": [{"address": int, "size": int,
//! "stream": int, "pool": "small"|"large", "expandable": bool, "blocks": [{"address": int,
//! "requested": int, "size": int}]}]` (`stream`, `expandable`, `blocks` and a block's `size`
//! optional; the blocks' allocs are the first events, as in the trace), and, where the
//! producer recorded them, its [`Trace::device_allocations`] as `"device_allocations":
//! [{"address": int, "size": int}]`,
//! then one event per line:
//! `{"op":"alloc","addr":int,"size":int,"stream":int}`,
//! `{"op":"free","addr":int,"size":int,"stream":int}` (size optional, checked against the
//! alloc when present), `{"op":"step","index":int}`. `stream` is optional (default 0).
//! Unknown keys are ignored so that later versions can add fields; blank lines are skipped.
//! The header's `device_allocations` and `initial_segments` are device memory and never at
//! address 0 (the null pointer); an event's `addr` only names its block, and may be 0. A
//! line longer than [`crate::MAX_LINE_BYTES`] is refused, a header longer than
//! [`crate::MAX_HEADER_BYTES`] (it holds every block live when recording began).

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};

use serde::{Deserialize, Serialize};

use crate::error::ReadError;
use crate::snapshot::SegmentType;
use crate::text::{clip, read_line, read_line_within, MAX_HEADER_BYTES};
use crate::trace::{
    DeviceAllocation, Event, InitialBlock, InitialSegment, LiveBlocks, Trace, TraceMeta, Violation,
};

/// The version this module reads and writes.
pub const VERSION: u64 = 1;

/// What the first line must hold; used in error messages.
const HEADER_EXPECTED: &str = r#"a gpumem-trace header {"gpumem_trace": 1, "name": ..., ...}"#;
/// What every other line must hold; used in error messages.
const EVENT_EXPECTED: &str = r#"an event {"op": "alloc"|"free"|"step", ...}"#;

/// The header line, as read.
#[derive(Deserialize)]
struct HeaderIn {
    gpumem_trace: u64,
    #[serde(default)]
    name: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    device_total: Option<u64>,
    #[serde(default)]
    meta: BTreeMap<String, String>,
    #[serde(default)]
    initial_segments: Vec<SegmentEntry>,
    #[serde(default)]
    device_allocations: Vec<DeviceAllocationEntry>,
}

/// The header line, as written (borrows the trace's metadata).
#[derive(Serialize)]
struct HeaderOut<'a> {
    gpumem_trace: u64,
    name: &'a str,
    source: &'a str,
    device_total: Option<u64>,
    meta: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    initial_segments: Vec<SegmentEntry>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    device_allocations: Vec<DeviceAllocationEntry>,
}

/// A device allocation in the header.
#[derive(Serialize, Deserialize)]
struct DeviceAllocationEntry {
    address: u64,
    size: u64,
}

/// An initial segment in the header.
#[derive(Serialize, Deserialize)]
struct SegmentEntry {
    address: u64,
    size: u64,
    #[serde(default)]
    stream: u64,
    pool: PoolName,
    #[serde(default)]
    expandable: bool,
    #[serde(default)]
    blocks: Vec<BlockEntry>,
}

/// The pool of an initial segment, as PyTorch names it.
#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum PoolName {
    Small,
    Large,
}

/// A block of an initial segment in the header.
#[derive(Serialize, Deserialize)]
struct BlockEntry {
    address: u64,
    requested: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
}

impl From<&InitialSegment> for SegmentEntry {
    fn from(segment: &InitialSegment) -> Self {
        SegmentEntry {
            address: segment.address,
            size: segment.size,
            stream: segment.stream,
            pool: match segment.pool {
                SegmentType::Small => PoolName::Small,
                SegmentType::Large => PoolName::Large,
            },
            expandable: segment.expandable,
            blocks: segment
                .blocks
                .iter()
                .map(|block| BlockEntry {
                    address: block.address,
                    requested: block.requested,
                    size: block.size,
                })
                .collect(),
        }
    }
}

impl From<SegmentEntry> for InitialSegment {
    fn from(entry: SegmentEntry) -> Self {
        InitialSegment {
            address: entry.address,
            size: entry.size,
            stream: entry.stream,
            pool: match entry.pool {
                PoolName::Small => SegmentType::Small,
                PoolName::Large => SegmentType::Large,
            },
            expandable: entry.expandable,
            blocks: entry
                .blocks
                .into_iter()
                .map(|block| InitialBlock {
                    address: block.address,
                    requested: block.requested,
                    size: block.size,
                })
                .collect(),
        }
    }
}

/// The `op` of an event line.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum LineOp {
    Alloc,
    Free,
    Step,
}

/// An event line, as read: every field optional, checked per `op` afterwards (a flat struct
/// parses much faster than an internally tagged enum, which buffers every line).
#[derive(Deserialize, Debug, PartialEq, Eq)]
struct EventLine {
    op: LineOp,
    addr: Option<u64>,
    size: Option<u64>,
    stream: Option<u64>,
    index: Option<u64>,
}

impl EventLine {
    /// Parses the common shape of an event line without serde: a flat object of the known
    /// keys with an unescaped string `op` and unsigned integer values, in any order, with any
    /// JSON whitespace. Returns `None` for anything else (unknown keys, escapes, `null`,
    /// duplicate keys, syntax errors), which then goes through serde_json for the general
    /// case and its error messages. About 4× faster than serde_json on a typical line.
    fn parse_flat(line: &[u8]) -> Option<Self> {
        let mut cursor = FlatCursor { rest: line };
        cursor.expect(b'{')?;
        let (mut op, mut addr, mut size, mut stream, mut index) = (None, None, None, None, None);
        loop {
            let key = cursor.string()?;
            cursor.expect(b':')?;
            let slot = match key {
                b"op" => {
                    let op_name = cursor.string()?;
                    let parsed = match op_name {
                        b"alloc" => LineOp::Alloc,
                        b"free" => LineOp::Free,
                        b"step" => LineOp::Step,
                        _ => return None,
                    };
                    if op.replace(parsed).is_some() {
                        return None;
                    }
                    None
                }
                b"addr" => Some(&mut addr),
                b"size" => Some(&mut size),
                b"stream" => Some(&mut stream),
                b"index" => Some(&mut index),
                _ => return None,
            };
            if let Some(slot) = slot {
                if slot.replace(cursor.unsigned()?).is_some() {
                    return None;
                }
            }
            match cursor.next_token()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
        cursor.skip_whitespace();
        cursor.rest.is_empty().then_some(Self {
            op: op?,
            addr,
            size,
            stream,
            index,
        })
    }
}

/// A position in an event line, for [`EventLine::parse_flat`].
struct FlatCursor<'a> {
    rest: &'a [u8],
}

impl<'a> FlatCursor<'a> {
    fn skip_whitespace(&mut self) {
        let start = self
            .rest
            .iter()
            .position(|byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
            .unwrap_or(self.rest.len());
        self.rest = &self.rest[start..];
    }

    /// The next non-whitespace byte, consumed.
    fn next_token(&mut self) -> Option<u8> {
        self.skip_whitespace();
        let (&first, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(first)
    }

    fn expect(&mut self, token: u8) -> Option<()> {
        (self.next_token()? == token).then_some(())
    }

    /// A string without escapes.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let end = self
            .rest
            .iter()
            .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)?;
        let (text, rest) = self.rest.split_at(end);
        // Anything but the closing quote (an escape or a control character) is not flat.
        (rest.first() == Some(&b'"')).then_some(())?;
        self.rest = &rest[1..];
        Some(text)
    }

    /// A JSON integer that fits in a `u64` (no sign, fraction or exponent; no leading zero).
    fn unsigned(&mut self) -> Option<u64> {
        self.skip_whitespace();
        let mut value = 0u64;
        let mut digits = 0;
        for &byte in self.rest {
            if !byte.is_ascii_digit() {
                break;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?;
            digits += 1;
        }
        let leading_zero = digits > 1 && self.rest[0] == b'0';
        let fraction_or_exponent = matches!(self.rest.get(digits), Some(b'.' | b'e' | b'E'));
        if digits == 0 || leading_zero || fraction_or_exponent {
            return None;
        }
        self.rest = &self.rest[digits..];
        Some(value)
    }
}

/// Reads a native trace (uncompressed; [`crate::read`] handles gzip).
///
/// Rejects lines that are not JSON events, events missing a required field, and events that
/// are invalid at their position (see [`Trace::validate`]) — each with its line number.
pub fn read_native(reader: impl Read) -> Result<Trace, ReadError> {
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    let mut line = Vec::with_capacity(256);
    let mut line_number = 0u64;

    let (meta, initial_segments, device_allocations) = loop {
        line_number += 1;
        if read_line_within(&mut reader, &mut line, line_number, MAX_HEADER_BYTES)? == 0 {
            return Err(ReadError::Empty {
                expected: HEADER_EXPECTED,
            });
        }
        if !is_blank(&line) {
            break parse_header(&line, line_number)?;
        }
    };
    let header_line = line_number;

    let mut live = LiveBlocks::default();
    let mut events = Vec::new();
    // The lines of the events that must allocate the initial segments' blocks.
    let initial_allocs: usize = initial_segments.iter().map(|s| s.blocks.len()).sum();
    let mut initial_lines = Vec::with_capacity(initial_allocs);
    loop {
        if read_line(&mut reader, &mut line, line_number + 1)? == 0 {
            break;
        }
        line_number += 1;
        if is_blank(&line) {
            continue;
        }
        if initial_lines.len() < initial_allocs {
            initial_lines.push(line_number);
        }
        events.push(parse_event(&line, line_number, &mut live)?);
    }
    let mut trace = Trace::new(meta, events);
    trace.initial_segments = initial_segments;
    trace.device_allocations = device_allocations;
    trace
        .validate_device_allocations()
        .map_err(|error| ReadError::InvalidEvent {
            line: header_line,
            violation: error.violation,
        })?;
    trace.validate_initial_segments().map_err(|error| {
        // A missing alloc is reported at the event in its place (after the last event if the
        // trace is shorter); a layout fault at the header.
        let line = match error.violation {
            Violation::InitialAllocMissing { .. } => initial_lines
                .get(error.index)
                .copied()
                .unwrap_or(line_number),
            _ => header_line,
        };
        ReadError::InvalidEvent {
            line,
            violation: error.violation,
        }
    })?;
    Ok(trace)
}

/// Writes `trace` as a native trace (uncompressed; [`crate::write_path`] compresses `.gz`).
///
/// Frees carry the size of the block they release, so that readers can cross-check them.
pub fn write_native(trace: &Trace, writer: impl Write) -> std::io::Result<()> {
    let mut writer = std::io::BufWriter::with_capacity(1 << 16, writer);
    let header = HeaderOut {
        gpumem_trace: VERSION,
        name: &trace.meta.name,
        source: &trace.meta.source,
        device_total: trace.meta.device_total,
        meta: &trace.meta.extra,
        initial_segments: trace
            .initial_segments
            .iter()
            .map(SegmentEntry::from)
            .collect(),
        device_allocations: trace
            .device_allocations
            .iter()
            .map(|a| DeviceAllocationEntry {
                address: a.address,
                size: a.size,
            })
            .collect(),
    };
    serde_json::to_writer(&mut writer, &header)?;
    writer.write_all(b"\n")?;
    let mut live = LiveBlocks::default();
    for event in &trace.events {
        match *event {
            Event::Alloc { addr, size, stream } => {
                // An invalid trace is still written as it is; the reader will point at it.
                let _ = live.alloc(addr, size);
                writeln!(
                    writer,
                    r#"{{"op":"alloc","addr":{addr},"size":{size},"stream":{stream}}}"#
                )?;
            }
            Event::Free { addr, stream } => match live.free(addr) {
                Ok(size) => writeln!(
                    writer,
                    r#"{{"op":"free","addr":{addr},"size":{size},"stream":{stream}}}"#
                )?,
                Err(_) => writeln!(writer, r#"{{"op":"free","addr":{addr},"stream":{stream}}}"#)?,
            },
            Event::Step { index } => writeln!(writer, r#"{{"op":"step","index":{index}}}"#)?,
        }
    }
    writer.flush()
}

/// Whether the first line of a document looks like a native header (for format detection).
pub(crate) fn looks_native(head: &[u8]) -> bool {
    let first_line = head.split(|&byte| byte == b'\n').next().unwrap_or_default();
    first_line.trim_ascii_start().starts_with(b"{")
        && first_line
            .windows(b"\"gpumem_trace\"".len())
            .any(|window| window == b"\"gpumem_trace\"")
}

fn is_blank(line: &[u8]) -> bool {
    line.trim_ascii().is_empty()
}

/// A header's parts: the metadata, the initial segments and the device allocations.
type Header = (TraceMeta, Vec<InitialSegment>, Vec<DeviceAllocation>);

fn parse_header(line: &[u8], line_number: u64) -> Result<Header, ReadError> {
    let header: HeaderIn = serde_json::from_slice(line).map_err(|error| ReadError::Malformed {
        line: line_number,
        expected: HEADER_EXPECTED,
        detail: clip(error.to_string()),
    })?;
    if header.gpumem_trace != VERSION {
        return Err(ReadError::UnsupportedVersion {
            found: header.gpumem_trace,
        });
    }
    let meta = TraceMeta {
        name: header.name,
        source: header.source,
        device_total: header.device_total,
        extra: header.meta,
    };
    let initial = header.initial_segments.into_iter().map(Into::into);
    let device_allocations = header
        .device_allocations
        .into_iter()
        .map(|a| DeviceAllocation {
            address: a.address,
            size: a.size,
        });
    Ok((meta, initial.collect(), device_allocations.collect()))
}

fn parse_event(line: &[u8], line_number: u64, live: &mut LiveBlocks) -> Result<Event, ReadError> {
    let parsed = match EventLine::parse_flat(line) {
        Some(parsed) => parsed,
        None => serde_json::from_slice(line).map_err(|error| ReadError::Malformed {
            line: line_number,
            expected: EVENT_EXPECTED,
            detail: clip(error.to_string()),
        })?,
    };
    let required = |value: Option<u64>, expected: &'static str| {
        value.ok_or_else(|| ReadError::Malformed {
            line: line_number,
            expected,
            detail: "the field is missing".to_owned(),
        })
    };
    let stream = parsed.stream.unwrap_or(0);
    let invalid = |violation| ReadError::InvalidEvent {
        line: line_number,
        violation,
    };
    match parsed.op {
        LineOp::Alloc => {
            let addr = required(parsed.addr, r#"an integer "addr" on an alloc"#)?;
            let size = required(parsed.size, r#"an integer "size" on an alloc"#)?;
            live.alloc(addr, size).map_err(invalid)?;
            Ok(Event::Alloc { addr, size, stream })
        }
        LineOp::Free => {
            let addr = required(parsed.addr, r#"an integer "addr" on a free"#)?;
            live.free_sized(addr, parsed.size).map_err(invalid)?;
            Ok(Event::Free { addr, stream })
        }
        LineOp::Step => {
            let index = required(parsed.index, r#"an integer "index" on a step"#)?;
            Ok(Event::Step { index })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        let mut extra = BTreeMap::new();
        extra.insert("model".to_owned(), "gpt2 \"small\"".to_owned());
        let mut trace = Trace::new(
            TraceMeta {
                name: "sample".to_owned(),
                source: "unit test".to_owned(),
                device_total: Some(80 << 30),
                extra,
            },
            vec![
                Event::Step { index: 0 },
                Event::Alloc {
                    addr: 0x7f00_0000_0000,
                    size: 4096,
                    stream: 0,
                },
                Event::Alloc {
                    addr: 0x7f00_0000_1000,
                    size: 1 << 40,
                    stream: 7,
                },
                Event::Free {
                    addr: 0x7f00_0000_0000,
                    stream: 0,
                },
                Event::Step { index: 1 },
            ],
        );
        trace.device_allocations = vec![DeviceAllocation {
            address: 0x7f00_0000_0000,
            size: 2 << 20,
        }];
        trace
    }

    fn read_str(text: &str) -> Result<Trace, ReadError> {
        read_native(text.as_bytes())
    }

    #[test]
    fn round_trip_keeps_meta_and_events() {
        let trace = sample();
        let mut bytes = Vec::new();
        write_native(&trace, &mut bytes).unwrap();
        assert_eq!(read_native(bytes.as_slice()).unwrap(), trace);
    }

    #[test]
    fn writes_sizes_on_frees() {
        let mut bytes = Vec::new();
        write_native(&sample(), &mut bytes).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains(r#"{"op":"free","addr":139637976727552,"size":4096,"stream":0}"#));
    }

    #[test]
    fn stream_and_free_size_are_optional_and_unknown_keys_ignored() {
        let trace = read_str(
            "{\"gpumem_trace\":1,\"name\":\"t\",\"source\":\"s\",\"device_total\":null,\"meta\":{}}\n\
             {\"op\":\"alloc\",\"addr\":16,\"size\":8,\"future\":[1,2]}\n\
             \n\
             {\"op\":\"free\",\"addr\":16}\n",
        )
        .unwrap();
        assert_eq!(
            trace.events,
            vec![
                Event::Alloc {
                    addr: 16,
                    size: 8,
                    stream: 0
                },
                Event::Free {
                    addr: 16,
                    stream: 0
                }
            ]
        );
    }

    #[test]
    fn free_size_is_checked_against_the_alloc() {
        let error = read_str(
            "{\"gpumem_trace\":1}\n{\"op\":\"alloc\",\"addr\":16,\"size\":8}\n{\"op\":\"free\",\"addr\":16,\"size\":9}\n",
        )
        .unwrap_err();
        assert!(matches!(
            error,
            ReadError::InvalidEvent {
                line: 3,
                violation: Violation::FreeSizeMismatch {
                    addr: 16,
                    stated: 9,
                    allocated: 8
                }
            }
        ));
    }

    #[test]
    fn double_free_is_reported_with_its_line() {
        let error = read_str(
            "{\"gpumem_trace\":1}\n{\"op\":\"alloc\",\"addr\":16,\"size\":8}\n{\"op\":\"free\",\"addr\":16}\n{\"op\":\"free\",\"addr\":16}\n",
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 4: free of address 0x10, which is not live"
        );
    }

    #[test]
    fn missing_field_names_line_and_field() {
        let error = read_str("{\"gpumem_trace\":1}\n{\"op\":\"alloc\",\"addr\":16}\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 2: expected an integer \"size\" on an alloc: the field is missing"
        );
    }

    #[test]
    fn bad_json_and_unknown_op_are_malformed() {
        for bad in [
            "{\"op\":\"alloc\",",
            "{\"op\":\"realloc\",\"addr\":1}",
            "[1,2]",
            "{\"op\":\"alloc\",\"addr\":-1,\"size\":1}",
        ] {
            let error = read_str(&format!("{{\"gpumem_trace\":1}}\n{bad}\n")).unwrap_err();
            assert!(
                matches!(error, ReadError::Malformed { line: 2, .. }),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn header_problems_are_reported() {
        assert!(matches!(read_str(""), Err(ReadError::Empty { .. })));
        assert!(matches!(
            read_str("{\"gpumem_trace\":2}\n"),
            Err(ReadError::UnsupportedVersion { found: 2 })
        ));
        assert!(matches!(
            read_str("{\"op\":\"step\",\"index\":0}\n"),
            Err(ReadError::Malformed { line: 1, .. })
        ));
    }

    #[test]
    fn flat_parser_agrees_with_serde_or_defers_to_it() {
        let lines = [
            r#"{"op":"alloc","addr":1,"size":2,"stream":3}"#,
            r#" { "size" : 18446744073709551615 , "op" : "alloc" ,"addr":0 } "#,
            r#"{"op":"free","addr":1}"#,
            r#"{"op":"step","index":7}"#,
            r#"{"op":"step"}"#,
            r#"{"op":"alloc","addr":1,"addr":2}"#,
            r#"{"op":"alloc","addr":18446744073709551616}"#,
            r#"{"op":"alloc","addr":01}"#,
            r#"{"op":"alloc","addr":1.5}"#,
            r#"{"op":"alloc","addr":-0}"#,
            r#"{"op":"alloc","addr":null}"#,
            r#"{"op":"al\u006coc","addr":1}"#,
            r#"{"op":"alloc","note":"x"}"#,
            r#"{"op":"alloc"} trailing"#,
            r#"{"op":"alloc",}"#,
            r#"{}"#,
        ];
        for line in lines {
            let serde = serde_json::from_str::<EventLine>(line).ok();
            if let Some(flat) = EventLine::parse_flat(line.as_bytes()) {
                assert_eq!(Some(flat), serde, "{line}");
            }
        }
        assert!(EventLine::parse_flat(lines[0].as_bytes()).is_some());
        assert!(EventLine::parse_flat(lines[1].as_bytes()).is_some());
    }

    #[test]
    fn detects_native_header() {
        assert!(looks_native(
            b"  {\"gpumem_trace\": 1, \"name\": \"x\"}\n{}"
        ));
        assert!(!looks_native(b"{\"segments\": []}"));
        assert!(!looks_native(b"Thread,Time,Action,Pointer,Size,Stream\n"));
    }
}
