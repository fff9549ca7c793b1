//! The README quotes what the examples print; these tests keep the quotes true. (Its
//! Rust code blocks, and docs/dsl.md's, are doctests of the `gspmd` crate.)

// The example's `main` is not called here.
#[allow(dead_code)]
#[path = "../examples/mlp.rs"]
mod mlp_example;

/// Every program or collective line (`%N ...`) the README quotes from
/// `examples/mlp.rs` is a line of that example's report — value number, op, operands, local type, sharding and source line.
#[test]
fn readme_quotes_the_mlp_example_report() {
    let readme = include_str!("../README.md");
    let quoted: Vec<&str> = (readme.lines())
        .map(str::trim)
        .filter(|l| l.starts_with('%') && l.contains("// examples/mlp.rs:"))
        .collect();
    assert!(
        !quoted.is_empty(),
        "the README quotes no line of the mlp example"
    );
    let (_, _, exe) = mlp_example::compiled().unwrap();
    // Included from here, the example's locations read `tests/../examples/mlp.rs`.
    let report = exe.report().replace("tests/../examples/", "examples/");
    for line in quoted {
        assert!(
            report.lines().any(|l| l.trim() == line),
            "the README quotes\n  {line}\nwhich `cargo run --example mlp` does not print:\n{report}"
        );
    }
}
