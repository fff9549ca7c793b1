//! Parameters by name: a model's parameters form a tree of dotted names
//! (`layers.attn.wq`), and a [`Trainable`] picks the trained ones by glob patterns
//! (`layers.*`) or by index; [`glob_match`] is the pattern language, shared with the
//! optimizers' parameter masks ([`Mask`](super::Mask)) and the
//! initialisers ([`Init`](super::Init)).

use crate::error::{Error, RequestProblem, Result};
use crate::ir::Program;

/// Whether `name` matches the glob `pattern`: `*` stands for any run of characters
/// (dots included, so `layers.*` matches `layers.0.attn.wq`), every other character for
/// itself. A pattern without `*` matches exactly one name.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    // Greedy match with backtracking to the last `*`: linear in practice, exact always.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

/// Whether `name` matches any of `patterns`.
pub fn glob_match_any<S: AsRef<str>>(patterns: &[S], name: &str) -> bool {
    patterns.iter().any(|p| glob_match(p.as_ref(), name))
}

/// Which model parameters a training step updates; the others are data inputs (given
/// anew each step: batches, targets, frozen weights).
///
/// Built from glob patterns over the parameters' names (`&["layers.*", "embed"]`,
/// [`Trainable::patterns`]) or from parameter indices (`&[3, 4]`, `&indices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trainable {
    /// These parameter indices, in this order.
    Indices(Vec<usize>),
    /// Every parameter whose name matches one of these patterns ([`glob_match`]), in index
    /// order.
    Patterns(Vec<String>),
}

impl Trainable {
    /// The parameters whose names match any of `patterns`.
    pub fn patterns<S: AsRef<str>>(patterns: &[S]) -> Self {
        Trainable::Patterns(patterns.iter().map(|p| p.as_ref().to_string()).collect())
    }

    /// The parameter indices of `model` this selects. Errors
    /// ([`Error::TrainRequest`]): a pattern that matches no parameter (a typo would
    /// otherwise silently freeze a weight); a parameter that two patterns select (a
    /// pattern repeated, or overlapping ones), as a repeated index is. Indices are
    /// checked by the step builder.
    pub fn resolve(&self, model: &Program) -> Result<Vec<usize>> {
        match self {
            Trainable::Indices(indices) => Ok(indices.clone()),
            Trainable::Patterns(patterns) => {
                let names = param_names(model);
                if let Some(unused) = patterns
                    .iter()
                    .find(|p| !names.iter().any(|n| glob_match(p, n)))
                {
                    return Err(Error::TrainRequest {
                        program: model.name.clone(),
                        problem: RequestProblem::UnmatchedPattern {
                            pattern: unused.clone(),
                            names,
                        },
                    });
                }
                // A parameter two patterns select (a pattern given twice, or two that
                // overlap) is refused, as an index given twice is.
                for name in &names {
                    let mut matching = patterns.iter().filter(|p| glob_match(p, name));
                    if let (Some(first), Some(second)) = (matching.next(), matching.next()) {
                        return Err(Error::TrainRequest {
                            program: model.name.clone(),
                            problem: RequestProblem::OverlappingPatterns {
                                first: first.clone(),
                                second: second.clone(),
                                name: name.clone(),
                            },
                        });
                    }
                }
                Ok((0..names.len())
                    .filter(|&i| glob_match_any(patterns, &names[i]))
                    .collect())
            }
        }
    }
}

/// The name of each parameter of `model`, in index order (`%<index>` for an unnamed
/// one).
pub fn param_names(model: &Program) -> Vec<String> {
    model
        .params
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            model
                .node(p)
                .name
                .clone()
                .unwrap_or_else(|| format!("%{i}"))
        })
        .collect()
}

impl From<&[usize]> for Trainable {
    fn from(indices: &[usize]) -> Self {
        Trainable::Indices(indices.to_vec())
    }
}

impl From<&Vec<usize>> for Trainable {
    fn from(indices: &Vec<usize>) -> Self {
        Trainable::Indices(indices.clone())
    }
}

impl<const N: usize> From<&[usize; N]> for Trainable {
    fn from(indices: &[usize; N]) -> Self {
        Trainable::Indices(indices.to_vec())
    }
}

impl From<&[&str]> for Trainable {
    fn from(patterns: &[&str]) -> Self {
        Trainable::patterns(patterns)
    }
}

impl<const N: usize> From<&[&str; N]> for Trainable {
    fn from(patterns: &[&str; N]) -> Self {
        Trainable::patterns(patterns)
    }
}

impl From<&Trainable> for Trainable {
    fn from(trainable: &Trainable) -> Self {
        trainable.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        assert!(glob_match("layers.*", "layers.0.attn.wq"));
        assert!(glob_match("*.bias", "layers.ffn.bias"));
        assert!(!glob_match("*.bias", "layers.ffn.bias2"));
        assert!(glob_match("embed", "embed"));
        assert!(!glob_match("embed", "embed.x"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXbYbc"));
        assert!(!glob_match("a*b*c", "aXbYb"));
        assert!(glob_match("layers.*.w*", "layers.3.w1"));
    }
}
