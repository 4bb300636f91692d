//! Writes a generated PyTorch-like memory snapshot: `cargo run --release -p gpumem-bench
//! --example write_snapshot -- OUT.pickle SIZE_MB [--no-frames]`.

use gpumem_bench::snapshot_file::{write_snapshot, Stacks};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(megabytes)) = (args.next(), args.next()) else {
        return Err("usage: write_snapshot OUT.pickle SIZE_MB [--no-frames]".into());
    };
    let stacks = match args.next().as_deref() {
        None => Stacks::Recorded,
        Some("--no-frames") => Stacks::None,
        Some(other) => return Err(format!("unknown option {other}; accepted: --no-frames").into()),
    };
    let megabytes: u64 = megabytes.parse()?;
    let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let generated = write_snapshot(file, megabytes << 20, 1, stacks)?;
    println!("{path}: {generated:?}");
    Ok(())
}
