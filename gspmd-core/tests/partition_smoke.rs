use gspmd_core::ir::{Builder, DType, Literal, Program};
use gspmd_core::partition::partition;
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

fn input(shape: &[usize], seed: f32) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

fn set_all(program: &mut Program, shardings: &[&str]) {
    for (node, s) in program.nodes.iter_mut().zip(shardings) {
        node.sharding = Some(s.parse::<Sharding>().unwrap());
    }
}

fn max_diff(a: &Literal, b: &Literal) -> f32 {
    let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn megatron_mlp_by_hand() {
    let b = Builder::new("mlp");
    let x = b.parameter("x", [8, 16], DType::F32);
    let w1 = b.parameter("w1", [16, 32], DType::F32);
    let w2 = b.parameter("w2", [32, 16], DType::F32);
    let h = x.matmul(&w1).relu();
    let y = h.matmul(&w2);
    let mut p = b.finish(&[&y]).unwrap();
    println!("{p}");
    let shardings: Vec<&str> = p
        .nodes
        .iter()
        .enumerate()
        .map(|(i, _)| match i {
            0 => "(data, _)",
            1 => "(_, model)",
            2 => "(model, _)",
            3 | 6 => "(data, model)",
            4 => "()",
            5 => "(data, model)",
            _ => "(data, _)",
        })
        .collect();
    set_all(&mut p, &shardings);
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let spmd = partition(&p, &mesh).unwrap();
    println!("{}", spmd.report());
    let inputs = vec![
        input(&[8, 16], 0.1),
        input(&[16, 32], 0.2),
        input(&[32, 16], 0.3),
    ];
    let want = interpret(&p, &inputs).unwrap();
    let tm = ThreadMesh::new(mesh).unwrap();
    let got = spmd.run(&tm, &inputs).unwrap();
    assert!(
        max_diff(&want[0], &got[0]) < 1e-4,
        "{}",
        max_diff(&want[0], &got[0])
    );
    assert_eq!(spmd.collectives().count("all_reduce"), 1);
    assert_eq!(spmd.collectives().total(), 1);
}
