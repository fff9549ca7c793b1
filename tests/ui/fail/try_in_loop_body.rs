use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, w: Tensor<D, D>) -> Tensor<B, D> {
    let b = x.builder();
    let out = b.fori_loop(3, &[x], |_, h| {
        let y = h[0].matmul(&w)?;
        vec![y.relu()?]
    });
    out[0].clone()
}

fn main() {}
