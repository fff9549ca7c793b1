//! Source locations: where in the user's code a value was traced.

use std::fmt;

/// A position in the user's source, captured with `#[track_caller]` when an op is traced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    /// Source file as the compiler names it (`src/model.rs`).
    pub file: &'static str,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

impl Location {
    /// The location of the caller of the `#[track_caller]` function that calls this.
    #[track_caller]
    pub fn caller() -> Self {
        let l = std::panic::Location::caller();
        Location {
            file: l.file(),
            line: l.line(),
            column: l.column(),
        }
    }

    /// A location for values that have no user source (built by a pass).
    pub const fn synthetic() -> Self {
        Location {
            file: "<gspmd>",
            line: 0,
            column: 0,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}
