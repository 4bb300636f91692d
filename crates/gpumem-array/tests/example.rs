//! The README's example is `examples/batches.rs`, word for word, and it runs.

// The example, compiled into this test: its `main` is an ordinary function here.
include!("../examples/batches.rs");

#[test]
fn the_example_runs() {
    main().unwrap();
}

#[test]
fn the_readme_shows_the_example_as_it_is() {
    let readme = include_str!("../../../README.md");
    let example = include_str!("../examples/batches.rs");
    assert!(
        readme.contains(example),
        "README.md must contain crates/gpumem-array/examples/batches.rs verbatim"
    );
}
