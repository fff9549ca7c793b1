use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, ws: Vec<Tensor<D, D>>) -> Tensor<B, D> {
    ws.iter().fold(x, |h, w| h.matmul(w))
}

fn main() {}
