//! StableHLO with Shardy shardings into a gspmd [`Program`]: the reverse of
//! [`crate::export`], so that a JAX model's sharding (`jax.jit(f).lower(..).as_text()`)
//! can be propagated, partitioned and studied with gspmd's `why:` lines and analyses.
//!
//! It reads the pretty and generic forms JAX 0.12 writes: the `sdy.mesh`, `@main`'s
//! arguments with their `sdy.sharding` (annotations of the parameters) and results
//! (constraints on the outputs), and its ops:
//! - one op a line (`ops`): constants, the elementwise ops, `compare`, `select`,
//!   `clamp`, `convert`, `broadcast_in_dim`, `reshape`, `transpose`, `dot_general`,
//!   `iota`, `concatenate`, `slice`, `pad`, `reverse`, `dynamic_slice`,
//!   `dynamic_update_slice`, `convolution`, `optimization_barrier`,
//!   `sdy.sharding_constraint`;
//! - ops with a combiner region (`ops`): `reduce` (add, maximum, minimum; the
//!   two-operand argmax/argmin reduce), `reduce_window`, `scatter` (add, replace),
//!   `select_and_scatter` (max pooling's gradient, non-overlapping windows), `gather`;
//! - control flow (here): `func.call` (the callee inlined), `stablehlo.while`
//!   (`Flow::While`), `stablehlo.case` of two branches (`Flow::Cond`); a region may read
//!   values of the enclosing function (its captures).
//!
//! Anything else is an [`Error::Import`] naming the line and the op. Each node's
//! location is its line of the module (file `<stablehlo>`), which reports and errors
//! print.

mod ops;
mod sdy;
mod text;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ir::{CompareOp, Flow, Literal, Op, Program, ValueId, verify};
use crate::sharding::{Mesh, Sharding};
use crate::types::{Location, TensorType};
use text::{Function, Module, Region, Stmt, parse_type, result_types, split_top};

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
    let module = text::parse_module(text).map_err(|(n, m)| error(n, m))?;
    let mesh = match module.mesh {
        Some((n, mesh)) => sdy::parse_mesh(mesh).map_err(|m| error(n, m))?,
        None => Mesh::new(Vec::<(String, usize)>::new())?,
    };
    let main = (module.functions.iter())
        .find(|f| f.name == "main" && f.signature.starts_with("func.func public"))
        .ok_or_else(|| error(1, "the module has no public @main".into()))?;
    let mut reader = Reader::new(&module, &mesh, None);
    let results = reader.signature(main)?;
    let outputs = reader
        .block(&main.body)?
        .ok_or_else(|| error(main.line, "no return in @main".into()))?;
    let mut program = reader.program;
    program.outputs = outputs;
    for (j, sharding) in results.into_iter().enumerate() {
        if let (Some(s), true) = (sharding, j < program.outputs.len()) {
            program.constrain_output(j, s, false);
        }
    }
    verify(&program)?;
    Ok(Imported { program, mesh })
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

/// The outer values a region reads (their names and ids in the enclosing program), in
/// the order of its trailing parameters.
type Captures = Vec<(String, ValueId)>;

/// The program being read (a function's, or a region's), the MLIR name of each of
/// its values, and for a region the enclosing reader whose values it may capture.
struct Reader<'a> {
    program: Program,
    names: Vec<(String, ValueId)>,
    module: &'a Module<'a>,
    mesh: &'a Mesh,
    /// The enclosing function's reader (a region's captures come from its values).
    outer: Option<&'a Reader<'a>>,
    /// The outer values a region reads, in the order of its trailing parameters.
    captures: Captures,
}

impl<'a> Reader<'a> {
    fn new(module: &'a Module<'a>, mesh: &'a Mesh, outer: Option<&'a Reader<'a>>) -> Self {
        Reader {
            program: Program::new(if outer.is_some() {
                "region"
            } else {
                "imported"
            }),
            names: Vec::new(),
            module,
            mesh,
            outer,
            captures: Vec::new(),
        }
    }

    /// The value named `name` here.
    fn local(&self, name: &str) -> Option<ValueId> {
        (self.names.iter().rev())
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
    }

    /// The value named `name`: defined here, or (in a region) a value of the
    /// enclosing function, captured as a new trailing parameter.
    fn value(&mut self, line: usize, name: &str) -> Result<ValueId> {
        if let Some(v) = self.local(name) {
            return Ok(v);
        }
        let outer = self.outer.and_then(|o| o.local(name).map(|v| (o, v)));
        let Some((outer, v)) = outer else {
            return Err(error(line, format!("value {name} is not defined")));
        };
        let ty = outer.program.ty(v).clone();
        let id = self.parameter(line, name, ty)?;
        self.captures.push((name.to_string(), v));
        Ok(id)
    }

    /// A new trailing parameter named `name`.
    fn parameter(&mut self, line: usize, name: &str, ty: TensorType) -> Result<ValueId> {
        let index = self.program.params.len();
        let id = (self.program).push_op(Op::Parameter { index, ty }, &[], location(line))?;
        self.program.node_mut(id).name = Some(name.trim_start_matches('%').to_string());
        self.program.params.push(id);
        self.names.push((name.to_string(), id));
        Ok(id)
    }

    /// `@main`'s arguments as annotated parameters; its results' shardings.
    fn signature(&mut self, main: &Function) -> Result<Vec<Option<Sharding>>> {
        let (n, line) = (main.line, main.signature);
        let (args, results) = signature_parts(n, line)?;
        for arg in args {
            let (name, rest) = arg
                .split_once(':')
                .ok_or_else(|| error(n, format!("argument `{arg}` has no type")))?;
            let ty = parse_type(rest).map_err(|m| error(n, m))?;
            let id = self.parameter(n, name.trim(), ty)?;
            let annotation = sdy::sdy_sharding(rest, self.mesh).map_err(|m| error(n, m))?;
            self.program.node_mut(id).annotation = annotation;
        }
        split_top(results)
            .into_iter()
            .map(|r| sdy::sdy_sharding(r, self.mesh).map_err(|m| error(n, m)))
            .collect()
    }

    /// Reads `stmts` into the program; the values of their `return`, if any.
    fn block(&mut self, stmts: &[Stmt]) -> Result<Option<Vec<ValueId>>> {
        for stmt in stmts {
            let (n, line) = (stmt.line, stmt.text.as_str());
            if let Some(rest) = ["return ", "func.return ", "stablehlo.return "]
                .iter()
                .find_map(|p| line.strip_prefix(p))
            {
                let operands = rest.split(" : ").next().unwrap_or("");
                let values = (operands.split(',').map(str::trim))
                    .map(|name| self.value(n, name))
                    .collect::<Result<Vec<ValueId>>>()?;
                return Ok(Some(values));
            }
            self.statement(stmt)?;
        }
        Ok(None)
    }

    /// One `%name = op ...` or `%name:k = op ...` statement.
    fn statement(&mut self, stmt: &Stmt) -> Result<()> {
        let (n, line) = (stmt.line, stmt.text.as_str());
        let (lhs, rhs) = line
            .split_once(" = ")
            .ok_or_else(|| error(n, format!("not an op with results: `{line}`")))?;
        let (lhs, count) = match lhs.trim().split_once(':') {
            Some((name, k)) => (name, k.parse::<usize>().ok()),
            None => (lhs.trim(), None),
        };
        let op_name: String = (rhs.trim_start_matches('"').chars())
            .take_while(|c| !c.is_whitespace() && *c != '(' && *c != '"')
            .collect();
        let results = match op_name.as_str() {
            "call" | "func.call" => self.call(n, rhs)?,
            "stablehlo.while" => self.while_loop(stmt, rhs)?,
            "stablehlo.case" => self.case(stmt, rhs)?,
            _ => ops::op(self, stmt, &op_name, rhs)?,
        };
        match (count, results.as_slice()) {
            (None, [v]) => self.names.push((lhs.to_string(), *v)),
            (Some(k), _) if k == results.len() => {
                for (j, v) in results.into_iter().enumerate() {
                    self.names.push((format!("{lhs}#{j}"), v));
                }
            }
            _ => {
                return Err(error(
                    n,
                    format!("{op_name} gives {} results for `{lhs}`", results.len()),
                ));
            }
        }
        Ok(())
    }

    /// The `%name`s in an op's text before its type (attribute names never start
    /// with `%`).
    fn operands(&mut self, n: usize, text: &str) -> Result<Vec<ValueId>> {
        let text = text.rsplit_once(" : ").map_or(text, |(body, _)| body);
        value_names(text)
            .into_iter()
            .map(|name| self.value(n, name))
            .collect()
    }

    /// `call @f(%a, %b)`: `f`'s body inlined with its parameters bound to the
    /// operands; its returned values.
    fn call(&mut self, n: usize, rhs: &str) -> Result<Vec<ValueId>> {
        let callee = (rhs.split('@').nth(1))
            .and_then(|r| r.split('(').next())
            .ok_or_else(|| error(n, "call: no callee".into()))?;
        let f = (self.module.functions.iter())
            .find(|f| f.name == callee)
            .ok_or_else(|| error(n, format!("call: no function @{callee}")))?;
        let args = self.operands(n, rhs)?;
        let (params, _) = signature_parts(f.line, f.signature)?;
        if params.len() != args.len() {
            return Err(error(
                n,
                format!("call: @{callee} takes {} arguments", params.len()),
            ));
        }
        let scope = self.names.len();
        for (param, arg) in params.iter().zip(args) {
            let name = param.split(':').next().unwrap_or("").trim();
            self.names.push((name.to_string(), arg));
        }
        let returned = self.block(&f.body)?;
        self.names.truncate(scope);
        returned.ok_or_else(|| error(f.line, format!("@{callee} has no return")))
    }

    /// A region read as a program of parameters `params` (name, type), then the
    /// captures of `seed` (outer values already captured by a sibling region), then
    /// any new capture; the region's program (outputs: its `return`) and captures.
    fn region(
        &self,
        region: &Region,
        line: usize,
        params: &[(String, TensorType)],
        seed: &[(String, ValueId)],
    ) -> Result<(Program, Captures)> {
        let mut reader = Reader::new(self.module, self.mesh, Some(self));
        for (name, ty) in params {
            reader.parameter(line, name, ty.clone())?;
        }
        for (name, _) in seed {
            reader.value(line, name)?;
        }
        let outputs = reader
            .block(&region.body)?
            .ok_or_else(|| error(line, "a region without a return".into()))?;
        reader.program.outputs = outputs;
        Ok((reader.program, reader.captures))
    }

    /// The two regions of a flow op, both taking `params` then the captures of
    /// either (a capture only the second reads is an unused parameter of the first);
    /// the captures.
    fn two_regions(
        &self,
        n: usize,
        [first, second]: [&Region; 2],
        params: &[(String, TensorType)],
    ) -> Result<(Program, Program, Captures)> {
        let (mut a, first_captures) = self.region(first, n, params, &[])?;
        let (b, captures) = self.region(second, n, params, &first_captures)?;
        for (name, v) in &captures[first_captures.len()..] {
            let index = a.params.len();
            let ty = self.program.ty(*v).clone();
            let id = a.push_op(Op::Parameter { index, ty }, &[], location(n))?;
            a.node_mut(id).name = Some(name.trim_start_matches('%').to_string());
            a.params.push(id);
        }
        Ok((a, b, captures))
    }

    /// One node per result of `flow` over `operands`.
    fn flow_results(
        &mut self,
        n: usize,
        flow: Flow,
        operands: &[ValueId],
        count: usize,
    ) -> Result<Vec<ValueId>> {
        let flow = Arc::new(flow);
        (0..count)
            .map(|result| {
                let op = Op::Flow {
                    flow: flow.clone(),
                    result,
                };
                self.program.push_op(op, operands, location(n))
            })
            .collect()
    }

    /// `stablehlo.while(%iterArg = %init, ..) : types cond { .. } do { .. }`: a
    /// `Flow::While` over the carried values and the regions' captures.
    fn while_loop(&mut self, stmt: &Stmt, rhs: &str) -> Result<Vec<ValueId>> {
        let n = stmt.line;
        let (Some(open), [cond, body]) = (rhs.find('('), stmt.regions.as_slice()) else {
            return Err(error(n, "while: expected `(..)`, `cond` and `do`".into()));
        };
        let close = text::matching(rhs, open).ok_or_else(|| error(n, "while: unclosed".into()))?;
        let types = result_types(&rhs[close..]).map_err(|m| error(n, m))?;
        let mut params = Vec::new();
        let mut inits = Vec::new();
        for (pair, ty) in split_top(&rhs[open + 1..close]).into_iter().zip(types) {
            let (name, init) = pair
                .split_once('=')
                .ok_or_else(|| error(n, format!("while: operand `{pair}`")))?;
            params.push((name.trim().to_string(), ty));
            inits.push(self.value(n, init.trim())?);
        }
        let (cond, body, captures) = self.two_regions(n, [cond, body], &params)?;
        let count = inits.len();
        inits.extend(captures.iter().map(|&(_, v)| v));
        self.flow_results(n, Flow::While { cond, body }, &inits, count)
    }

    /// `"stablehlo.case"(%index) ({ .. }, { .. })` of two branches: a `Flow::Cond` on
    /// `index != 0` (an index outside `0..2` takes the last branch, as StableHLO's).
    fn case(&mut self, stmt: &Stmt, rhs: &str) -> Result<Vec<ValueId>> {
        let n = stmt.line;
        let [first, second] = stmt.regions.as_slice() else {
            return Err(error(n, "case: only two branches are imported".into()));
        };
        let [index] = self.operands(n, rhs)?[..] else {
            return Err(error(n, "case: one index operand expected".into()));
        };
        let (on_false, on_true, captures) = self.two_regions(n, [first, second], &[])?;
        let ty = self.program.ty(index).clone();
        let zero = self.constant(n, Literal::full(&[], ty.dtype, 0.0))?;
        let pred =
            (self.program).push_op(Op::Compare(CompareOp::Ne), &[index, zero], location(n))?;
        let mut operands = vec![pred];
        operands.extend(captures.iter().map(|&(_, v)| v));
        let count = on_true.outputs.len();
        self.flow_results(n, Flow::Cond { on_true, on_false }, &operands, count)
    }

    /// A constant node.
    fn constant(&mut self, n: usize, literal: Literal) -> Result<ValueId> {
        self.program
            .push_op(Op::Constant(literal), &[], location(n))
    }
}

/// The `%name`s in `text`, in order.
fn value_names(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        let len = rest[at..]
            .char_indices()
            .find(|&(i, c)| i > 0 && !(c.is_alphanumeric() || c == '_' || c == '#' || c == '.'))
            .map_or(rest.len() - at, |(i, _)| i);
        out.push(&rest[at..at + len]);
        rest = &rest[at + len..];
    }
    out
}

/// A `func.func` line's arguments (`%a: type {attrs}`) and its results' text.
fn signature_parts(n: usize, line: &str) -> Result<(Vec<&str>, &str)> {
    let open = line.find('(').unwrap_or(0);
    let close =
        text::matching(line, open).ok_or_else(|| error(n, "unclosed argument list".into()))?;
    let results = line[close..].split_once("->").map_or("", |(_, r)| r).trim();
    let results = results.trim_end_matches('{').trim();
    let results = results
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or(results);
    Ok((split_top(&line[open + 1..close]), results))
}
