//! Every sharding-spec form, every tensor-type form and `out = (..)`.
use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model, pipe), out = (data, ?))]
fn forms(
    #[shard(_, ?)] a: Tensor<B, D>,
    #[shard(data, model)] b: Tensor<B, D>,
    #[shard((data, model), _)] c: Tensor<B, D>,
    #[shard(data?, (model, pipe)?)] d: Tensor<B, D>,
    #[shard(data @0, model @2, priority = 1)] e: Tensor<B, D>,
    #[shard(_, _, unreduced = (model), replicated = pipe)] f: Tensor<B, D>,
    #[shard(data, _, name = "input_g",)] g: Tensor<B, 4>,
    #[shard()] s: Tensor<>,
    idx: Tensor<B, i32>,
    mask: Tensor<B, D, bool>,
    mut h: Tensor<4, D>,
    #[shard((model:(1)2, data), model:(2)2, replicated = pipe:(2)2)] i: Tensor<B, D>,
) -> Tensor<B, D> {
    h = h.relu();
    let _ = (&idx, &mask, &s, &i);
    #[shard(data, ?, name = "sum")]
    let sum: Tensor = &(&(&a + &b) + &c) + &(&d - &e);
    sum + f + g.matmul(&h)
}

fn main() {
    let p = forms::trace(forms::Dims { B: 8, D: 6 }).unwrap();
    let text = p.to_string();
    for fragment in [
        "\"a\" : f32[8,6] annotation=(_, ?)",
        "\"b\" : f32[8,6] annotation=(data, model)",
        "\"c\" : f32[8,6] annotation=((data, model), _)",
        "\"d\" : f32[8,6] annotation=(data?, (model, pipe)?)",
        "\"e\" : f32[8,6] annotation=(data@0, model@2)",
        "\"f\" : f32[8,6] annotation=(_, _) replicated={pipe} unreduced={model}",
        "\"input_g\" : f32[8,4] annotation=(data, _)",
        "\"s\" : f32[] annotation=()",
        "\"idx\" : i32[8]",
        "\"mask\" : pred[8,6]",
        "\"h\" : f32[4,6]",
        "\"i\" : f32[8,6] annotation=((model:(1)2, data), model:(2)2) replicated={pipe:(2)2}",
        "\"sum\" : f32[8,6] annotation=(data, ?)",
    ] {
        assert!(text.contains(fragment), "missing `{fragment}` in\n{text}");
    }
    // The output constraint is the last node and the program's result.
    let last = p.nodes.last().unwrap();
    assert_eq!(last.annotation.as_ref().unwrap().to_string(), "(data, ?)");
    assert_eq!(p.outputs, vec![ValueId(p.nodes.len() as u32 - 1)]);
    assert_eq!(forms::MESH_AXES, ["data", "model", "pipe"]);
    assert_eq!(forms::SIGNATURE.symbols, ["B", "D"]);
}

use gspmd::ir::ValueId;
