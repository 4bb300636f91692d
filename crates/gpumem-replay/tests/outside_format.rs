//! A trace format read outside gpumem's crates — the recipe "add a trace format" of
//! docs/architecture.md — becomes the one in-memory `Trace`, which validates, replays and
//! writes to every format gpumem has.
//!
//! The toy format is one event per line: `+ADDR SIZE` allocates, `-ADDR` frees, `step` marks
//! a step boundary; `#` starts a comment.

use gpumem_pool::PolicyKind;
use gpumem_replay::{replay, ReplayOptions};
use gpumem_trace::{read, write, Event, Format, ReadOptions, Trace, TraceMeta};

/// Why a toy line could not be read.
#[derive(Debug, PartialEq)]
struct ToyError {
    line: usize,
    what: String,
}

fn read_toy(text: &str) -> Result<Trace, ToyError> {
    let number = |line: usize, word: Option<&str>, what: &str| {
        let word = word.ok_or_else(|| ToyError {
            line,
            what: format!("missing {what}"),
        })?;
        let (digits, radix) = match word.strip_prefix("0x") {
            Some(hex) => (hex, 16),
            None => (word, 10),
        };
        u64::from_str_radix(digits, radix).map_err(|_| ToyError {
            line,
            what: format!("{what} {word:?} is not a number"),
        })
    };
    let mut events = Vec::new();
    let mut steps = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        let mut words = content.split_whitespace();
        match words.next() {
            None => {}
            Some("step") => {
                events.push(Event::Step { index: steps });
                steps += 1;
            }
            Some(word) if word.starts_with('+') => events.push(Event::Alloc {
                addr: number(line, Some(&word[1..]), "address")?,
                size: number(line, words.next(), "size")?,
                stream: 0,
            }),
            Some(word) if word.starts_with('-') => events.push(Event::Free {
                addr: number(line, Some(&word[1..]), "address")?,
                stream: 0,
            }),
            Some(word) => {
                return Err(ToyError {
                    line,
                    what: format!("{word:?} is not +ADDR SIZE, -ADDR or step"),
                })
            }
        }
    }
    let meta = TraceMeta {
        name: "toy".into(),
        source: "toy-format".into(),
        device_total: None,
        extra: Default::default(),
    };
    Ok(Trace::new(meta, events))
}

const TOY: &str = "\
# two steps of a tiny training loop
step
+0x1000 4000000   # weights
+0x2000 8388608   # activations
-0x2000
step
+0x3000 8388608
-0x3000
-0x1000
";

#[test]
fn an_outside_format_reads_replays_and_converts() {
    let trace = read_toy(TOY).unwrap();
    assert_eq!(trace.validate(), Ok(()));
    assert_eq!(trace.summary().peak_live_bytes, 4_000_000 + 8_388_608);

    let report = replay(
        &trace,
        PolicyKind::Torch,
        &ReplayOptions::default(),
        &mut |_| {},
    )
    .unwrap()
    .report;
    assert_eq!(report.steps, 2);
    assert_eq!(report.steady_state_alloc_calls_per_step, Some(0));

    // Written in gpumem's own format and read back, it is the same trace.
    let mut native = Vec::new();
    write(&trace, &mut native, Format::Native).unwrap();
    let back = read(native.as_slice(), ReadOptions::default()).unwrap();
    assert_eq!(back.events, trace.events);

    let bad = read_toy("+0x10 lots\n").unwrap_err();
    assert_eq!(
        bad,
        ToyError {
            line: 1,
            what: "size \"lots\" is not a number".into()
        }
    );
}
