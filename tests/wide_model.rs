//! A model with 50 annotated parameters: compile-time cost of `#[gspmd::model]` (see
//! docs/dsl.md for the measured build time) and that every annotation reaches the IR.

use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model))]
fn wide(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(data, _)] w0: Tensor<D, D>,
    #[shard(_, model)] w1: Tensor<D, D>,
    #[shard(model, _)] w2: Tensor<D, D>,
    #[shard(_, data)] w3: Tensor<D, D>,
    #[shard((data, model), _)] w4: Tensor<D, D>,
    #[shard(data, _)] w5: Tensor<D, D>,
    #[shard(_, model)] w6: Tensor<D, D>,
    #[shard(model, _)] w7: Tensor<D, D>,
    #[shard(_, data)] w8: Tensor<D, D>,
    #[shard((data, model), _)] w9: Tensor<D, D>,
    #[shard(data, _)] w10: Tensor<D, D>,
    #[shard(_, model)] w11: Tensor<D, D>,
    #[shard(model, _)] w12: Tensor<D, D>,
    #[shard(_, data)] w13: Tensor<D, D>,
    #[shard((data, model), _)] w14: Tensor<D, D>,
    #[shard(data, _)] w15: Tensor<D, D>,
    #[shard(_, model)] w16: Tensor<D, D>,
    #[shard(model, _)] w17: Tensor<D, D>,
    #[shard(_, data)] w18: Tensor<D, D>,
    #[shard((data, model), _)] w19: Tensor<D, D>,
    #[shard(data, _)] w20: Tensor<D, D>,
    #[shard(_, model)] w21: Tensor<D, D>,
    #[shard(model, _)] w22: Tensor<D, D>,
    #[shard(_, data)] w23: Tensor<D, D>,
    #[shard((data, model), _)] w24: Tensor<D, D>,
    #[shard(data, _)] w25: Tensor<D, D>,
    #[shard(_, model)] w26: Tensor<D, D>,
    #[shard(model, _)] w27: Tensor<D, D>,
    #[shard(_, data)] w28: Tensor<D, D>,
    #[shard((data, model), _)] w29: Tensor<D, D>,
    #[shard(data, _)] w30: Tensor<D, D>,
    #[shard(_, model)] w31: Tensor<D, D>,
    #[shard(model, _)] w32: Tensor<D, D>,
    #[shard(_, data)] w33: Tensor<D, D>,
    #[shard((data, model), _)] w34: Tensor<D, D>,
    #[shard(data, _)] w35: Tensor<D, D>,
    #[shard(_, model)] w36: Tensor<D, D>,
    #[shard(model, _)] w37: Tensor<D, D>,
    #[shard(_, data)] w38: Tensor<D, D>,
    #[shard((data, model), _)] w39: Tensor<D, D>,
    #[shard(data, _)] w40: Tensor<D, D>,
    #[shard(_, model)] w41: Tensor<D, D>,
    #[shard(model, _)] w42: Tensor<D, D>,
    #[shard(_, data)] w43: Tensor<D, D>,
    #[shard((data, model), _)] w44: Tensor<D, D>,
    #[shard(data, _)] w45: Tensor<D, D>,
    #[shard(_, model)] w46: Tensor<D, D>,
    #[shard(model, _)] w47: Tensor<D, D>,
    #[shard(_, data)] w48: Tensor<D, D>,
    #[shard((data, model), _)] w49: Tensor<D, D>,
) -> Tensor<B, D> {
    let x = x.matmul(&w0);
    let x = &x + &x.matmul(&w1);
    let x = x.matmul(&w2);
    let x = &x + &x.matmul(&w3);
    let x = x.matmul(&w4);
    let x = &x + &x.matmul(&w5);
    let x = x.matmul(&w6);
    let x = &x + &x.matmul(&w7);
    let x = x.matmul(&w8);
    let x = &x + &x.matmul(&w9);
    let x = x.matmul(&w10);
    let x = &x + &x.matmul(&w11);
    let x = x.matmul(&w12);
    let x = &x + &x.matmul(&w13);
    let x = x.matmul(&w14);
    let x = &x + &x.matmul(&w15);
    let x = x.matmul(&w16);
    let x = &x + &x.matmul(&w17);
    let x = x.matmul(&w18);
    let x = &x + &x.matmul(&w19);
    let x = x.matmul(&w20);
    let x = &x + &x.matmul(&w21);
    let x = x.matmul(&w22);
    let x = &x + &x.matmul(&w23);
    let x = x.matmul(&w24);
    let x = &x + &x.matmul(&w25);
    let x = x.matmul(&w26);
    let x = &x + &x.matmul(&w27);
    let x = x.matmul(&w28);
    let x = &x + &x.matmul(&w29);
    let x = x.matmul(&w30);
    let x = &x + &x.matmul(&w31);
    let x = x.matmul(&w32);
    let x = &x + &x.matmul(&w33);
    let x = x.matmul(&w34);
    let x = &x + &x.matmul(&w35);
    let x = x.matmul(&w36);
    let x = &x + &x.matmul(&w37);
    let x = x.matmul(&w38);
    let x = &x + &x.matmul(&w39);
    let x = x.matmul(&w40);
    let x = &x + &x.matmul(&w41);
    let x = x.matmul(&w42);
    let x = &x + &x.matmul(&w43);
    let x = x.matmul(&w44);
    let x = &x + &x.matmul(&w45);
    let x = x.matmul(&w46);
    let x = &x + &x.matmul(&w47);
    let x = x.matmul(&w48);
    &x + &x.matmul(&w49)
}

#[test]
fn fifty_annotated_parameters_reach_the_program() {
    let p = wide::trace(wide::Dims { B: 4, D: 8 }).unwrap();
    assert_eq!(p.params.len(), 51);
    let annotated = p
        .params
        .iter()
        .filter(|&&v| p.node(v).annotation.is_some())
        .count();
    assert_eq!(annotated, 51);
    let dots = p
        .nodes
        .iter()
        .filter(|n| n.op.name() == "dot_general")
        .count();
    assert_eq!(dots, 50);
}
