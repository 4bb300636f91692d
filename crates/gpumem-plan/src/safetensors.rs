//! Exact parameter counts and dtypes from a `.safetensors` file, reading only its JSON header
//! (8-byte little-endian length, then that many bytes of JSON).

use crate::error::{PlanError, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;

/// Largest header accepted (the format caps it at 100 MB).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Tensor statistics of one safetensors file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TensorSummary {
    /// Total elements over all tensors.
    pub elements: u64,
    /// Elements per dtype name ("BF16", "F32", ...).
    pub elements_by_dtype: BTreeMap<String, u64>,
    /// Bytes of tensor data per the header offsets.
    pub data_bytes: u64,
}

/// Reads the header of a safetensors stream and sums its tensors.
pub fn read_header(mut reader: impl Read, path: &str) -> Result<TensorSummary> {
    let bad = |reason: String| PlanError::Unreadable {
        path: path.to_string(),
        reason,
    };
    let mut length = [0u8; 8];
    reader
        .read_exact(&mut length)
        .map_err(|e| bad(format!("no header length: {e}")))?;
    let length = u64::from_le_bytes(length);
    if length == 0 || length > MAX_HEADER_BYTES {
        return Err(bad(format!("header length {length} out of range")));
    }
    let mut header = vec![0u8; length as usize];
    reader
        .read_exact(&mut header)
        .map_err(|e| bad(format!("truncated header: {e}")))?;
    let json: Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let tensors = json
        .as_object()
        .ok_or_else(|| bad("header is not a JSON object".into()))?;
    let mut summary = TensorSummary::default();
    for (name, info) in tensors
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
    {
        let dtype = info
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{name}: no dtype")))?;
        let shape = info
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(format!("{name}: no shape")))?;
        let elements = shape
            .iter()
            .try_fold(1u64, |acc, d| d.as_u64().and_then(|d| acc.checked_mul(d)));
        let elements = elements.ok_or_else(|| bad(format!("{name}: bad shape")))?;
        let offsets = info.get("data_offsets").and_then(Value::as_array);
        if let Some([start, end]) = offsets.map(Vec::as_slice) {
            summary.data_bytes += end
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(start.as_u64().unwrap_or(0));
        }
        summary.elements += elements;
        *summary
            .elements_by_dtype
            .entry(dtype.to_string())
            .or_default() += elements;
    }
    Ok(summary)
}

/// Reads the header of a safetensors file on disk.
pub fn read_file(path: &std::path::Path) -> Result<TensorSummary> {
    let file = std::fs::File::open(path).map_err(|e| PlanError::Unreadable {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    read_header(std::io::BufReader::new(file), &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(header: &str) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes
    }

    #[test]
    fn sums_tensors_by_dtype() {
        let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[4],"data_offsets":[12,28]}}"#;
        let summary = read_header(file_with(header).as_slice(), "x").unwrap();
        assert_eq!(summary.elements, 10);
        assert_eq!(summary.elements_by_dtype["BF16"], 6);
        assert_eq!(summary.data_bytes, 28);
    }

    #[test]
    fn rejects_garbage() {
        assert!(read_header(&[1u8, 2, 3][..], "x").is_err());
        assert!(read_header(file_with("[1,2]").as_slice(), "x").is_err());
        assert!(read_header(&u64::MAX.to_le_bytes()[..], "x").is_err());
    }
}
