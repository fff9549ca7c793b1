use gspmd::prelude::*;

#[gspmd::params(mesh = (data))]
struct Weights {
    #[init(gaussian(0.02))]
    a: Tensor<D, F>,
    #[init(normal)]
    b: Tensor<D, F>,
    #[init(fan_in(2))]
    c: Tensor<D, F>,
    #[init(ones(1))]
    d: Tensor<D>,
    #[init(normal(-0.5))]
    e: Tensor<D>,
    #[init(zeros)]
    inner: Inner,
    #[init(normal_fan_in(3))]
    f: Tensor<D, F>,
    #[init(normal_fan_in)]
    g: Tensor<D, F>,
}

#[gspmd::params(mesh = (data))]
struct Inner {
    w: Tensor<D>,
}

fn main() {}
