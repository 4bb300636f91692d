//! A restricted unpickler for memory snapshots: protocols 0–5, plain data only.
//!
//! Why not serde-pickle: it miscounts references into shared memoised containers (PyTorch
//! shares `frames` lists and frame dicts between blocks and events, which it reports as
//! "recursive"), it expands shared subtrees into copies, and it recurses (and overflows the
//! stack) on deeply nested input. Here memoised values are shared (`Rc`), building is
//! iterative, dropping is iterative, and only plain data is accepted (no globals, no object
//! construction), so any input ends in a value or an error naming the byte offset.

use std::collections::HashMap;
use std::rc::Rc;

use super::document::{ContainerArena, Dict, Document, List, Value};
use crate::error::ReadError;

/// Decodes a pickle; errors name the byte offset of the offending opcode.
pub(crate) fn unpickle(input: &[u8]) -> Result<Document, ReadError> {
    Unpickler {
        input,
        position: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        strings: HashMap::new(),
        arena: ContainerArena::default(),
    }
    .run()
}

struct Unpickler<'a> {
    input: &'a [u8],
    position: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u64, Value>,
    /// Short strings seen so far, shared rather than allocated again (dict keys repeat in
    /// every block and event; pickles not written by Python do not memoise them).
    strings: HashMap<&'a [u8], Rc<str>>,
    /// Owns every container built, so that cycles and deep nesting drop safely.
    arena: ContainerArena,
}

/// Strings up to this length are shared through [`Unpickler::strings`].
const SHARED_STRING_MAX: usize = 64;

/// The failure of one opcode, before the offset is attached.
type Step<T> = Result<T, String>;

impl<'a> Unpickler<'a> {
    fn run(mut self) -> Result<Document, ReadError> {
        loop {
            let offset = self.position;
            let Some(&opcode) = self.input.get(offset) else {
                return Err(ReadError::Pickle {
                    offset: offset as u64,
                    detail: "the pickle ends before its STOP opcode".to_owned(),
                });
            };
            self.position += 1;
            match self.execute(opcode) {
                Ok(None) => {}
                Ok(Some(root)) => return Ok(Document::new(root, self.arena)),
                Err(detail) => {
                    return Err(ReadError::Pickle {
                        offset: offset as u64,
                        detail: format!("opcode {opcode:#04x}: {detail}"),
                    })
                }
            }
        }
    }

    /// Executes one opcode; returns the result on STOP.
    fn execute(&mut self, opcode: u8) -> Step<Option<Value>> {
        match opcode {
            b'.' => return self.pop().map(Some),
            0x80 => {
                let protocol = self.take(1)?[0];
                if protocol > 5 {
                    return Err(format!("protocol {protocol} is newer than 5"));
                }
            }
            0x95 => {
                self.take(8)?;
            }
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                if self.stack.len() > self.marks.last().copied().unwrap_or(0) {
                    self.pop()?;
                } else {
                    self.pop_mark()?;
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let top = self.top()?.clone();
                self.stack.push(top);
            }
            // Containers.
            b'}' => {
                let dict = self.arena.dict(Vec::new());
                self.stack.push(dict);
            }
            b']' | b')' | 0x8f => {
                let list = self.arena.list(Vec::new());
                self.stack.push(list);
            }
            b'l' | b't' | 0x91 => {
                let items = self.pop_mark()?;
                let list = self.arena.list(items);
                self.stack.push(list);
            }
            0x85..=0x87 => {
                let count = usize::from(opcode - 0x84);
                if self.stack.len() < count + self.marks.last().copied().unwrap_or(0) {
                    return Err("stack underflow".to_owned());
                }
                let items = self.stack.split_off(self.stack.len() - count);
                let list = self.arena.list(items);
                self.stack.push(list);
            }
            b'd' => {
                let items = self.pop_mark()?;
                let entries = pairs(items)?;
                let dict = self.arena.dict(entries);
                self.stack.push(dict);
            }
            b'a' => {
                let item = self.pop()?;
                self.top_list()?.borrow_mut().push(item);
            }
            b'e' | 0x90 => {
                let mut items = self.pop_mark()?;
                self.top_list()?.borrow_mut().append(&mut items);
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.top_dict()?.borrow_mut().push((key, value));
            }
            b'u' => {
                let items = self.pop_mark()?;
                let mut entries = pairs(items)?;
                self.top_dict()?.borrow_mut().append(&mut entries);
            }
            // Scalars.
            b'N' => self.stack.push(Value::None),
            0x88 => self.stack.push(Value::Bool(true)),
            0x89 => self.stack.push(Value::Bool(false)),
            b'K' => {
                let byte = self.take(1)?[0];
                self.stack.push(Value::Int(i64::from(byte)));
            }
            b'M' => {
                let value = u16::from_le_bytes(self.array()?);
                self.stack.push(Value::Int(i64::from(value)));
            }
            b'J' => {
                let value = i32::from_le_bytes(self.array()?);
                self.stack.push(Value::Int(i64::from(value)));
            }
            0x8a => {
                let length = usize::from(self.take(1)?[0]);
                let bytes = self.take(length)?;
                self.stack.push(little_endian_int(bytes));
            }
            0x8b => {
                let length = self.length_u32()?;
                let bytes = self.take(length)?;
                self.stack.push(little_endian_int(bytes));
            }
            b'I' => {
                let line = self.line()?;
                let value = match line {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    text => text_int(text)?,
                };
                self.stack.push(value);
            }
            b'L' => {
                let line = self.line()?;
                let value = text_int(line.strip_suffix('L').unwrap_or(line))?;
                self.stack.push(value);
            }
            b'G' => {
                let value = f64::from_be_bytes(self.array()?);
                self.stack.push(Value::Float(value));
            }
            b'F' => {
                let line = self.line()?;
                let value = line
                    .trim()
                    .parse()
                    .map_err(|_| format!("{line:?} is not a float"))?;
                self.stack.push(Value::Float(value));
            }
            // Strings and bytes.
            0x8c => {
                let length = usize::from(self.take(1)?[0]);
                self.push_str(length)?;
            }
            b'X' => {
                let length = self.length_u32()?;
                self.push_str(length)?;
            }
            0x8d => {
                let length = self.length_u64()?;
                self.push_str(length)?;
            }
            b'V' => {
                // raw-unicode-escape: Latin-1 bytes plus \u escapes.
                let line: String = self
                    .line_bytes()?
                    .iter()
                    .map(|&byte| char::from(byte))
                    .collect();
                let text = raw_unicode_unescape(&line)?;
                self.stack.push(Value::Str(text.into()));
            }
            // Python 2 byte strings: text if UTF-8, else bytes.
            b'U' => {
                let length = usize::from(self.take(1)?[0]);
                self.push_str_or_bytes(length)?;
            }
            b'T' => {
                let length = self.length_u32()?;
                self.push_str_or_bytes(length)?;
            }
            b'C' => {
                let length = usize::from(self.take(1)?[0]);
                self.take(length)?;
                self.stack.push(Value::Bytes);
            }
            b'B' => {
                let length = self.length_u32()?;
                self.take(length)?;
                self.stack.push(Value::Bytes);
            }
            0x8e | 0x96 => {
                let length = self.length_u64()?;
                self.take(length)?;
                self.stack.push(Value::Bytes);
            }
            // Memo.
            b'p' => {
                let id = self.line_id()?;
                self.memoize(id)?;
            }
            b'q' => {
                let id = u64::from(self.take(1)?[0]);
                self.memoize(id)?;
            }
            b'r' => {
                let id = u64::from(u32::from_le_bytes(self.array()?));
                self.memoize(id)?;
            }
            0x94 => {
                let id = self.memo.len() as u64;
                self.memoize(id)?;
            }
            b'g' => {
                let id = self.line_id()?;
                self.recall(id)?;
            }
            b'h' => {
                let id = u64::from(self.take(1)?[0]);
                self.recall(id)?;
            }
            b'j' => {
                let id = u64::from(u32::from_le_bytes(self.array()?));
                self.recall(id)?;
            }
            _ => {
                return Err(
                    "not supported: a memory snapshot holds only dicts, lists, tuples, strings, \
                     numbers, bools and None (no globals or objects)"
                        .to_owned(),
                )
            }
        }
        Ok(None)
    }

    fn take(&mut self, length: usize) -> Step<&'a [u8]> {
        let end = self
            .position
            .checked_add(length)
            .filter(|&end| end <= self.input.len())
            .ok_or_else(|| format!("needs {length} more bytes, the pickle ends first"))?;
        let input = self.input;
        let bytes = &input[self.position..end];
        self.position = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Step<[u8; N]> {
        let bytes = self.take(N)?;
        Ok(bytes.try_into().expect("take returns exactly N bytes"))
    }

    fn length_u32(&mut self) -> Step<usize> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }

    fn length_u64(&mut self) -> Step<usize> {
        usize::try_from(u64::from_le_bytes(self.array()?))
            .map_err(|_| "length does not fit in memory".to_owned())
    }

    /// A text argument: the bytes up to the next newline.
    fn line_bytes(&mut self) -> Step<&'a [u8]> {
        let input = self.input;
        let rest = &input[self.position..];
        let length = rest
            .iter()
            .position(|&byte| byte == b'\n')
            .ok_or("text argument without its newline")?;
        self.position += length + 1;
        Ok(&rest[..length])
    }

    /// A text argument as UTF-8.
    fn line(&mut self) -> Step<&'a str> {
        std::str::from_utf8(self.line_bytes()?).map_err(|_| "text argument is not UTF-8".to_owned())
    }

    fn line_id(&mut self) -> Step<u64> {
        let line = self.line()?;
        line.trim()
            .parse()
            .map_err(|_| format!("memo id {line:?} is not a number"))
    }

    fn push_str(&mut self, length: usize) -> Step<()> {
        let bytes = self.take(length)?;
        let text = match self.strings.get(bytes) {
            Some(shared) => shared.clone(),
            None => {
                let text: Rc<str> = std::str::from_utf8(bytes)
                    .map_err(|_| "string is not UTF-8".to_owned())?
                    .into();
                if length <= SHARED_STRING_MAX {
                    self.strings.insert(bytes, text.clone());
                }
                text
            }
        };
        self.stack.push(Value::Str(text));
        Ok(())
    }

    fn push_str_or_bytes(&mut self, length: usize) -> Step<()> {
        let bytes = self.take(length)?;
        let value = match std::str::from_utf8(bytes) {
            Ok(text) => Value::Str(text.into()),
            Err(_) => Value::Bytes,
        };
        self.stack.push(value);
        Ok(())
    }

    fn memoize(&mut self, id: u64) -> Step<()> {
        let top = self.top()?.clone();
        self.memo.insert(id, top);
        Ok(())
    }

    fn recall(&mut self, id: u64) -> Step<()> {
        let value = self
            .memo
            .get(&id)
            .ok_or_else(|| format!("memo id {id} was never stored"))?
            .clone();
        self.stack.push(value);
        Ok(())
    }

    /// Pops a value, never one below the innermost mark.
    fn pop(&mut self) -> Step<Value> {
        if self.stack.len() <= self.marks.last().copied().unwrap_or(0) {
            return Err("stack underflow".to_owned());
        }
        self.stack.pop().ok_or_else(|| "stack underflow".to_owned())
    }

    fn top(&self) -> Step<&Value> {
        if self.stack.len() <= self.marks.last().copied().unwrap_or(0) {
            return Err("stack underflow".to_owned());
        }
        self.stack
            .last()
            .ok_or_else(|| "stack underflow".to_owned())
    }

    /// Pops everything above the innermost mark, and the mark.
    fn pop_mark(&mut self) -> Step<Vec<Value>> {
        let mark = self.marks.pop().ok_or("no MARK to pop to")?;
        Ok(self.stack.split_off(mark.min(self.stack.len())))
    }

    fn top_list(&self) -> Step<&List> {
        match self.top()? {
            Value::List(list) => Ok(list),
            other => Err(format!("appends to {}, not a list", other.type_name())),
        }
    }

    fn top_dict(&self) -> Step<&Dict> {
        match self.top()? {
            Value::Dict(dict) => Ok(dict),
            other => Err(format!("sets an item of {}, not a dict", other.type_name())),
        }
    }
}

/// Key-value pairs from a flat list of alternating keys and values.
fn pairs(items: Vec<Value>) -> Step<Vec<(Value, Value)>> {
    if !items.len().is_multiple_of(2) {
        return Err("odd number of items for a dict".to_owned());
    }
    let mut entries = Vec::with_capacity(items.len() / 2);
    let mut items = items.into_iter();
    while let (Some(key), Some(value)) = (items.next(), items.next()) {
        entries.push((key, value));
    }
    Ok(entries)
}

/// A two's-complement little-endian integer (LONG1/LONG4).
fn little_endian_int(bytes: &[u8]) -> Value {
    let negative = bytes.last().is_some_and(|&byte| byte & 0x80 != 0);
    let fill = if negative { 0xff } else { 0 };
    let (low, high) = bytes.split_at(bytes.len().min(16));
    // Bytes beyond 16 must be sign extension, and byte 15 must carry the same sign.
    let fits = high.is_empty()
        || (high.iter().all(|&byte| byte == fill) && (low[15] & 0x80 != 0) == negative);
    if !fits {
        return Value::HugeInt;
    }
    let mut buffer = [fill; 16];
    buffer[..low.len()].copy_from_slice(low);
    Value::int(i128::from_le_bytes(buffer))
}

/// A decimal integer argument of the text opcodes.
fn text_int(text: &str) -> Step<Value> {
    let text = text.trim();
    match text.parse::<i128>() {
        Ok(value) => Ok(Value::int(value)),
        Err(_)
            if !text.is_empty()
                && text
                    .trim_start_matches(['-', '+'])
                    .bytes()
                    .all(|b| b.is_ascii_digit()) =>
        {
            Ok(Value::HugeInt)
        }
        Err(_) => Err(format!("{text:?} is not an integer")),
    }
}

/// Python's `raw-unicode-escape` decoding (protocol 0 strings): `\uXXXX` and `\UXXXXXXXX`.
fn raw_unicode_unescape(text: &str) -> Step<String> {
    let mut decoded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(backslash) = rest.find('\\') {
        decoded.push_str(&rest[..backslash]);
        let after = &rest[backslash + 1..];
        let digits = match after.as_bytes().first() {
            Some(b'u') => 4,
            Some(b'U') => 8,
            _ => {
                decoded.push('\\');
                rest = after;
                continue;
            }
        };
        let hex = after
            .get(1..1 + digits)
            .ok_or("truncated \\u escape in a string")?;
        let character = u32::from_str_radix(hex, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| format!("invalid escape \\u{hex} in a string"))?;
        decoded.push(character);
        rest = &after[1 + digits..];
    }
    decoded.push_str(rest);
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(value: &Value) -> i128 {
        match *value {
            Value::Int(signed) => i128::from(signed),
            Value::Unsigned(unsigned) => i128::from(unsigned),
            ref other => panic!("not an int: {other:?}"),
        }
    }

    #[test]
    fn integers_of_every_encoding() {
        let cases: [(&[u8], i128); 7] = [
            (b"K\x05.", 5),
            (b"M\x01\x02.", 0x0201),
            (b"J\xff\xff\xff\xff.", -1),
            (b"\x8a\x06\x00\x00\x00\x00\x00\x7f.", 0x7f00_0000_0000),
            (
                b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.",
                u64::MAX as i128,
            ),
            (b"I-17\n.", -17),
            (b"L12345678901234567890L\n.", 12_345_678_901_234_567_890),
        ];
        for (pickle, expected) in cases {
            assert_eq!(int(&unpickle(pickle).unwrap().root), expected, "{pickle:?}");
        }
        let huge = b"\x8a\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.";
        assert!(matches!(unpickle(huge).unwrap().root, Value::HugeInt));
        assert!(matches!(
            unpickle(b"I01\n.").unwrap().root,
            Value::Bool(true)
        ));
    }

    #[test]
    fn shared_memoised_containers_stay_shared() {
        // d = {}; x = [d, d] with d memoised and fetched again.
        let document = unpickle(b"\x80\x02](}q\x00h\x00e.").unwrap();
        let Value::List(list) = &document.root else {
            panic!()
        };
        let list = list.borrow();
        let (Value::Dict(first), Value::Dict(second)) = (&list[0], &list[1]) else {
            panic!()
        };
        assert!(Rc::ptr_eq(first, second));
    }

    #[test]
    fn errors_name_offset_and_opcode() {
        let message = unpickle(b"\x80\x02cos\nsystem\n.").unwrap_err().to_string();
        assert!(
            message.starts_with("pickle byte 2: opcode 0x63: not supported"),
            "{message}"
        );
        let message = unpickle(b"\x80\x02X\xff\x00\x00\x00ab.")
            .unwrap_err()
            .to_string();
        assert!(message.contains("needs 255 more bytes"), "{message}");
        assert!(unpickle(b"").is_err());
        assert!(unpickle(b"a.").is_err());
        assert!(unpickle(b"(K\x01u.").is_err());
        assert!(unpickle(b"h\x07.").is_err());
        assert!(unpickle(b"\x80\x06.").is_err());
    }

    #[test]
    fn deep_nesting_neither_recurses_nor_overflows() {
        let depth = 1_000_000;
        let mut pickle = vec![b'('; depth];
        pickle.extend(std::iter::repeat_n(b'l', depth));
        pickle.push(b'.');
        let document = unpickle(&pickle).unwrap();
        drop(document);
    }

    #[test]
    fn a_list_that_contains_itself_is_freed() {
        // x = []; x.append(x)
        let document = unpickle(b"\x80\x02]q\x00h\x00a.").unwrap();
        let Value::List(list) = &document.root else {
            panic!()
        };
        let weak = Rc::downgrade(list);
        drop(document);
        assert!(
            weak.upgrade().is_none(),
            "the cycle was broken and the list freed"
        );
    }

    #[test]
    fn protocol_0_strings_unescape() {
        let Value::Str(text) = &unpickle(b"Va\\u00e9b\\\\c\xe9\n.").unwrap().root else {
            panic!()
        };
        assert_eq!(&**text, "a\u{e9}b\\\\c\u{e9}");
    }
}
