//! Collective bandwidth on MPI ranks against the thread mesh and memcpy:
//!
//! ```text
//! cargo build --release --features mpi --example mpi_bench
//! OMPI_MCA_mpi_yield_when_idle=1 mpirun -np 4 target/release/examples/mpi_bench
//! ```
//!
//! For all-reduce, all-gather and all-to-all of 1 MiB and 16 MiB of f32 over every
//! rank, prints the median time of a collective on the ranks (through `MpiMesh::run`,
//! with its meeting of all ranks) and on a thread mesh of as many devices (run by rank
//! 0 while the others wait; `mpi_yield_when_idle` keeps their waiting off the cores),
//! and the copy of the same bytes by one thread, as bandwidth (bytes / time, where the
//! bytes are the all-reduce's and all-to-all's operand and the all-gather's result) and
//! as the ratios MPI / threads and MPI / memcpy (of bandwidths).

use std::time::{Duration, Instant};

use gspmd::ir::{Literal, ReduceKind};
use gspmd::runtime::{Backend, Communicator, MpiMesh, ThreadMesh};
use gspmd::sharding::Mesh;
use gspmd::{Error, Result};
use ndarray::{ArrayD, IxDyn};

#[derive(Clone, Copy, Debug)]
/// All-reduce, all-gather, all-to-all.
enum Collective {
    Reduce,
    Gather,
    ToAll,
}

/// The median time of `reps` runs of `collective` on `bytes` (see the module docs).
fn time(
    comm: &dyn Communicator,
    collective: Collective,
    bytes: usize,
    reps: usize,
) -> Result<Duration> {
    let n = comm.mesh().num_devices();
    let axes = ["rank".to_string()];
    let elements = match collective {
        Collective::Gather => bytes / 4 / n,
        _ => bytes / 4,
    };
    let x = Literal::F32(ArrayD::from_elem(IxDyn(&[elements]), 1.0));
    let mut times = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let x = x.clone();
        let start = Instant::now();
        match collective {
            Collective::Reduce => comm.all_reduce(&axes, ReduceKind::Sum, x)?,
            Collective::Gather => comm.all_gather(&axes, 0, x)?,
            Collective::ToAll => comm.all_to_all(&axes, 0, 0, x)?,
        };
        // The first run warms up.
        if rep > 0 {
            times.push(start.elapsed());
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// The median time to copy `bytes` with one thread.
fn memcpy(bytes: usize, reps: usize) -> Duration {
    let from = vec![1.0f32; bytes / 4];
    let mut to = vec![0.0f32; bytes / 4];
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            to.copy_from_slice(std::hint::black_box(&from));
            std::hint::black_box(&to);
            start.elapsed()
        })
        .collect();
    times.sort();
    times[reps / 2]
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
            .flat_map(|c| [(c, 1 << 20, 30), (c, 16 << 20, 7)])
            .collect();
    let jobs = rows.clone();
    let on_ranks = mpi
        .run("mpi_bench", move |comm| {
            (jobs.iter())
                .map(|&(c, bytes, reps)| time(comm, c, bytes, reps))
                .collect::<Result<Vec<Duration>>>()
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
            "{ranks} ranks (MPI) vs {ranks} threads (thread mesh) vs memcpy; GB/s = bytes / median time"
        );
        println!(
            "{:<11} {:>6} {:>10} {:>10} {:>10} {:>12} {:>11}",
            "collective", "MiB", "MPI GB/s", "thr GB/s", "copy GB/s", "MPI/threads", "MPI/memcpy"
        );
        for (k, &(c, bytes, _)) in rows.iter().enumerate() {
            let (m, t, copy) = (on_ranks[k], on_threads[k], copies[k]);
            println!(
                "{:<11} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>12.2} {:>11.3}",
                match c {
                    Collective::Reduce => "all_reduce",
                    Collective::Gather => "all_gather",
                    Collective::ToAll => "all_to_all",
                },
                bytes >> 20,
                gb_per_s(bytes, m),
                gb_per_s(bytes, t),
                gb_per_s(bytes, copy),
                t.as_secs_f64() / m.as_secs_f64(),
                copy.as_secs_f64() / m.as_secs_f64()
            );
        }
    } else if mpi.device() == 0 {
        return Err(Error::MpiMesh("rank 0 measured no thread mesh".into()));
    }
    Ok(())
}
