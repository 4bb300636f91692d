//! Trace file formats (one module per format), format detection, gzip, and path helpers.

pub mod native;
pub mod pytorch;
pub mod rmm;

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Cursor, Read, Write};
use std::path::Path;
use std::str::FromStr;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use crate::error::ReadError;
use crate::trace::Trace;

/// The gzip magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// How many leading bytes format detection looks at.
const SNIFF_LEN: u64 = 4096;

/// A trace file format, as chosen on the command line (`--format auto|native|...`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Detect the format from the content.
    #[default]
    Auto,
    /// gpumem's own JSON-lines format ([`native`]).
    Native,
    /// A PyTorch memory snapshot, pickle or JSON ([`pytorch`]); written as a protocol-3
    /// pickle that memory_viz opens.
    Pytorch,
    /// RAPIDS RMM's logging CSV ([`rmm`]).
    Rmm,
}

/// The names [`Format`] parses from, for help texts and error messages.
pub const FORMAT_NAMES: &str = "auto, native, pytorch, rmm";

/// An unknown format name given to [`Format::from_str`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown trace format {given:?}; expected one of: {FORMAT_NAMES}")]
pub struct UnknownFormatName {
    /// The name given.
    pub given: String,
}

impl FromStr for Format {
    type Err = UnknownFormatName;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "auto" => Ok(Self::Auto),
            "native" => Ok(Self::Native),
            "pytorch" => Ok(Self::Pytorch),
            "rmm" => Ok(Self::Rmm),
            _ => Err(UnknownFormatName {
                given: name.to_owned(),
            }),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Pytorch => "pytorch",
            Self::Rmm => "rmm",
        })
    }
}

/// How to read a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// The format, or [`Format::Auto`] to detect it.
    pub format: Format,
    /// For snapshots: the device whose trace to read (default: the first non-empty one).
    pub device: Option<usize>,
}

/// Reads a trace in any supported format from `reader`, gunzipping it first if it starts
/// with the gzip magic bytes, and detecting the format if `options.format` is `Auto`.
pub fn read(reader: impl Read, options: ReadOptions) -> Result<Trace, ReadError> {
    let (head, reader) = peek(reader)?;
    if head.starts_with(&GZIP_MAGIC) {
        let (head, reader) = peek(MultiGzDecoder::new(reader))?;
        read_plain(&head, reader, options)
    } else {
        read_plain(&head, reader, options)
    }
}

/// Reads the trace in the file at `path` (see [`read`]). Errors carry the path, and a trace
/// without a name is named after the file.
pub fn read_path(path: impl AsRef<Path>, options: ReadOptions) -> Result<Trace, ReadError> {
    let path = path.as_ref();
    let mut trace = File::open(path)
        .map_err(ReadError::from)
        .and_then(|file| read(file, options))
        .map_err(|error| error.in_file(path))?;
    if trace.meta.name.is_empty() {
        trace.meta.name = file_stem(path);
    }
    Ok(trace)
}

/// Writes `trace` in `format` to the file at `path`, gzip-compressed if the path ends in
/// `.gz`. `Auto` picks the format from the extension (see [`format_for_path`]).
pub fn write_path(trace: &Trace, path: impl AsRef<Path>, format: Format) -> std::io::Result<()> {
    let path = path.as_ref();
    let format = match format {
        Format::Auto => format_for_path(path),
        chosen => chosen,
    };
    let file = BufWriter::new(File::create(path)?);
    if path.extension().is_some_and(|extension| extension == "gz") {
        let mut encoder = GzEncoder::new(file, flate2::Compression::default());
        write(trace, &mut encoder, format)?;
        encoder.finish()?.flush()
    } else {
        let mut file = file;
        write(trace, &mut file, format)?;
        file.flush()
    }
}

/// Writes `trace` in `format` (`Auto` means native; `Pytorch` writes a snapshot pickle
/// holding the trace as device 0's events).
pub fn write(trace: &Trace, writer: impl Write, format: Format) -> std::io::Result<()> {
    match format {
        Format::Auto | Format::Native => native::write_native(trace, writer),
        Format::Pytorch => crate::snapshot::from_trace(trace, 0).write_pickle(writer),
        Format::Rmm => rmm::write_rmm(trace, writer),
    }
}

/// The format a file name suggests, ignoring a trailing `.gz`: `.pickle`/`.pkl` → PyTorch
/// snapshot, `.csv` → RMM log, anything else native.
pub fn format_for_path(path: &Path) -> Format {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    if name.ends_with(".pickle") || name.ends_with(".pkl") {
        Format::Pytorch
    } else if name.ends_with(".csv") {
        Format::Rmm
    } else {
        Format::Native
    }
}

/// Reads an uncompressed document whose first bytes are `head`.
fn read_plain(head: &[u8], reader: impl Read, options: ReadOptions) -> Result<Trace, ReadError> {
    let format = match options.format {
        Format::Auto => detect(head)?,
        chosen => chosen,
    };
    match (format, options.device) {
        (Format::Pytorch, device) => pytorch::read_pytorch(reader, device),
        (Format::Auto | Format::Native | Format::Rmm, Some(device)) => {
            Err(ReadError::DeviceOfOneDeviceTrace { device, format })
        }
        (Format::Auto | Format::Native, None) => native::read_native(reader),
        (Format::Rmm, None) => rmm::read_rmm(reader),
    }
}

/// Detects the format of an uncompressed document from its first bytes.
fn detect(head: &[u8]) -> Result<Format, ReadError> {
    if native::looks_native(head) {
        Ok(Format::Native)
    } else if pytorch::looks_like_snapshot(head) {
        Ok(Format::Pytorch)
    } else if rmm::looks_like_rmm(head) {
        Ok(Format::Rmm)
    } else if head.is_empty() {
        Err(ReadError::UnknownFormat {
            reason: "the input is empty".to_owned(),
        })
    } else {
        Err(ReadError::UnknownFormat {
            reason: format!(
                "it starts with {:?}",
                String::from_utf8_lossy(&head[..head.len().min(40)])
            ),
        })
    }
}

/// Reads the first bytes of `reader` and returns them with a reader that still yields the
/// whole stream.
fn peek<R: Read>(mut reader: R) -> std::io::Result<(Vec<u8>, impl Read)> {
    let mut head = Vec::new();
    reader.by_ref().take(SNIFF_LEN).read_to_end(&mut head)?;
    Ok((head.clone(), Cursor::new(head).chain(reader)))
}

/// The file name without `.gz` and one more extension (`gpt2-1.5b.jsonl.gz` → `gpt2-1.5b`).
fn file_stem(path: &Path) -> String {
    let uncompressed = match path.extension() {
        Some(extension) if extension == "gz" => path.with_extension(""),
        _ => path.to_path_buf(),
    };
    uncompressed
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default()
}
