//! Gradient accumulation as a loop: the loss over `k` microbatches is one `scan` whose
//! body is the model on one microbatch, summing the losses, divided by `k`. Reverse
//! mode through the scan sums the weights' gradients over the microbatches (the
//! captures' gradient sums of the backward scan), so one step program accumulates
//! with the activations of one microbatch alive at a time.

use std::sync::Arc;

use super::step::name_is_free;
use crate::error::Result;
use crate::ir::{
    Appender, BinaryOp, DType, Flow, Literal, Op, Program, Remat, TensorType, ValueId,
};
use crate::sharding::{DimSharding, Sharding};

/// The name of the loop body's carried loss sum.
const LOSS_SUM: &str = "loss_sum";

/// The loss of `model` (its output `loss`, an f32 scalar) averaged over `k` microbatches:
/// a program with `model`'s parameters at the same indices, the trained ones unchanged
/// and every other one (data) stacked `[k, ...]` (an annotation gains an unsplit leading
/// dim), and one output, the mean of the `k` losses. A model parameter named
/// `loss_sum` (the body's carry) is an [`Error::TrainRequest`](crate::Error::TrainRequest).
pub(super) fn accumulated_loss(
    model: &Program,
    loss: usize,
    trained: &[usize],
    k: usize,
) -> Result<Program> {
    let data: Vec<usize> = (0..model.params.len())
        .filter(|i| !trained.contains(i))
        .collect();
    let loss_value = model.outputs[loss];
    let location = model.node(loss_value).location;

    // The body: the model with a carried loss sum first, then the data slices, then
    // the trained parameters (its captures).
    let mut body = model.clone();
    body.name = format!("{}_microbatch", model.name);
    let mut a = Appender::new(&mut body, "gradient accumulation");
    a.location = location;
    let scalar = TensorType::new(vec![], DType::F32);
    name_is_free(model, LOSS_SUM, || "the microbatch loop's loss sum".into())?;
    let (sum_index, sum) = a.parameter(LOSS_SUM.into(), scalar, None);
    let next = a.add(sum, loss_value)?;
    body.outputs = vec![next];
    let order: Vec<usize> = std::iter::once(sum_index)
        .chain(data.iter().copied())
        .chain(trained.iter().copied())
        .collect();
    body.permute_params(&order);

    // The program: the model's parameters (data stacked), the scan, the mean.
    let mut program = Program::new(format!("{}_accumulated", model.name));
    for (i, &p) in model.params.iter().enumerate() {
        let node = model.node(p);
        let mut node = node.clone();
        if data.contains(&i) {
            node.ty.shape.insert(0, k);
            node.annotation = node.annotation.map(|a| {
                let mut dims = vec![DimSharding::closed(Vec::<String>::new())];
                dims.extend(a.dims);
                Sharding { dims, ..a }
            });
            node.op = Op::Parameter {
                index: i,
                ty: node.ty.clone(),
            };
        }
        let v = program.push(node);
        program.params.push(v);
    }
    let zero = program.push_op(Op::Constant(Literal::scalar_f32(0.0)), &[], location)?;
    let operands: Vec<ValueId> = std::iter::once(zero)
        .chain(data.iter().map(|&i| program.params[i]))
        .chain(trained.iter().map(|&i| program.params[i]))
        .collect();
    let scan = Arc::new(Flow::Scan {
        body,
        carried: 1,
        stacked: data.len(),
        length: k,
        reverse: false,
        remat: Remat::default(),
    });
    let total = program.push_op(
        Op::Flow {
            flow: scan,
            result: 0,
        },
        &operands,
        location,
    )?;
    let scale = program.push_op(
        Op::Constant(Literal::scalar_f32(1.0 / k as f32)),
        &[],
        location,
    )?;
    let mean = program.push_op(Op::Binary(BinaryOp::Mul), &[total, scale], location)?;
    program.node_mut(mean).name = Some("loss".into());
    program.outputs = vec![mean];
    Ok(program)
}
