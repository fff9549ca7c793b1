//! [`CompileTimes`]: how long each phase of one compilation took, so that a slow
//! compilation names its culprit (`examples/compile_time.rs` prints them).

use std::fmt;
use std::time::{Duration, Instant};

/// Wall-clock time per phase of one [`compile_with`](crate::compile_with), in the order
/// the phases first ran. A phase that runs several times (the gather choice builds and
/// analyses one program per trial) is one entry with the sum of its runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompileTimes {
    /// Phase name → time spent in it.
    pub phases: Vec<(&'static str, Duration)>,
}

impl CompileTimes {
    /// Runs `f` and adds its time to phase `name`.
    pub(crate) fn time<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let result = f();
        let elapsed = start.elapsed();
        match self.phases.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += elapsed,
            None => self.phases.push((name, elapsed)),
        }
        result
    }

    /// The time of phase `name` (zero if it did not run).
    pub fn phase(&self, name: &str) -> Duration {
        (self.phases.iter())
            .find(|(n, _)| *n == name)
            .map_or(Duration::ZERO, |(_, d)| *d)
    }

    /// The sum of every phase.
    pub fn total(&self) -> Duration {
        self.phases.iter().map(|(_, d)| *d).sum()
    }
}

impl fmt::Display for CompileTimes {
    /// `propagate 1.2 ms, partition 3.4 ms, ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, d)) in self.phases.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{name} {:.1} ms", d.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::{Builder, DType};
    use crate::sharding::{Mesh, Sharding};

    #[test]
    fn a_compilation_times_each_phase_once_in_order() {
        let b = Builder::new("mlp");
        let x = b.parameter("x", [8, 16], DType::F32);
        let w = b.parameter("w", [16, 4], DType::F32);
        let w = w.annotate("(model, _)".parse::<Sharding>().unwrap());
        let program = b.finish(&[&x.matmul(&w)]).unwrap();
        let mesh = Mesh::new([("model", 4)]).unwrap();
        let times = crate::compile(&program, &mesh)
            .unwrap()
            .compile_times()
            .clone();
        let names: Vec<&str> = times.phases.iter().map(|(n, _)| *n).collect();
        let want = [
            "verify",
            "simplify",
            "propagate",
            "partition",
            "simplify sharded",
            "regather candidates",
            "regather",
            "combine",
        ];
        assert_eq!(names, want);
        assert!(times.phase("partition") <= times.total());
        assert_eq!(times.phase("memory analysis"), std::time::Duration::ZERO);
        assert!(times.to_string().starts_with("verify "), "{times}");
    }
}
