//! gspmd's MPI collectives against the thread mesh's, bit for bit, one collective at a
//! time, run under `mpirun` with any number of ranks:
//!
//! ```text
//! cargo build --release --features mpi --example mpi_collectives
//! for r in 2 3 4; do mpirun --allow-run-as-root --oversubscribe -np $r target/release/examples/mpi_collectives; done
//! ```
//!
//! The operands reach the paths that the models of `mpi_check` (small tensors, even
//! splits) do not: reductions of several pieces per member (the MPI reductions receive
//! through a scratch buffer of about 2 MiB per element type), all-reduces whose length
//! the group size does not divide, and operands of fewer elements than members; blocks
//! along an inner dim (packed before they are sent, concatenated after); every element
//! type (bf16 travels as f32); sums, maxima and minima over values of mixed magnitudes,
//! NaNs and signed zeros; permutes with a member that is no target and one that sends to
//! itself. Groups are every rank, and with 4 ranks each axis of a 2x2 mesh and both axes
//! in either order. Every rank compares its own device's results.

use gspmd::ir::{DType, Literal, ReduceKind};
use gspmd::runtime::{Communicator, MpiMesh, ThreadMesh};
use gspmd::sharding::Mesh;

/// A failure of this check: a gspmd error, or a result that is not what it must be.
type Failure = Box<dyn std::error::Error>;

/// Results of this check's steps (gspmd's own in the programs run on the mesh).
type Result<T, E = Failure> = std::result::Result<T, E>;
use ndarray::{ArrayD, IxDyn};

/// One collective, with its arguments over a group of `n` members.
#[derive(Clone, Debug)]
enum Collective {
    AllReduce(ReduceKind),
    AllGather(usize),
    ReduceScatter(ReduceKind, usize),
    AllToAll(usize, usize),
    Permute(Vec<(usize, usize)>),
}

impl Collective {
    /// The collectives over a group of `n`, for operands of `rank` dims.
    fn all(n: usize, rank: usize) -> Vec<Collective> {
        let kinds = [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min];
        let dims = 0..rank;
        let mut all: Vec<Collective> = kinds.iter().map(|&k| Self::AllReduce(k)).collect();
        all.extend(dims.clone().map(Self::AllGather));
        for dim in dims.clone() {
            all.extend(kinds.iter().map(|&k| Self::ReduceScatter(k, dim)));
            all.extend(dims.clone().map(|concat| Self::AllToAll(dim, concat)));
        }
        // Member 0 is no target; then member 0 sends to itself and the others swap.
        all.push(Self::Permute((1..n).map(|i| (i - 1, i)).collect()));
        all.push(Self::Permute(
            std::iter::once((0, 0))
                .chain((1..n).map(|i| (i, n - i)))
                .collect(),
        ));
        all
    }

    /// Whether the collective applies to `shape` over `n` members (split dims divisible).
    fn fits(&self, shape: &[usize], n: usize) -> bool {
        match self {
            Self::ReduceScatter(_, dim) | Self::AllToAll(dim, _) => shape[*dim].is_multiple_of(n),
            _ => true,
        }
    }

    fn call(&self, comm: &dyn Communicator, axes: &[String], x: Literal) -> gspmd::Result<Literal> {
        match self {
            Self::AllReduce(kind) => comm.all_reduce(axes, *kind, x),
            Self::AllGather(dim) => comm.all_gather(axes, *dim, x),
            Self::ReduceScatter(kind, dim) => comm.reduce_scatter(axes, *kind, *dim, x),
            Self::AllToAll(split, concat) => comm.all_to_all(axes, *split, *concat, x),
            Self::Permute(pairs) => comm.collective_permute(axes, pairs, x),
        }
    }
}

/// Device `device`'s operand: magnitudes from 1e-3 to 1e3 of both signs (so the order
/// of a sum shows in its bits), NaNs here and there, and zeros of the device's sign
/// (alternating) every 101 elements (so the order of a max or min shows); i32
/// near its range (sums wrap); bool of both values.
fn operand(device: usize, dtype: DType, shape: &[usize]) -> Literal {
    let len: usize = shape.iter().product();
    let float = |i: usize| -> f32 {
        let k = (i * 7919 + device * 104_729) % 2003;
        if i.is_multiple_of(101) {
            // Zeros of both signs meet here: max and min keep the later on a tie.
            if device.is_multiple_of(2) { -0.0 } else { 0.0 }
        } else if k == 0 {
            f32::NAN
        } else {
            (k as f32 - 1001.0) * 10f32.powi((k % 7) as i32 - 3)
        }
    };
    match dtype {
        DType::I32 => Literal::I32(
            ArrayD::from_shape_vec(
                IxDyn(shape),
                (0..len)
                    .map(|i| (i as i32).wrapping_mul(1_640_531_527) ^ device as i32)
                    .collect(),
            )
            .expect("len elements"),
        ),
        DType::Bool => Literal::Bool(
            ArrayD::from_shape_vec(
                IxDyn(shape),
                (0..len).map(|i| (i + device).is_multiple_of(3)).collect(),
            )
            .expect("len elements"),
        ),
        _ => Literal::F32(
            ArrayD::from_shape_vec(IxDyn(shape), (0..len).map(float).collect())
                .expect("len elements"),
        )
        .convert(dtype),
    }
}

fn main() -> Result<()> {
    let mpi = MpiMesh::init()?;
    let ranks = mpi.mesh().num_devices();
    let mut groups: Vec<(Mesh, Vec<&str>)> = vec![(Mesh::new([("rank", ranks)])?, vec!["rank"])];
    if ranks == 4 {
        let square = Mesh::new([("a", 2), ("b", 2)])?;
        for axes in [vec!["a"], vec!["b"], vec!["a", "b"], vec!["b", "a"]] {
            groups.push((square.clone(), axes));
        }
    }
    // A few elements; several scratch pieces per member, a length no group size
    // divides; blocks along an inner dim.
    let shapes: [&[usize]; 3] = [&[3], &[1_000_003], &[12, 24_000]];
    let mut mpi = mpi;
    let mut checked = 0;
    for (mesh, axes) in groups {
        mpi = mpi.reshape(mesh.clone())?;
        let threads = ThreadMesh::new(mesh.clone())?;
        let axes: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
        let n = axes
            .iter()
            .map(|a| mesh.axis_size(a))
            .product::<Option<usize>>();
        let n = n.ok_or_else(|| Failure::from(format!("{axes:?} are not axes of {mesh}")))?;
        for shape in shapes {
            for collective in Collective::all(n, shape.len()) {
                if !collective.fits(shape, n) {
                    continue;
                }
                for dtype in [DType::F32, DType::BF16, DType::I32, DType::Bool] {
                    let what = format!("{collective:?} over {axes:?} of {mesh}, {dtype}{shape:?}");
                    let device = mpi.device();
                    let (c, a, s) = (collective.clone(), axes.clone(), shape.to_vec());
                    let on_rank = mpi
                        .run(&what, move |comm| {
                            c.call(comm, &a, operand(device, dtype, &s))
                        })?
                        .swap_remove(0);
                    let (c, a, s) = (collective.clone(), axes.clone(), shape.to_vec());
                    let mut on_threads = threads.run(move |ctx| {
                        let x = operand(ctx.device(), dtype, &s);
                        c.call(ctx.communicator(), &a, x)
                    })?;
                    let want = on_threads.swap_remove(device);
                    if on_rank.shape() != want.shape()
                        || on_rank.bit_patterns() != want.bit_patterns()
                    {
                        return Err(format!(
                            "device {device}: {what} differs between MPI and threads"
                        )
                        .into());
                    }
                    checked += 1;
                }
            }
        }
    }
    if mpi.device() == 0 {
        println!(
            "mpi_collectives: {ranks} ranks: {checked} collectives bitwise equal to the thread mesh"
        );
    }
    Ok(())
}
