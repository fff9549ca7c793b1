use gspmd::prelude::*;

struct Layer;

impl Layer {
    #[gspmd::model(mesh = (data))]
    fn forward(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        x
    }
}

fn main() {}
