use gspmd_core::ir::{Builder, DType, einsum, verify};
fn main() {
    let b = Builder::new("mlp");
    let x = b.parameter("x", [8, 16], DType::F32);
    let w1 = b.parameter("w1", [16, 64], DType::F32);
    let w2 = b.parameter("w2", [64, 16], DType::F32);
    let h = x.matmul(&w1).relu();
    let y = einsum("bf,fd->bd", &h, &w2)
        .softmax(-1)
        .layer_norm(-1, 1e-5)
        .gelu();
    let z = &y + &x * 2.0;
    let p = b.finish(&[&z]).unwrap();
    verify(&p).unwrap();
    println!("{p}");
    let b = Builder::new("bad");
    let x = b.parameter("x", [8, 16], DType::F32);
    let y = x.matmul(&x);
    let _ = y.relu();
    let w = x.transpose(&[0, 0]);
    println!("{}", b.finish(&[&w]).unwrap_err());
}
