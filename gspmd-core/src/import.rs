//! StableHLO with Shardy shardings into a gspmd [`Program`]: the reverse of
//! [`crate::export`] for a small op subset, so that a JAX model's sharding
//! (`jax.jit(f).lower(..).as_text()`) can be propagated, partitioned and studied with
//! gspmd's `why:` lines and analyses.
//!
//! It reads the pretty form JAX writes: the `sdy.mesh`, `@main`'s arguments with their
//! `sdy.sharding` (annotations of the parameters) and results (constraints on the
//! outputs), and one op a line: constants, the elementwise ops, `compare`, `select`,
//! `convert`, `broadcast_in_dim`, `reshape`, `transpose`, `dot_general`, `reduce`
//! (`applies stablehlo.add|maximum|minimum`), `iota`, `concatenate` and
//! `sdy.sharding_constraint`. Anything else (regions, calls, other ops) is an
//! [`Error::Import`] naming the line and the op. Each node's location is its line of
//! the module (file `<stablehlo>`), which reports and errors print.

use ndarray::{ArrayD, IxDyn};

use crate::error::{Error, Result};
use crate::ir::{
    BinaryOp, CompareOp, DotDims, Literal, Op, Program, ReduceKind, UnaryOp, ValueId, verify,
};
use crate::sharding::{DimSharding, Mesh, Sharding};
use crate::types::{DType, Location, TensorType};

/// A program read from StableHLO and the mesh its shardings name.
#[derive(Debug, Clone)]
pub struct Imported {
    /// `@main` as a gspmd program: parameters annotated with their `sdy.sharding`,
    /// outputs constrained to theirs.
    pub program: Program,
    /// The module's `sdy.mesh` (no axes if it has none).
    pub mesh: Mesh,
}

/// Reads `text`, a StableHLO module as `jax.jit(f).lower(..).as_text()` writes it;
/// verifies the program. [`Error::Import`] names the first line it cannot read.
pub fn from_stablehlo(text: &str) -> Result<Imported> {
    let mut mesh = Mesh::new(Vec::<(String, usize)>::new())?;
    let mut reader = Reader {
        program: Program::new("imported"),
        names: Vec::new(),
    };
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    let mut results: Vec<Option<Sharding>> = Vec::new();
    for (n, line) in lines.by_ref() {
        if let Some(rest) = line.strip_prefix("sdy.mesh ") {
            mesh = parse_mesh(rest).map_err(|m| error(n, m))?;
        } else if line.starts_with("func.func public @main(") {
            results = reader.signature(n, line, &mesh)?;
            break;
        } else if line.starts_with("func.func") {
            return Err(error(
                n,
                "a function other than a public @main comes first".into(),
            ));
        }
    }
    for (n, line) in lines {
        if let Some(rest) = line
            .strip_prefix("return ")
            .or_else(|| line.strip_prefix("func.return "))
        {
            let operands = rest.split(" : ").next().unwrap_or("");
            let outputs = (operands.split(',').map(str::trim))
                .map(|name| reader.value(n, name))
                .collect::<Result<Vec<ValueId>>>()?;
            reader.program.outputs = outputs;
            for (j, sharding) in results.iter().enumerate() {
                if let (Some(s), true) = (sharding, j < reader.program.outputs.len()) {
                    reader.program.constrain_output(j, s.clone(), false);
                }
            }
            verify(&reader.program)?;
            return Ok(Imported {
                program: reader.program,
                mesh,
            });
        }
        reader.op_line(n, line, &mesh)?;
    }
    Err(error(text.lines().count(), "no return in @main".into()))
}

fn error(line: usize, message: String) -> Error {
    Error::Import { line, message }
}

fn location(line: usize) -> Location {
    Location {
        file: "<stablehlo>",
        line: line as u32,
        column: 1,
    }
}

/// The program being read and the MLIR name of each of its values.
struct Reader {
    program: Program,
    names: Vec<(String, ValueId)>,
}

impl Reader {
    fn value(&self, line: usize, name: &str) -> Result<ValueId> {
        (self.names.iter().rev())
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
            .ok_or_else(|| error(line, format!("value {name} is not defined")))
    }

    /// `@main`'s arguments as annotated parameters; its results' shardings.
    fn signature(&mut self, n: usize, line: &str, mesh: &Mesh) -> Result<Vec<Option<Sharding>>> {
        let open = line.find('(').unwrap_or(0);
        let close =
            matching(line, open).ok_or_else(|| error(n, "unclosed argument list".into()))?;
        for (index, arg) in split_top(&line[open + 1..close]).into_iter().enumerate() {
            let (name, rest) = arg
                .split_once(':')
                .ok_or_else(|| error(n, format!("argument `{arg}` has no type")))?;
            let ty = parse_type(rest.trim()).map_err(|m| error(n, m))?;
            let op = Op::Parameter { index, ty };
            let id = (self.program.push_op(op, &[], location(n)))?;
            let node = self.program.node_mut(id);
            node.name = Some(name.trim().trim_start_matches('%').to_string());
            node.annotation = sdy_sharding(rest, mesh).map_err(|m| error(n, m))?;
            self.program.params.push(id);
            self.names.push((name.trim().to_string(), id));
        }
        let results = line[close..].split_once("->").map_or("", |(_, r)| r).trim();
        let results = results.trim_end_matches('{').trim();
        let results = results
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or(results);
        split_top(results)
            .into_iter()
            .map(|r| sdy_sharding(r, mesh).map_err(|m| error(n, m)))
            .collect()
    }

    /// One `%name = op ...` line.
    fn op_line(&mut self, n: usize, line: &str, mesh: &Mesh) -> Result<()> {
        let (lhs, rhs) = line
            .split_once(" = ")
            .ok_or_else(|| error(n, format!("not an op of one result: `{line}`")))?;
        let lhs = lhs.trim();
        if lhs.contains(':') || lhs.contains(',') {
            return Err(error(n, format!("an op of several results: `{line}`")));
        }
        let op_name: String = (rhs.chars())
            .take_while(|c| !c.is_whitespace() && *c != '(')
            .collect();
        let (body, ty_text) = rhs.rsplit_once(" : ").unwrap_or((rhs, ""));
        let result = result_type(ty_text).map_err(|m| error(n, m))?;
        let operands = self.operands(n, &body[op_name.len()..])?;
        let attr = |key: &str| -> Result<Vec<usize>> {
            list_after(body, key).ok_or_else(|| error(n, format!("{op_name}: no `{key}` list")))
        };
        let unsupported = || error(n, format!("{op_name} is outside the imported op subset"));
        let op = match op_name.as_str() {
            "stablehlo.constant" => {
                Op::Constant(parse_dense(body, &result).map_err(|m| error(n, m))?)
            }
            "stablehlo.broadcast_in_dim" => Op::Broadcast {
                shape: result.shape.clone(),
                dims: attr("dims =")?,
            },
            "stablehlo.reshape" => Op::Reshape(result.shape.clone()),
            "stablehlo.transpose" => Op::Transpose(attr("dims =")?),
            "stablehlo.convert" => Op::Convert(result.dtype),
            "stablehlo.select" => Op::Select,
            "stablehlo.iota" => Op::Iota {
                shape: result.shape.clone(),
                dim: number_after(body, "dim =").ok_or_else(|| error(n, "iota: no dim".into()))?,
                dtype: result.dtype,
            },
            "stablehlo.concatenate" => Op::Concatenate(
                number_after(body, "dim =")
                    .ok_or_else(|| error(n, "concatenate: no dim".into()))?,
            ),
            "stablehlo.dot_general" => {
                let pair = |key: &str| -> (Vec<usize>, Vec<usize>) {
                    let lhs = list_after(body, key).unwrap_or_default();
                    let rhs = (body.find(key))
                        .and_then(|at| body[at..].find(" x ").map(|x| at + x + 3))
                        .and_then(|at| list_after(&body[at..], ""))
                        .unwrap_or_default();
                    (lhs, rhs)
                };
                let (lhs_batch, rhs_batch) = pair("batching_dims =");
                let (lhs_contracting, rhs_contracting) = pair("contracting_dims =");
                Op::DotGeneral(DotDims {
                    lhs_batch,
                    rhs_batch,
                    lhs_contracting,
                    rhs_contracting,
                })
            }
            "stablehlo.reduce" => {
                let kind = match body
                    .split("applies ")
                    .nth(1)
                    .map(|r| r.split_whitespace().next())
                {
                    Some(Some("stablehlo.add")) => ReduceKind::Sum,
                    Some(Some("stablehlo.maximum")) => ReduceKind::Max,
                    Some(Some("stablehlo.minimum")) => ReduceKind::Min,
                    _ => {
                        return Err(error(
                            n,
                            "reduce: only `applies stablehlo.add|maximum|minimum`".into(),
                        ));
                    }
                };
                let dims = attr("dimensions =")?;
                return self.reduce(n, lhs, kind, dims, &operands);
            }
            "sdy.sharding_constraint" => {
                let at = body
                    .find('<')
                    .ok_or_else(|| error(n, "constraint: no sharding".into()))?;
                let sharding = parse_sharding(&body[at..], mesh).map_err(|m| error(n, m))?;
                let id = self
                    .program
                    .push_op(Op::ShardingConstraint, &operands, location(n))?;
                self.program.node_mut(id).annotation = Some(sharding);
                self.names.push((lhs.to_string(), id));
                return Ok(());
            }
            "stablehlo.compare" => {
                let words: Vec<&str> = body[op_name.len()..]
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|w| !w.is_empty())
                    .collect();
                let direction = match words.first().copied() {
                    Some("EQ") => CompareOp::Eq,
                    Some("NE") => CompareOp::Ne,
                    Some("LT") => CompareOp::Lt,
                    Some("LE") => CompareOp::Le,
                    Some("GT") => CompareOp::Gt,
                    Some("GE") => CompareOp::Ge,
                    _ => return Err(error(n, "compare: no direction".into())),
                };
                Op::Compare(direction)
            }
            name => match (unary(name), binary(name)) {
                (Some(u), _) => Op::Unary(u),
                (_, Some(b)) => Op::Binary(b),
                (None, None) => return Err(unsupported()),
            },
        };
        let id = self.program.push_op(op, &operands, location(n))?;
        self.names.push((lhs.to_string(), id));
        Ok(())
    }

    /// `reduce(x init: c)`: the reduction, combined with `c` unless `c` is the
    /// kind's identity (gspmd's reduce starts from the identity).
    fn reduce(
        &mut self,
        n: usize,
        lhs: &str,
        kind: ReduceKind,
        dims: Vec<usize>,
        operands: &[ValueId],
    ) -> Result<()> {
        let [x, init] = operands else {
            return Err(error(
                n,
                "reduce: one operand and one init value expected".into(),
            ));
        };
        let id = self
            .program
            .push_op(Op::Reduce { kind, dims }, &[*x], location(n))?;
        let identity = match kind {
            ReduceKind::Sum => 0.0,
            ReduceKind::Max => f64::NEG_INFINITY,
            ReduceKind::Min => f64::INFINITY,
        };
        let init_is_identity = match &self.program.node(*init).op {
            Op::Constant(lit) => {
                let ty = self.program.ty(*init);
                *lit == Literal::full(&ty.shape, ty.dtype, identity)
            }
            _ => false,
        };
        let id = if init_is_identity {
            id
        } else {
            let shape = self.program.ty(id).shape.clone();
            let init = self.program.push_op(
                Op::Broadcast {
                    shape,
                    dims: vec![],
                },
                &[*init],
                location(n),
            )?;
            let combine = match kind {
                ReduceKind::Sum => BinaryOp::Add,
                ReduceKind::Max => BinaryOp::Max,
                ReduceKind::Min => BinaryOp::Min,
            };
            self.program
                .push_op(Op::Binary(combine), &[id, init], location(n))?
        };
        self.names.push((lhs.to_string(), id));
        Ok(())
    }

    /// The `%name`s in an op's text before its type (attribute names never start
    /// with `%`).
    fn operands(&self, n: usize, text: &str) -> Result<Vec<ValueId>> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find('%') {
            let name: String = rest[at..]
                .chars()
                .enumerate()
                .take_while(|&(i, c)| {
                    i == 0 || c.is_alphanumeric() || c == '_' || c == '#' || c == '.'
                })
                .map(|(_, c)| c)
                .collect();
            out.push(self.value(n, &name)?);
            rest = &rest[at + name.len()..];
        }
        Ok(out)
    }
}

fn unary(name: &str) -> Option<UnaryOp> {
    Some(match name {
        "stablehlo.negate" => UnaryOp::Neg,
        "stablehlo.abs" => UnaryOp::Abs,
        "stablehlo.exponential" => UnaryOp::Exp,
        "stablehlo.log" => UnaryOp::Log,
        "stablehlo.sqrt" => UnaryOp::Sqrt,
        "stablehlo.rsqrt" => UnaryOp::Rsqrt,
        "stablehlo.tanh" => UnaryOp::Tanh,
        "stablehlo.logistic" => UnaryOp::Logistic,
        "stablehlo.not" => UnaryOp::Not,
        "stablehlo.sine" => UnaryOp::Sin,
        "stablehlo.cosine" => UnaryOp::Cos,
        "chlo.erf" => UnaryOp::Erf,
        "stablehlo.floor" => UnaryOp::Floor,
        "stablehlo.ceil" => UnaryOp::Ceil,
        "stablehlo.round_nearest_even" => UnaryOp::Round,
        "stablehlo.sign" => UnaryOp::Sign,
        "stablehlo.is_finite" => UnaryOp::IsFinite,
        _ => return None,
    })
}

fn binary(name: &str) -> Option<BinaryOp> {
    Some(match name {
        "stablehlo.add" => BinaryOp::Add,
        "stablehlo.subtract" => BinaryOp::Sub,
        "stablehlo.multiply" => BinaryOp::Mul,
        "stablehlo.divide" => BinaryOp::Div,
        "stablehlo.maximum" => BinaryOp::Max,
        "stablehlo.minimum" => BinaryOp::Min,
        "stablehlo.power" => BinaryOp::Pow,
        "stablehlo.and" => BinaryOp::And,
        "stablehlo.or" => BinaryOp::Or,
        "stablehlo.remainder" => BinaryOp::Rem,
        _ => return None,
    })
}

/// The index of the bracket closing the one at `open`.
fn matching(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in text.char_indices().skip_while(|&(i, _)| i < open) {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => {
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
fn split_top(text: &str) -> Vec<&str> {
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
fn parse_type(text: &str) -> std::result::Result<TensorType, String> {
    let inner = text
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
        .collect::<std::result::Result<Vec<usize>, String>>()?;
    Ok(TensorType::new(shape, dtype))
}

/// The result type after an op's ` : `: the one after `->`, or the only one.
fn result_type(text: &str) -> std::result::Result<TensorType, String> {
    let t = text.rsplit("->").next().unwrap_or(text).trim();
    parse_type(t)
}

/// The `[a, b]` list after `key` in `text` (`key` empty: at its start).
fn list_after(text: &str, key: &str) -> Option<Vec<usize>> {
    let at = if key.is_empty() {
        0
    } else {
        text.find(key)? + key.len()
    };
    let rest = text[at..].trim_start().strip_prefix('[')?;
    let inner = rest.split(']').next()?;
    (inner.split(',').map(str::trim).filter(|s| !s.is_empty()))
        .map(|s| s.parse().ok())
        .collect()
}

fn number_after(text: &str, key: &str) -> Option<usize> {
    let at = text.find(key)? + key.len();
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The `dense<..>` of a constant: a splat or a nested list of numbers.
fn parse_dense(text: &str, ty: &TensorType) -> std::result::Result<Literal, String> {
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
        .collect::<std::result::Result<Vec<f64>, String>>()?;
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
fn element(s: &str, dtype: DType) -> std::result::Result<f64, String> {
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

/// `sdy.mesh`'s `@mesh = <["data"=2, "model"=4]>` (after the `sdy.mesh `).
fn parse_mesh(text: &str) -> std::result::Result<Mesh, String> {
    let at = text.find("<[").ok_or("sdy.mesh: no axis list")? + 2;
    let inner = text[at..].split(']').next().unwrap_or("");
    let axes = (split_top(inner).into_iter())
        .map(|a| {
            let (name, size) = a
                .split_once('=')
                .ok_or(format!("mesh axis `{a}` has no size"))?;
            let size = size
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("mesh axis `{a}`"))?;
            Ok((name.trim().trim_matches('"').to_string(), size))
        })
        .collect::<std::result::Result<Vec<(String, usize)>, String>>()?;
    Mesh::new(axes).map_err(|e| e.to_string())
}

/// The `sdy.sharding = #sdy.sharding<..>` in an argument's or result's attributes.
fn sdy_sharding(text: &str, mesh: &Mesh) -> std::result::Result<Option<Sharding>, String> {
    match text.find("#sdy.sharding<") {
        Some(at) => parse_sharding(&text[at + "#sdy.sharding".len()..], mesh).map(Some),
        None => Ok(None),
    }
}

/// `<@mesh, [{"data"}, {"model", ?}p1], replicated={"x"}>`.
fn parse_sharding(text: &str, mesh: &Mesh) -> std::result::Result<Sharding, String> {
    let open = text
        .find('[')
        .ok_or_else(|| format!("sharding `{text}` has no dims"))?;
    let close = matching(text, open).ok_or_else(|| format!("sharding `{text}` is unclosed"))?;
    let axis = |a: &str| -> std::result::Result<String, String> {
        // `"model":(1)2` is gspmd's sub-axis `model:(1)2`.
        let name = a.replace('"', "");
        match mesh.axis_part(&name) {
            Some(_) => Ok(name),
            None => Err(format!("axis `{a}` is not in the mesh ({mesh})")),
        }
    };
    let dims = (split_top(&text[open + 1..close]).into_iter())
        .map(|d| {
            let end = d
                .rfind('}')
                .ok_or_else(|| format!("dim `{d}` is not `{{..}}`"))?;
            let priority = d[end + 1..].strip_prefix('p').and_then(|p| p.parse().ok());
            let mut dim = DimSharding::closed(Vec::<String>::new());
            for a in split_top(&d[1..end]) {
                if a == "?" {
                    dim.closed = false;
                } else {
                    dim.axes.push(axis(a)?);
                }
            }
            dim.priority = priority;
            Ok(dim)
        })
        .collect::<std::result::Result<Vec<DimSharding>, String>>()?;
    let mut sharding = Sharding::new(dims);
    let set = |key: &str| -> std::result::Result<Vec<String>, String> {
        match text[close..].find(key) {
            Some(at) => {
                let rest = &text[close + at + key.len()..];
                let inner = rest.trim_start_matches('{').split('}').next().unwrap_or("");
                split_top(inner).into_iter().map(axis).collect()
            }
            None => Ok(Vec::new()),
        }
    };
    sharding.replicated = set("replicated=")?;
    sharding.unreduced = set("unreduced=")?;
    Ok(sharding)
}
