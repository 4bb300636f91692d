//! The committed C header is what cbindgen makes of the Rust source now: regenerate it with
//! `GPUMEM_UPDATE_HEADER=1 cargo test -p gpumem-capi --test header`.

use std::path::Path;

#[test]
fn the_committed_header_matches_the_source() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let path = crate_dir.join("include/gpumem.h");
    if std::env::var_os("GPUMEM_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/gpumem.h differs from the source; regenerate it with \
         GPUMEM_UPDATE_HEADER=1 cargo test -p gpumem-capi --test header"
    );
    for function in [
        "gpumem_torch_alloc",
        "gpumem_cupy_malloc",
        "gpumem_snapshot",
    ] {
        assert!(generated.contains(function), "{function} missing");
    }
}
