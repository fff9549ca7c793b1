//! Collective bandwidth on MPI ranks: gspmd's collectives against the bare MPI calls on
//! the same ranks and bytes, the thread mesh and memcpy:
//!
//! ```text
//! cargo build --release --features mpi --example mpi_bench
//! mpirun --allow-run-as-root -np 2 target/release/examples/mpi_bench
//! ```
//!
//! (`--oversubscribe` for more ranks than cores.) For all-reduce, all-gather and
//! all-to-all of 1 MiB and 16 MiB of f32 over every rank, rank 0 prints the median time
//! of
//! - gspmd's collective on the ranks (`MpiMesh::run`'s communicator, with its meeting
//!   of all ranks, including what the collective allocates and copies),
//! - the bare MPI call on the world communicator, on buffers made once:
//!   `MPI_Allreduce` (`MPI_SUM` of f32), `MPI_Allgather`, `MPI_Alltoall` — timed in
//!   the same run, the two alternating (gspmd, bare, gspmd, ...) so that noise on this
//!   shared machine hits both alike, each call after a barrier. Both send data just
//!   written, as a program's freshly computed operand is: gspmd's operand is a new copy
//!   (the collective takes it by value) and the bare call's send buffer is rewritten
//!   before each call, untimed (when only gspmd's was, its 1 MiB all-gather ran at
//!   0.56-0.66 of the bare call's bandwidth in runs where data the other core had just
//!   written was slow to read, 0.85 in the others),
//! - gspmd's collective on a thread mesh of as many devices (run by rank 0 while the
//!   others wait) and the copy of the same bytes by one thread,
//!
//! as bandwidth (bytes / median time, where the bytes are the all-reduce's and
//! all-to-all's operand and the all-gather's result) and as the ratios gspmd / bare,
//! MPI / threads and MPI / memcpy (of bandwidths).
//!
//! Open MPI's shared-memory transport (`vader`) moves a large message with one copy, made
//! by the receiver reading the sender's memory (CMA, `btl_vader_single_copy_mechanism`,
//! whose default `cma` works here): nothing needs setting. See `benches/README.md` for
//! figures.

use std::time::{Duration, Instant};

use gspmd::error::MpiProblem;
use gspmd::ir::{Literal, ReduceKind};
use gspmd::runtime::{Backend, Communicator, MpiMesh, ThreadMesh};
use gspmd::sharding::Mesh;
use gspmd::{Error, Result};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::SimpleCommunicator;
use ndarray::{ArrayD, IxDyn};

#[derive(Clone, Copy, Debug)]
/// All-reduce, all-gather, all-to-all.
enum Collective {
    Reduce,
    Gather,
    ToAll,
}

impl Collective {
    fn name(self) -> &'static str {
        match self {
            Collective::Reduce => "all_reduce",
            Collective::Gather => "all_gather",
            Collective::ToAll => "all_to_all",
        }
    }

    /// The f32 elements of each member's operand when the row moves `bytes` over `n`
    /// members (see the module docs).
    fn operand_len(self, bytes: usize, n: usize) -> usize {
        match self {
            Collective::Gather => bytes / 4 / n,
            _ => bytes / 4,
        }
    }

    /// gspmd's collective of `x` over `comm`'s one axis.
    fn gspmd(self, comm: &dyn Communicator, x: Literal) -> Result<Literal> {
        let axes = ["rank".to_string()];
        match self {
            Collective::Reduce => comm.all_reduce(&axes, ReduceKind::Sum, x),
            Collective::Gather => comm.all_gather(&axes, 0, x),
            Collective::ToAll => comm.all_to_all(&axes, 0, 0, x),
        }
    }

    /// The bare MPI call of `send` into `recv` (of the result's length) on `world`.
    fn bare(self, world: &SimpleCommunicator, send: &[f32], recv: &mut [f32]) {
        match self {
            Collective::Reduce => world.all_reduce_into(send, recv, SystemOperation::sum()),
            Collective::Gather => world.all_gather_into(send, recv),
            Collective::ToAll => world.all_to_all_into(send, recv),
        }
    }
}

/// Times one call (preparing its operands untimed).
type Timed<'a> = &'a mut dyn FnMut() -> Result<Duration>;

/// The median time of each of `sides` over `reps` calls, the sides taking turns within
/// each repetition, after one call of each to warm up.
fn medians(reps: usize, sides: &mut [Timed<'_>]) -> Result<Vec<Duration>> {
    let mut times = vec![Vec::with_capacity(reps); sides.len()];
    for rep in 0..=reps {
        for (side, times) in sides.iter_mut().zip(&mut times) {
            let t = side()?;
            if rep > 0 {
                times.push(t);
            }
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[t.len() / 2]
        })
        .collect())
}

/// The time `f` takes.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// gspmd's `collective` of `bytes` over `comm`, timed alone (`reps` calls).
fn time(
    comm: &dyn Communicator,
    collective: Collective,
    bytes: usize,
    reps: usize,
) -> Result<Duration> {
    let len = collective.operand_len(bytes, comm.mesh().num_devices());
    let x = Literal::F32(ArrayD::from_elem(IxDyn(&[len]), 1.0));
    let mut gspmd = || {
        let x = x.clone();
        let (result, t) = timed(|| collective.gspmd(comm, x));
        result.map(|_| t)
    };
    Ok(medians(reps, &mut [&mut gspmd])?[0])
}

/// gspmd's `collective` of `bytes` over `comm` and the bare MPI call on the world, taking
/// turns (`reps` calls each, each after a barrier): their median times.
fn side_by_side(
    comm: &dyn Communicator,
    collective: Collective,
    bytes: usize,
    reps: usize,
) -> Result<(Duration, Duration)> {
    let world = SimpleCommunicator::world();
    let len = collective.operand_len(bytes, comm.mesh().num_devices());
    let x = Literal::F32(ArrayD::from_elem(IxDyn(&[len]), 1.0));
    let mut send = vec![1.0f32; len];
    let mut recv = vec![0.0f32; bytes / 4];
    let mut gspmd = || {
        // gspmd takes the operand by value: its copy is made before the clock starts.
        let x = x.clone();
        world.barrier();
        let (result, t) = timed(|| collective.gspmd(comm, x));
        result.map(|_| t)
    };
    let mut bare = || {
        send.fill(1.0);
        world.barrier();
        Ok(timed(|| collective.bare(&world, &send, &mut recv)).1)
    };
    match medians(reps, &mut [&mut gspmd, &mut bare])?[..] {
        [g, b] => Ok((g, b)),
        _ => Err(broken("two sides give two medians")),
    }
}

/// The median time to copy `bytes` with one thread.
fn memcpy(bytes: usize, reps: usize) -> Duration {
    let from = vec![1.0f32; bytes / 4];
    let mut to = vec![0.0f32; bytes / 4];
    let mut copy = || {
        let ((), t) = timed(|| to.copy_from_slice(std::hint::black_box(&from)));
        std::hint::black_box(&to);
        Ok(t)
    };
    medians(reps, &mut [&mut copy]).map_or(Duration::ZERO, |m| m[0])
}

fn gb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() -> Result<()> {
    let mpi = MpiMesh::init()?;
    let ranks = mpi.mesh().num_devices();
    let rows: Vec<(Collective, usize, usize)> =
        [Collective::Reduce, Collective::Gather, Collective::ToAll]
            .into_iter()
            .flat_map(|c| [(c, 1 << 20, 200), (c, 16 << 20, 40)])
            .collect();
    let jobs = rows.clone();
    let on_ranks = mpi
        .run("mpi_bench", move |comm| {
            (jobs.iter())
                .map(|&(c, bytes, reps)| side_by_side(comm, c, bytes, reps))
                .collect::<Result<Vec<_>>>()
        })?
        .swap_remove(0);
    // Rank 0 measures the thread mesh and memcpy while the others wait for it.
    let mut others = Vec::new();
    mpi.together("the thread mesh bench", &mut || {
        if mpi.device() != 0 {
            return Ok(());
        }
        let threads = ThreadMesh::new(Mesh::new([("rank", ranks)])?)?;
        let jobs = rows.clone();
        let mut per_device = threads.run(move |ctx| {
            (jobs.iter())
                .map(|&(c, bytes, reps)| time(ctx.communicator(), c, bytes, reps))
                .collect::<Result<Vec<Duration>>>()
        })?;
        let on_threads = per_device.swap_remove(0);
        let copies = rows
            .iter()
            .map(|&(_, bytes, reps)| memcpy(bytes, reps))
            .collect();
        others = vec![on_threads, copies];
        Ok(())
    })?;
    if let [on_threads, copies] = others.as_slice() {
        println!(
            "{ranks} ranks: gspmd (MPI) vs bare MPI calls (alternating, one run) vs {ranks} \
             threads (thread mesh) vs memcpy; GB/s = bytes / median time"
        );
        println!(
            "{:<11} {:>4} {:>11} {:>10} {:>11} {:>9} {:>10} {:>12} {:>11}",
            "collective",
            "MiB",
            "gspmd GB/s",
            "bare GB/s",
            "gspmd/bare",
            "thr GB/s",
            "copy GB/s",
            "MPI/threads",
            "MPI/memcpy"
        );
        for (k, &(c, bytes, _)) in rows.iter().enumerate() {
            let ((m, bare), t, copy) = (on_ranks[k], on_threads[k], copies[k]);
            println!(
                "{:<11} {:>4} {:>11.2} {:>10.2} {:>11.2} {:>9.2} {:>10.2} {:>12.2} {:>11.3}",
                c.name(),
                bytes >> 20,
                gb_per_s(bytes, m),
                gb_per_s(bytes, bare),
                bare.as_secs_f64() / m.as_secs_f64(),
                gb_per_s(bytes, t),
                gb_per_s(bytes, copy),
                t.as_secs_f64() / m.as_secs_f64(),
                copy.as_secs_f64() / m.as_secs_f64()
            );
        }
    } else if mpi.device() == 0 {
        return Err(broken("rank 0 measured no thread mesh"));
    }
    Ok(())
}

/// An error for a broken invariant of this bench (a bug).
fn broken(reason: &str) -> Error {
    Error::MpiMesh {
        problem: MpiProblem::Internal {
            reason: reason.into(),
        },
    }
}
