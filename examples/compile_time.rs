//! Compile time against the number of collectives: chains of 250, 500, 1,000 and 2,000
//! matmuls, each contracting a dim split over `model` and its result kept replicated,
//! so that each needs one all-reduce (counted and checked), compiled for a 2x4 mesh.
//! Prints a table with the time of each phase of the compilation.
//!
//! ```text
//! cargo run --release --example compile_time [-- LENGTH ...]
//! ```

use std::time::Instant;

use gspmd::error::Result;
use gspmd::ir::{Builder, CollectiveKind, DType, Program};
use gspmd::sharding::{Mesh, Sharding};

/// `y = x`, then `links` times `y = y @ w` with `w` split over `model` on its rows
/// and `y` kept replicated: one all-reduce per link.
fn chain(links: usize) -> Result<Program> {
    let b = Builder::new("chain");
    let x = b.parameter("x", [8, 16], DType::F32);
    let w = b.parameter("w", [16, 16], DType::F32);
    let w = w.annotate("(model, _)".parse::<Sharding>()?);
    let replicated = "(_, _)".parse::<Sharding>()?;
    let mut y = x.annotate(replicated.clone());
    for _ in 0..links {
        y = y.matmul(&w).annotate(replicated.clone());
    }
    b.finish(&[&y])
}

fn main() -> Result<()> {
    let parsed: std::result::Result<Vec<usize>, _> =
        std::env::args().skip(1).map(|a| a.parse()).collect();
    let lengths = match parsed {
        Ok(v) if !v.is_empty() => v,
        _ => vec![250, 500, 1000, 2000],
    };
    let mesh = Mesh::new([("data", 2), ("model", 4)])?;
    let mut header = false;
    for links in lengths {
        let program = chain(links)?;
        let start = Instant::now();
        let exe = gspmd::compile(&program, &mesh)?;
        let total = start.elapsed();
        let stats = exe.spmd().collectives();
        let all_reduces = stats
            .by_kind
            .get(&CollectiveKind::AllReduce)
            .map_or(0, |c| c.0);
        let others: usize = (stats.by_kind.iter())
            .filter(|(k, _)| **k != CollectiveKind::AllReduce)
            .map(|(_, c)| c.0)
            .sum();
        assert_eq!(
            (all_reduces, others),
            (links, 0),
            "each link must need exactly one all-reduce"
        );
        let times = exe.compile_times();
        if !header {
            print!("| all-reduces | total s |");
            for (name, _) in &times.phases {
                print!(" {name} s |");
            }
            println!();
            println!("|{}", "---|".repeat(2 + times.phases.len()));
            header = true;
        }
        print!("| {links} | {:.3} |", total.as_secs_f64());
        for (_, d) in &times.phases {
            print!(" {:.3} |", d.as_secs_f64());
        }
        println!();
    }
    Ok(())
}
