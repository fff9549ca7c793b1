//! Tracing control flow: [`Builder::scan`], [`Builder::fori_loop`],
//! [`Builder::while_loop`] and [`Builder::cond`] trace their closures into regions
//! (a child builder each) and append one [`Op::Flow`] result node per result.
//!
//! A value of an enclosing builder used inside a closure is *captured*: it becomes a
//! trailing region parameter and an operand of the flow op (through every region level
//! in between). Sibling regions (a loop's condition and body, a cond's branches) take
//! the same captures in the same order. A value traced inside a closure and used after
//! it is an error at the line using it.

use std::sync::Arc;

use super::builder::{
    Builder, Tensor, capture_parameter, close_region, push, region_builder, seed_capture,
};
use super::flow::Flow;
use super::literal::Literal;
use super::op::{BinaryOp, Op};
use super::program::Program;
use super::remat::Remat;
use crate::error::Error;
use crate::types::{DType, Location, TensorType, ValueId};

/// Sibling regions being traced in one builder, sharing one capture list.
struct Regions<'b> {
    parent: &'b Builder,
    location: Location,
    /// An operand is poisoned: trace only to count results, dropping region errors.
    quiet: bool,
    /// The parent values captured so far, in parameter order.
    captures: Vec<(ValueId, TensorType)>,
    /// Each region traced, with how many captures it had when closed.
    traced: Vec<Option<(Program, usize)>>,
    /// A region broke the loop's contract ([`Regions::check_carried`]): the op's error
    /// is recorded, its results are poisoned.
    broken: bool,
}

impl<'b> Regions<'b> {
    fn new(parent: &'b Builder, location: Location, operands: &[&Tensor]) -> Self {
        Regions {
            parent,
            location,
            quiet: operands.iter().any(|t| t.id().is_none()),
            captures: Vec::new(),
            traced: Vec::new(),
            broken: false,
        }
    }

    /// The carried-arity check every loop form shares: a body returning `returned`
    /// carried values for a loop carrying `carried` is an [`Error::Shape`] of `op` at
    /// the loop's line (recorded unless an operand is poisoned), and the loop's results
    /// are poisoned, so it is the only error (the region's types are not checked).
    fn check_carried(&mut self, op: &'static str, carried: usize, returned: usize) {
        if carried == returned {
            return;
        }
        if !self.quiet {
            self.parent.record_error(Error::Shape {
                op,
                location: self.location,
                message: format!(
                    "the body returns {returned} carried values but the loop carries {carried}"
                ),
            });
        }
        self.broken = true;
    }

    /// Traces `f` into a region called `name` whose first parameters are `params`
    /// (name and type); `f` gets the region's builder and those parameters and returns
    /// the region's results.
    fn trace(
        &mut self,
        name: &str,
        params: &[(String, TensorType)],
        f: impl FnOnce(&Builder, &[Tensor]) -> Vec<Tensor>,
    ) {
        let b = region_builder(self.parent, name);
        let handles: Vec<Tensor> = (params.iter())
            .map(|(n, ty)| b.parameter_at(n, ty.clone(), self.location))
            .collect();
        for (outer, ty) in &self.captures {
            seed_capture(&b, *outer, ty, self.location);
        }
        let outputs = f(&b, &handles);
        let closed = close_region(&b, &outputs, self.location, self.quiet);
        self.traced.push(closed.map(|(program, captures)| {
            self.captures = captures;
            (program, self.captures.len())
        }));
    }

    /// The traced regions, each with a parameter for every capture, and the captured
    /// values; `None` if a region failed.
    fn finish(self) -> Option<(Vec<Program>, Vec<ValueId>)> {
        if self.broken {
            return None;
        }
        let mut regions = Vec::with_capacity(self.traced.len());
        for traced in self.traced {
            let (mut program, had) = traced?;
            for (k, (_, ty)) in self.captures.iter().enumerate().skip(had) {
                capture_parameter(&mut program, k, ty, self.location);
            }
            regions.push(program);
        }
        let captured = self.captures.iter().map(|&(outer, _)| outer).collect();
        Some((regions, captured))
    }
}

/// How a [`Builder::scan_with`] loop runs: `ScanOptions::new()` (forward,
/// [`Remat::NothingSaveable`]) and its setters, e.g.
/// `ScanOptions::new().remat(Remat::DotsSaveable)`. Non-exhaustive: options may be
/// added, so it is built that way rather than as a struct literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct ScanOptions {
    /// Iterate from the last index to the first ([`Builder::scan_reverse`]).
    pub reverse: bool,
    /// What its backward pass keeps from the forward pass ([`Remat::NothingSaveable`]
    /// unless set: recompute everything but the carried values).
    pub remat: Remat,
}

impl ScanOptions {
    /// A forward scan whose backward pass recomputes everything but the carried
    /// values (the defaults).
    pub fn new() -> Self {
        Self::default()
    }

    /// The same options iterating from the last index to the first when `reverse`.
    pub fn reverse(mut self, reverse: bool) -> Self {
        self.reverse = reverse;
        self
    }

    /// The same options with the remat policy `remat`.
    pub fn remat(mut self, remat: Remat) -> Self {
        self.remat = remat;
        self
    }
}

impl Builder {
    /// Appends one result node of type `types[i]` per result of `flow` on `operands`
    /// then the captured values; poisoned handles of `types` if anything failed.
    pub(super) fn flow_results(
        &self,
        flow: Option<(Flow, Vec<ValueId>)>,
        operands: &[&Tensor],
        types: Vec<TensorType>,
        location: Location,
    ) -> Vec<Tensor> {
        let poisoned = || types.iter().map(|t| self.poisoned(t.clone())).collect();
        let Some((flow, captures)) = flow else {
            return poisoned();
        };
        let mut ids = Vec::with_capacity(operands.len() + captures.len());
        for t in operands {
            match self.resolve(t, location) {
                Some(id) => ids.push(id),
                None => return poisoned(),
            }
        }
        ids.extend(captures);
        let flow = Arc::new(flow);
        let mut results = Vec::with_capacity(types.len());
        for result in 0..types.len() {
            let op = Op::Flow {
                flow: flow.clone(),
                result,
            };
            // The first result checks the signature; one error for all results.
            match self.push_ids(op, &ids, location) {
                Some(id) => results.push(self.handle(id)),
                None => return poisoned(),
            }
        }
        results
    }

    /// `jax.lax.scan`: runs `body(carry, x)` for each index `i` of the leading dim of
    /// the stacked `xs` (`x` holds each one's slice `xs[j][i]`), threading the carried
    /// values from `init`; `body` returns the new carried values (same types) and
    /// per-iteration outputs `y`. Returns the final carried values and each `y` stacked
    /// along a new leading dim. The loop is one op: its body is traced once, however
    /// many iterations it runs.
    ///
    /// Errors ([`Error::Shape`] at the caller's line): no stacked operand (use
    /// [`Builder::fori_loop`]), stacked operands of different leading dims or rank 0,
    /// a body returning other carried types.
    #[track_caller]
    pub fn scan(
        &self,
        xs: &[Tensor],
        init: &[Tensor],
        body: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        self.scan_at(xs, init, ScanOptions::default(), body, Location::caller())
    }

    /// [`Builder::scan`] from the last index to the first (`jax.lax.scan(...,
    /// reverse=True)`): iteration `i` reads and writes index `length - 1 - i`.
    #[track_caller]
    pub fn scan_reverse(
        &self,
        xs: &[Tensor],
        init: &[Tensor],
        body: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        let options = ScanOptions::new().reverse(true);
        self.scan_at(xs, init, options, body, Location::caller())
    }

    /// [`Builder::scan`] with its `options`: the direction and the remat policy (what
    /// the backward pass of this scan reads from the forward pass rather than
    /// recomputes, see [`Remat`]), e.g. `jax.checkpoint(body,
    /// policy=dots_saveable)` scanned: `b.scan_with(&xs, &init,
    /// ScanOptions::new().remat(Remat::DotsSaveable), body)`.
    #[track_caller]
    pub fn scan_with(
        &self,
        xs: &[Tensor],
        init: &[Tensor],
        options: ScanOptions,
        body: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        self.scan_at(xs, init, options, body, Location::caller())
    }

    fn scan_at(
        &self,
        xs: &[Tensor],
        init: &[Tensor],
        options: ScanOptions,
        body: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
        location: Location,
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        let (length, failed) = match stacked_length(xs) {
            Ok(length) => (length, false),
            Err(message) => {
                if !xs.iter().chain(init).any(|t| t.id().is_none()) {
                    self.record_error(Error::Shape {
                        op: "scan",
                        location,
                        message,
                    });
                }
                (0, true)
            }
        };
        let form = ScanForm {
            op: "scan",
            length,
            options,
            counters: 0,
        };
        self.scan_of_length(xs, init, form, failed, body, location)
    }

    /// A scan of `form.length` iterations over `xs` (each of leading dim `length`), from
    /// the last index with `form.options.reverse`. When `failed` (an error is recorded already)
    /// the body is traced only to count its results, and every result is poisoned.
    fn scan_of_length(
        &self,
        xs: &[Tensor],
        init: &[Tensor],
        form: ScanForm,
        failed: bool,
        body: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
        location: Location,
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        let operands: Vec<&Tensor> = init.iter().chain(xs).collect();
        let host = self.innermost(&operands);
        let (n, k) = (init.len(), xs.len());
        let mut params: Vec<(String, TensorType)> = (init.iter().enumerate())
            .map(|(i, t)| (format!("carry.{i}"), t.ty().clone()))
            .collect();
        for (i, x) in xs.iter().enumerate() {
            let mut ty = x.ty().clone();
            if !ty.shape.is_empty() {
                ty.shape.remove(0);
            }
            params.push((format!("x.{i}"), ty));
        }
        let mut regions = Regions::new(&host, location, &operands);
        regions.quiet |= failed;
        let ScanForm {
            op,
            length,
            options,
            counters,
        } = form;
        let mut y_types = Vec::new();
        let mut returned = n;
        regions.trace("body", &params, |_, p| {
            let (carry, ys) = body(&p[..n], &p[n..]);
            y_types = ys.iter().map(|y| y.ty().clone()).collect();
            returned = carry.len();
            carry.into_iter().chain(ys).collect()
        });
        regions.check_carried(
            op,
            n.saturating_sub(counters),
            returned.saturating_sub(counters),
        );
        let mut types: Vec<TensorType> = init.iter().map(|t| t.ty().clone()).collect();
        types.extend(y_types.into_iter().map(|mut t| {
            t.shape.insert(0, length);
            t
        }));
        let flow = regions
            .finish()
            .filter(|_| !failed)
            .map(|(mut r, captures)| {
                let flow = Flow::Scan {
                    body: r.remove(0),
                    carried: n,
                    stacked: k,
                    length,
                    reverse: options.reverse,
                    remat: options.remat,
                };
                (flow, captures)
            });
        let mut results = host.flow_results(flow, &operands, types, location);
        let ys = results.split_off(n.min(results.len()));
        (results, ys)
    }

    /// `jax.lax.fori_loop` with a static trip count: runs `body(i, carry)` for `i` in
    /// `0..n` (an i32 scalar), threading the carried values from `init`; returns the
    /// final ones. It is a [`Builder::scan`] of `n` iterations with the counter
    /// carried, so it is traced once and (in phase 2) differentiable like a scan. A
    /// trip count past `i32::MAX` (the counter's range) is an [`Error::Shape`] at the
    /// caller's line.
    #[track_caller]
    pub fn fori_loop(
        &self,
        n: usize,
        init: &[Tensor],
        body: impl FnOnce(&Tensor, &[Tensor]) -> Vec<Tensor>,
    ) -> Vec<Tensor> {
        let location = Location::caller();
        let host = self.innermost(&init.iter().collect::<Vec<_>>());
        let counter = |b: &Builder, value: f64| {
            let op = Op::Constant(Literal::full(&[], DType::I32, value));
            let id = b.push_ids(op, &[], location);
            id.map_or_else(
                || b.poisoned(TensorType::new(vec![], DType::I32)),
                |id| b.handle(id),
            )
        };
        let mut carried = vec![counter(&host, 0.0)];
        carried.extend_from_slice(init);
        let too_long = n > i32::MAX as usize;
        if too_long && init.iter().all(|t| t.id().is_some()) {
            host.record_error(Error::Shape {
                op: "fori_loop",
                location,
                message: format!(
                    "a trip count of {n} does not fit the loop's i32 counter (at most {})",
                    i32::MAX
                ),
            });
        }
        let form = ScanForm {
            op: "fori_loop",
            length: n,
            options: ScanOptions::default(),
            counters: 1,
        };
        let (out, _) = host.scan_of_length(
            &[],
            &carried,
            form,
            too_long,
            |carry, _| {
                let i = &carry[0];
                let one = counter(&i.builder(), 1.0);
                let mut next = vec![push(i, Op::Binary(BinaryOp::Add), &[&one], location)];
                next.extend(body(i, &carry[1..]));
                (next, Vec::new())
            },
            location,
        );
        out.into_iter().skip(1).collect()
    }

    /// `jax.lax.while_loop`: while `cond(state)` (a bool scalar) holds, `state =
    /// body(state)`, starting from `init`; returns the final state. The trip count is
    /// a run-time value. On a mesh every device runs the same iterations: the
    /// condition is a replicated scalar.
    ///
    /// Errors ([`Error::Shape`] at the caller's line): a condition that is not a bool
    /// scalar, a body returning other types than `init`'s.
    #[track_caller]
    pub fn while_loop(
        &self,
        cond: impl FnOnce(&[Tensor]) -> Tensor,
        body: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
        init: &[Tensor],
    ) -> Vec<Tensor> {
        let location = Location::caller();
        let operands: Vec<&Tensor> = init.iter().collect();
        let host = self.innermost(&operands);
        let params: Vec<(String, TensorType)> = (init.iter().enumerate())
            .map(|(i, t)| (format!("carry.{i}"), t.ty().clone()))
            .collect();
        let mut regions = Regions::new(&host, location, &operands);
        regions.trace("cond", &params, |_, p| vec![cond(p)]);
        let mut returned = init.len();
        regions.trace("body", &params, |_, p| {
            let next = body(p);
            returned = next.len();
            next
        });
        regions.check_carried("while", init.len(), returned);
        let types = init.iter().map(|t| t.ty().clone()).collect();
        let flow = regions.finish().map(|(mut r, captures)| {
            let body = r.remove(1);
            let cond = r.remove(0);
            (Flow::While { cond, body }, captures)
        });
        host.flow_results(flow, &operands, types, location)
    }

    /// `jax.lax.cond`: `on_true()` if the bool scalar `pred` holds, else `on_false()`;
    /// each branch gets its own builder (for constants) and returns the same types.
    /// Only the branch taken runs.
    ///
    /// Errors ([`Error::Shape`] at the caller's line): a predicate that is not a bool
    /// scalar, branches returning different types.
    #[track_caller]
    pub fn cond(
        &self,
        pred: &Tensor,
        on_true: impl FnOnce(&Builder) -> Vec<Tensor>,
        on_false: impl FnOnce(&Builder) -> Vec<Tensor>,
    ) -> Vec<Tensor> {
        let location = Location::caller();
        let host = self.innermost(&[pred]);
        let mut regions = Regions::new(&host, location, &[pred]);
        let mut types = Vec::new();
        regions.trace("on_true", &[], |b, _| {
            let out = on_true(b);
            types = out.iter().map(|t| t.ty().clone()).collect();
            out
        });
        regions.trace("on_false", &[], |b, _| on_false(b));
        let flow = regions.finish().map(|(mut r, captures)| {
            let on_false = r.remove(1);
            let on_true = r.remove(0);
            (Flow::Cond { on_true, on_false }, captures)
        });
        host.flow_results(flow, &[pred], types, location)
    }
}

/// What a scan is traced for: the loop form's name (for errors), the trip count, its
/// options (direction, remat policy), and how many leading carried values the form adds itself (`fori_loop`'s
/// counter), which the carried-arity check leaves out of its counts.
struct ScanForm {
    op: &'static str,
    length: usize,
    options: ScanOptions,
    counters: usize,
}

/// The common leading dim of the stacked operands of a scan, or what is wrong.
fn stacked_length(xs: &[Tensor]) -> Result<usize, String> {
    let Some(first) = xs.first() else {
        return Err("a scan needs a stacked operand (for a loop without one: fori_loop)".into());
    };
    let length = first.shape().first().copied();
    match xs
        .iter()
        .find(|x| x.shape().first().copied() != length || length.is_none())
    {
        Some(x) => Err(format!(
            "stacked operands need one leading dim: {} and {}",
            first.ty(),
            x.ty()
        )),
        None => Ok(length.unwrap_or(0)),
    }
}
