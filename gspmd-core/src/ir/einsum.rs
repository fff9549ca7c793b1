//! `einsum("bsd,df->bsf", &x, &w)`: Einstein summation over one or two operands,
//! lowered to `reduce`, `dot_general` and `transpose`.
//!
//! Letters in both operands and the output are batch dims; in both operands but not the
//! output, contracting dims; in one operand only and not the output, summed first.
//! A letter may appear once per operand (no diagonals).

use super::builder::{Tensor, any_poisoned, push, push_at, push_reduce};
use super::op::{DotDims, Op, ReduceKind};
use crate::types::Location;

struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

fn parse(spec: &str, operands: &[&Tensor]) -> Result<Spec, String> {
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, out) = spec.split_once("->").ok_or("missing `->`")?;
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    let output: Vec<char> = out.chars().collect();
    if inputs.len() != operands.len() {
        return Err(format!(
            "{} operand specs for {} operands",
            inputs.len(),
            operands.len()
        ));
    }
    for (i, (letters, t)) in inputs.iter().zip(operands).enumerate() {
        if letters.len() != t.rank() {
            return Err(format!(
                "operand {i} spec `{}` has {} letters but the operand is {}",
                letters.iter().collect::<String>(),
                letters.len(),
                t.ty()
            ));
        }
    }
    for letters in inputs.iter().chain(std::iter::once(&output)) {
        for (j, c) in letters.iter().enumerate() {
            if !c.is_ascii_alphabetic() {
                return Err(format!("`{c}` is not a letter"));
            }
            if letters[..j].contains(c) {
                return Err(format!("letter `{c}` repeated within one term"));
            }
        }
    }
    for c in &output {
        if !inputs.iter().any(|l| l.contains(c)) {
            return Err(format!("output letter `{c}` appears in no operand"));
        }
    }
    // Sizes of a letter must agree across operands.
    for (i, a) in inputs.iter().enumerate() {
        for (j, b) in inputs.iter().enumerate().skip(i + 1) {
            for (da, c) in a.iter().enumerate() {
                if let Some(db) = b.iter().position(|x| x == c) {
                    let (sa, sb) = (operands[i].shape()[da], operands[j].shape()[db]);
                    if sa != sb {
                        return Err(format!(
                            "letter `{c}` is {sa} in operand {i} but {sb} in operand {j}"
                        ));
                    }
                }
            }
        }
    }
    Ok(Spec { inputs, output })
}

/// Sums away the letters of `t` that no other term (`keep`) mentions.
fn sum_unused(
    t: &Tensor,
    letters: &[char],
    keep: &[&[char]],
    location: Location,
) -> (Tensor, Vec<char>) {
    let unused: Vec<isize> = (0..letters.len())
        .filter(|&d| !keep.iter().any(|k| k.contains(&letters[d])))
        .map(|d| d as isize)
        .collect();
    if unused.is_empty() {
        return (t.clone(), letters.to_vec());
    }
    let kept: Vec<char> = letters
        .iter()
        .enumerate()
        .filter(|(d, _)| !unused.contains(&(*d as isize)))
        .map(|(_, &c)| c)
        .collect();
    (
        push_reduce(t, ReduceKind::Sum, &unused, false, location),
        kept,
    )
}

/// Transposes `t` (whose dims are `letters`) into the order of `output`.
fn permute_to(t: &Tensor, letters: &[char], output: &[char], location: Location) -> Tensor {
    let perm: Vec<usize> = output
        .iter()
        .filter_map(|c| letters.iter().position(|x| x == c))
        .collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        t.clone()
    } else {
        push_at(t, Op::Transpose(perm), location)
    }
}

/// Einstein summation of two operands, e.g. `einsum("bsd,df->bsf", &x, &w)`; see the
/// module docs. The one-operand form is [`Tensor::einsum`].
#[track_caller]
pub fn einsum(spec: &str, lhs: &Tensor, rhs: &Tensor) -> Tensor {
    einsum_at(spec, &[lhs, rhs], Location::caller())
}

impl Tensor {
    /// One-operand Einstein summation: transposes and sums, e.g. `x.einsum("bsd->bd")`.
    #[track_caller]
    pub fn einsum(&self, spec: &str) -> Tensor {
        einsum_at(spec, &[self], Location::caller())
    }
}

fn einsum_at(spec: &str, operands: &[&Tensor], location: Location) -> Tensor {
    let first = operands[0];
    if any_poisoned(operands) {
        return first.poisoned();
    }
    let spec_parsed = match parse(spec, operands) {
        Ok(s) => s,
        Err(message) => return first.fail("einsum", location, format!("`{spec}`: {message}")),
    };
    let Spec { inputs, output } = spec_parsed;
    match operands {
        [a] => {
            let (t, letters) = sum_unused(a, &inputs[0], &[&output], location);
            permute_to(&t, &letters, &output, location)
        }
        [a, b] => {
            let (a, la) = sum_unused(a, &inputs[0], &[&output, &inputs[1]], location);
            let (b, lb) = sum_unused(b, &inputs[1], &[&output, &inputs[0]], location);
            let shared: Vec<char> = la.iter().filter(|c| lb.contains(c)).copied().collect();
            let (batch, contracting): (Vec<char>, Vec<char>) =
                shared.iter().partition(|c| output.contains(c));
            let pos = |l: &[char], c: &char| l.iter().position(|x| x == c).unwrap_or(0);
            let dims = DotDims {
                lhs_batch: batch.iter().map(|c| pos(&la, c)).collect(),
                rhs_batch: batch.iter().map(|c| pos(&lb, c)).collect(),
                lhs_contracting: contracting.iter().map(|c| pos(&la, c)).collect(),
                rhs_contracting: contracting.iter().map(|c| pos(&lb, c)).collect(),
            };
            let mut letters = batch.clone();
            letters.extend(la.iter().filter(|c| !shared.contains(c)));
            letters.extend(lb.iter().filter(|c| !shared.contains(c)));
            let d = push(&a, Op::DotGeneral(dims), &[&b], location);
            permute_to(&d, &letters, &output, location)
        }
        _ => unreachable!("einsum_at is called with one or two operands"),
    }
}
