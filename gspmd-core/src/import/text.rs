//! The text of a StableHLO module as JAX prints it: its lines cut into functions and
//! statements (an op and its nested regions), and the lexical pieces of an op's text
//! (types, bracketed lists, attributes, dense constants).

use ndarray::{ArrayD, IxDyn};

use crate::ir::Literal;
use crate::types::{DType, TensorType};

/// A module's `sdy.mesh` line and its functions.
pub(super) struct Module<'a> {
    /// The text after `sdy.mesh ` and its line, if the module has a mesh.
    pub mesh: Option<(usize, &'a str)>,
    /// Every `func.func`, in module order.
    pub functions: Vec<Function<'a>>,
}

/// One `func.func`: its line (the signature) and body.
pub(super) struct Function<'a> {
    /// Its `@name` without the `@`.
    pub name: &'a str,
    /// Its line in the module.
    pub line: usize,
    /// The `func.func ...` line.
    pub signature: &'a str,
    /// Its statements, ending with a `return`.
    pub body: Vec<Stmt>,
}

/// An op: its line, its text (the head line, then for the generic form the text after
/// the regions' closing `})`: the op's type) and its regions.
pub(super) struct Stmt {
    /// The head's line in the module.
    pub line: usize,
    /// The op's text without its regions.
    pub text: String,
    /// Its regions in order (`cond`, `do`; a reducer; a case's branches).
    pub regions: Vec<Region>,
}

/// A region's statements (its header, `^bb0(..):`, `reducer(..) {`, `cond {` or
/// `} do {`, is skipped: the ops that read regions know their arguments' order).
pub(super) struct Region {
    /// The statements, the last a `stablehlo.return`.
    pub body: Vec<Stmt>,
}

/// `text` cut into functions and statements; `Err((line, message))` where the
/// nesting does not close.
pub(super) fn parse_module(text: &str) -> Result<Module<'_>, (usize, String)> {
    let lines: Vec<(usize, &str)> = (text.lines().enumerate())
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with("//"))
        .collect();
    let mut module = Module {
        mesh: None,
        functions: Vec::new(),
    };
    let mut i = 0;
    while i < lines.len() {
        let (n, line) = lines[i];
        i += 1;
        if let Some(rest) = line.strip_prefix("sdy.mesh ") {
            module.mesh = Some((n, rest));
        } else if line.starts_with("func.func") {
            let name = (line.split('@').nth(1))
                .and_then(|r| r.split('(').next())
                .ok_or((n, "a function without a name".to_string()))?;
            let body = block(&lines, &mut i)?;
            match lines.get(i) {
                Some((_, "}")) => i += 1,
                _ => return Err((n, format!("function @{name} is not closed"))),
            }
            module.functions.push(Function {
                name,
                line: n,
                signature: line,
                body,
            });
        }
    }
    Ok(module)
}

/// The net count of `{` over `}` in `line`, outside quotes.
fn braces(line: &str) -> i32 {
    let mut quoted = false;
    let mut net = 0;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => net += 1,
            '}' if !quoted => net -= 1,
            _ => {}
        }
    }
    net
}

/// The statements from `lines[*i]` up to the `}` that closes their region (left in
/// place for the caller).
fn block(lines: &[(usize, &str)], i: &mut usize) -> Result<Vec<Stmt>, (usize, String)> {
    let mut stmts = Vec::new();
    while let Some(&(n, line)) = lines.get(*i) {
        if line.starts_with('}') {
            return Ok(stmts);
        }
        *i += 1;
        let mut stmt = Stmt {
            line: n,
            text: line.to_string(),
            regions: Vec::new(),
        };
        let unclosed = || (n, format!("the regions of `{line}` are not closed"));
        let next = lines.get(*i).map_or("", |l| l.1);
        if braces(line) > 0 {
            // The generic form: `"op"(..) ({ ^bb0(..): .. }, { .. }) : type`.
            loop {
                if lines.get(*i).is_some_and(|(_, h)| h.starts_with("^bb")) {
                    *i += 1;
                }
                let body = block(lines, i)?;
                stmt.regions.push(Region { body });
                let &(_, close) = lines.get(*i).ok_or_else(unclosed)?;
                *i += 1;
                if close.starts_with("}, {") {
                    continue;
                }
                let tail = close.trim_start_matches('}').trim_start_matches(')');
                stmt.text.push(' ');
                stmt.text.push_str(tail.trim());
                break;
            }
        } else if next == "cond {" || next.starts_with("reducer(") {
            // The pretty forms: `while(..) : types cond { .. } do { .. }` and
            // `reduce(..) .. : type reducer(..) { .. }`.
            *i += 1;
            loop {
                let body = block(lines, i)?;
                stmt.regions.push(Region { body });
                let &(_, close) = lines.get(*i).ok_or_else(unclosed)?;
                *i += 1;
                if close == "}" {
                    break;
                }
            }
        }
        stmts.push(stmt);
    }
    Err((
        lines.last().map_or(0, |l| l.0),
        "a region is not closed".into(),
    ))
}

/// The index of the bracket closing the one at `open`.
pub(super) fn matching(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in text.char_indices().skip_while(|&(i, _)| i < open) {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' if !text[..i].ends_with('-') => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `text` split at the commas outside brackets and quotes.
pub(super) fn split_top(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start, mut quoted) = (Vec::new(), 0i32, 0, false);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' | '[' | '{' | '<' if !quoted => depth += 1,
            ')' | ']' | '}' | '>' if !quoted && !text[..i].ends_with('-') => depth -= 1,
            ',' if depth == 0 && !quoted => {
                parts.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !text[start..].trim().is_empty() {
        parts.push(text[start..].trim());
    }
    parts
}

/// `tensor<8x16xf32>` (a leading part of `text`).
pub(super) fn parse_type(text: &str) -> Result<TensorType, String> {
    let inner = text
        .trim()
        .strip_prefix("tensor<")
        .and_then(|t| t.split('>').next())
        .ok_or_else(|| format!("`{text}` is not a ranked tensor type"))?;
    let mut parts: Vec<&str> = inner.split('x').collect();
    let elem = parts.pop().unwrap_or("");
    let dtype = match elem {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "i32" => DType::I32,
        "i1" => DType::Bool,
        other => return Err(format!("element type {other} is outside gspmd's dtypes")),
    };
    let shape = (parts.iter())
        .map(|d| {
            d.parse::<usize>()
                .map_err(|_| format!("dim `{d}` of `{text}` is not static"))
        })
        .collect::<Result<Vec<usize>, String>>()?;
    Ok(TensorType::new(shape, dtype))
}

/// The result types after an op's last ` : `: those after `->` (one, or a
/// parenthesised list), else the one type (`: tensor<..>`), else a list without
/// arrow (a while's `: t1, t2`).
pub(super) fn result_types(text: &str) -> Result<Vec<TensorType>, String> {
    let after = text.rsplit_once(" : ").map_or("", |(_, t)| t);
    let t = after.rsplit("->").next().unwrap_or(after).trim();
    let t = t
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or(t);
    split_top(t).into_iter().map(parse_type).collect()
}

/// The `[a, b]` list of naturals after `key` in `text` (`key` empty: at its start).
pub(super) fn list_after(text: &str, key: &str) -> Option<Vec<usize>> {
    ints_after(text, key)?
        .into_iter()
        .map(|v| usize::try_from(v).ok())
        .collect()
}

/// The `[a, b]` list of integers (or `array<i64: a, b>`) after `key` in `text` (`key`
/// empty: at its start).
pub(super) fn ints_after(text: &str, key: &str) -> Option<Vec<i64>> {
    let at = if key.is_empty() {
        0
    } else {
        text.find(key)? + key.len()
    };
    let rest = text[at..].trim_start();
    let inner = if let Some(rest) = rest.strip_prefix("array<i64") {
        let rest = rest.strip_prefix(':').unwrap_or(rest);
        rest.split('>').next()?
    } else {
        rest.strip_prefix('[')?.split(']').next()?
    };
    (inner.split(',').map(str::trim).filter(|s| !s.is_empty()))
        .map(|s| s.parse().ok())
        .collect()
}

/// The number after `key` in `text`.
pub(super) fn number_after(text: &str, key: &str) -> Option<usize> {
    let at = text.find(key)? + key.len();
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The pairs of a `padding = dense<..> : tensor<Nx2xi64>` attribute (all zero if
/// absent; one pair per dim of a rank-`rank` operand).
pub(super) fn padding_after(text: &str, key: &str, rank: usize) -> Result<Vec<(i64, i64)>, String> {
    let Some(at) = text.find(key) else {
        return Ok(vec![(0, 0); rank]);
    };
    let rest = &text[at + key.len()..];
    let open = rest.find('<').ok_or("padding: no dense value")?;
    let close = matching(rest, open).ok_or("padding: unclosed")?;
    let values = (rest[open + 1..close].split(['[', ']', ',']))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().map_err(|_| format!("padding `{s}`")))
        .collect::<Result<Vec<i64>, String>>()?;
    match values.as_slice() {
        [v] => Ok(vec![(*v, *v); rank]),
        _ if values.len() == 2 * rank => Ok(values.chunks(2).map(|p| (p[0], p[1])).collect()),
        _ => Err(format!(
            "padding has {} values for rank {rank}",
            values.len()
        )),
    }
}

/// The `dense<..>` of a constant: a splat or a nested list of numbers.
pub(super) fn parse_dense(text: &str, ty: &TensorType) -> Result<Literal, String> {
    let at = text.find("dense<").ok_or("constant: no dense value")? + "dense<".len();
    let close = matching(text, at - 1).ok_or("constant: unclosed dense value")?;
    let inner = &text[at..close];
    if inner.starts_with('"') {
        return Err("constant: hex data is outside the imported subset".into());
    }
    let values = (inner.split(['[', ']', ',']))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "true" => Ok(1.0),
            "false" => Ok(0.0),
            _ => element(s, ty.dtype),
        })
        .collect::<Result<Vec<f64>, String>>()?;
    let count: usize = ty.shape.iter().product();
    match values.as_slice() {
        [v] => Ok(Literal::full(&ty.shape, ty.dtype, *v)),
        _ if values.len() == count => {
            let f32s = ArrayD::from_shape_vec(
                IxDyn(&ty.shape),
                values.iter().map(|&v| v as f32).collect(),
            )
            .map_err(|e| e.to_string())?;
            Ok(Literal::F32(f32s).convert(ty.dtype))
        }
        _ => Err(format!("constant has {} values for {ty}", values.len())),
    }
}

/// A constant's element: a decimal, or a float's bit pattern in hex as MLIR writes
/// infinities and NaNs (`0xFF800000`).
fn element(s: &str, dtype: DType) -> Result<f64, String> {
    let bad = || format!("constant element `{s}` is not a number");
    let Some(hex) = s.strip_prefix("0x") else {
        return s.parse::<f64>().map_err(|_| bad());
    };
    let bits = u32::from_str_radix(hex, 16).map_err(|_| bad())?;
    Ok(match dtype {
        DType::F32 => f64::from(f32::from_bits(bits)),
        DType::BF16 => half::bf16::from_bits(bits as u16).to_f64(),
        DType::F16 => half::f16::from_bits(bits as u16).to_f64(),
        DType::I32 => f64::from(bits as i32),
        DType::Bool => f64::from(u8::from(bits != 0)),
    })
}

/// The integers in `text` up to its first `]]` (a nested list such as a
/// convolution's `[[1, 1], [0, 2]]`).
pub(super) fn int_list(text: &str) -> Vec<i64> {
    let end = text.find("]]").map_or(text.len(), |e| e + 2);
    (text[..end].split(['[', ']', ',']))
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}
