//! The memory analysis against the allocator: for the training steps of the examples'
//! models (the language model, the U-Net, the mixture of experts, a residual MLP
//! whose layers' scan saves the products for the backward pass, and the paper's dense
//! Transformer with its layers under a scan that recomputes everything or saves the
//! products; AdamW) on 1x1, 2x1 and 2x4 meshes, the peak that
//! [`Executable::memory_analysis`] predicts is within 10% of the peak the process's
//! allocator counts while the step runs.
//!
//! What is compared: the bytes a step allocates beyond its inputs, device by device.
//! Every input (weights, optimizer state, data) is resident on the devices before the
//! measured run; the allocator counts each buffer against the thread that allocated it
//! until it is freed, by whichever thread (a collective's operand is often freed by the
//! last peer to read it), so each device thread's peak during the run, less what it
//! held when the run started, is what that device allocates; the counted peak is their
//! sum (with the calling thread's), and the prediction is the number of devices times
//! the analysis's peak less its inputs (every device runs the same program on blocks of
//! the same shapes). Collectives keep the devices of a group nearly in step, not in
//! lockstep: a device can be ahead while a slower peer still holds the operand it
//! posted, which [`MemoryAnalysis::in_flight_bytes`] bounds. The prediction is
//! therefore the range from the in-step peak to it plus that bound, and the counted
//! peak must lie within 10% of the range.
//!
//! Why per device, not the process's peak: devices reach their peaks at different
//! moments unless they run in step. The U-Net on 2x4 (8 device threads on this
//! machine's 2 cores) counted 46.8 MB as a process peak in a debug build, where the
//! slow kernels keep the devices in step, but 30-33 MB in a release build, while the
//! sum of the devices' own peaks is 47.4 MB in both: the analysis's per-device peak
//! held, the process-wide counter measured how the threads interleaved.
//!
//! Each device keeps the buffers a run frees in a pool for the next run, within the
//! analysis's peak plus the pool's headroom over it
//! ([`MemoryAnalysis::pool_headroom_bytes`], see `runtime::pooled_bytes`): what the
//! pools hold when the measured run starts counts as allocated by it, so the headroom
//! widens the range at its top.
//!
//! The calling thread's count includes whatever else it does: this file holds one
//! test, so that no other test allocates on it while it measures.
//!
//! Measured (debug build, 2026-12-03): every case within 3.4% of its range but the
//! dense Transformer on 2x4, 5.0-6.1% above its in-flight bound here and 7.9% on the
//! CI machine (nothing saveable); on 1x1 and 2x1 the dense Transformer is within 2.4%.
//! What the 2x4 excess is was not found: it is not the reductions' accumulators (now
//! modelled, no change), and it moves with how the eight threads interleave on two
//! cores, hence 10% rather than the 7% the quiet runs would allow.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use gspmd::models::dense;
use gspmd::models::moe::moe_language_model;
use gspmd::models::transformer::language_model;
use gspmd::models::unet::denoise;
use gspmd::prelude::*;
use gspmd::runtime::{Input, Output, pooled_bytes, sample_inputs};
use gspmd::train::{Optimizer, TrainStep, step_program};

/// The most threads counted apart; later threads share the last slot (the test runs
/// about 70).
const SLOTS: usize = 4096;

/// Per thread slot: the bytes of the live buffers the thread allocated (whichever
/// thread frees them), the most of it since the last [`start_count`], and its value
/// then.
static HELD: [AtomicIsize; SLOTS] = [const { AtomicIsize::new(0) }; SLOTS];
static PEAK: [AtomicIsize; SLOTS] = [const { AtomicIsize::new(0) }; SLOTS];
static START: [AtomicIsize; SLOTS] = [const { AtomicIsize::new(0) }; SLOTS];
/// The next free slot.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot, taken at its first allocation.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The current thread's slot (the last one while its thread-local is gone).
fn slot() -> usize {
    SLOT.try_with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT_SLOT.fetch_add(1, Ordering::Relaxed).min(SLOTS - 1));
        }
        s.get()
    })
    .unwrap_or(SLOTS - 1)
}

/// Starts counting the current thread's peak from what it holds now.
fn start_count() {
    let s = slot();
    let now = HELD[s].load(Ordering::Relaxed);
    START[s].store(now, Ordering::Relaxed);
    PEAK[s].store(now, Ordering::Relaxed);
}

/// The most the current thread held since [`start_count`] beyond what it held then.
fn counted_peak() -> usize {
    let s = slot();
    usize::try_from(PEAK[s].load(Ordering::Relaxed) - START[s].load(Ordering::Relaxed)).unwrap_or(0)
}

/// The system allocator, counting each buffer against the thread that allocated it
/// until it is freed (see the module docs). Each allocation carries its thread's slot
/// in a header of `HEADER` bytes (at least its alignment) before the caller's bytes.
struct PerThread;

const HEADER: usize = 16;

/// The layout with the header in front, and the header's size.
fn with_header(layout: Layout) -> (Layout, usize) {
    let header = layout.align().max(HEADER);
    let size = layout.size() + header;
    (
        Layout::from_size_align(size, header).expect("a header fits"),
        header,
    )
}

// SAFETY: every call forwards to `System` with a layout grown by a header of at least
// the caller's alignment (so the caller's pointer, `header` bytes in, keeps that
// alignment and its `size` bytes lie inside the block); the slot is written in the
// `usize` right before the caller's pointer, inside the header, and read back from
// there by `dealloc` with the same layout arithmetic. The counting touches only
// atomics and a const-initialised thread-local cell without a destructor, which
// allocate nothing.
unsafe impl GlobalAlloc for PerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let (outer, header) = with_header(layout);
        let block = unsafe { System.alloc(outer) };
        if block.is_null() {
            return block;
        }
        let s = slot();
        let now =
            HELD[s].fetch_add(layout.size() as isize, Ordering::Relaxed) + layout.size() as isize;
        PEAK[s].fetch_max(now, Ordering::Relaxed);
        unsafe {
            let p = block.add(header);
            (p as *mut usize).sub(1).write_unaligned(s);
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let (outer, header) = with_header(layout);
        let s = unsafe { (ptr as *const usize).sub(1).read_unaligned() };
        HELD[s].fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr.sub(header), outer) };
    }
}

#[global_allocator]
static ALLOCATOR: PerThread = PerThread;

/// The AdamW step of `model` training every float parameter from `first` on (not the
/// language model's key `rng`).
fn adamw_step(model: &Program, first: usize) -> TrainStep {
    let trained: Vec<usize> = (first..model.params.len())
        .filter(|&i| model.ty(model.params[i]).dtype == DType::F32)
        .collect();
    step_program(model, 0, &trained, &Optimizer::adamw(1e-3)).expect("step")
}

/// The language model of `examples/train_transformer.rs`, larger.
fn language_model_step() -> TrainStep {
    let dims = language_model::Dims {
        B: 8,
        S: 32,
        V: 64,
        D: 128,
        L: 2,
        H: 4,
        K: 32,
        F: 512,
    };
    adamw_step(
        &language_model::trace(dims, DType::F32, 0.0).expect("traces"),
        3,
    )
}

/// The U-Net denoiser of `examples/train_unet.rs`, on larger images.
fn unet_step() -> TrainStep {
    let dims = denoise::Dims { B: 8, H: 64, W: 64 };
    adamw_step(&denoise::trace(dims).expect("traces"), 2)
}

/// The mixture of experts of `examples/train_moe.rs`, larger.
fn moe_step() -> TrainStep {
    let dims = moe_language_model::Dims {
        G: 16,
        S: 32,
        V: 32,
        M: 64,
        N: 4,
        K: 16,
        E: 4,
        H: 256,
    };
    adamw_step(&moe_language_model::trace(dims, 24).expect("traces"), 3)
}

/// A residual MLP of 8 layers under one scan that saves the products for the backward
/// pass (`dots_saveable`): the backward scan reads every layer's `h @ w1` from the
/// forward one instead of recomputing it.
fn scanned_mlp_step() -> TrainStep {
    let (layers, batch, model, hidden) = (8, 64, 128, 512);
    let b = Builder::new("scanned_mlp");
    let x = b.parameter("x", vec![batch, model], DType::F32);
    let x = x.annotate("(data, _)".parse().expect("sharding"));
    let w1 = b.parameter("w1", vec![layers, model, hidden], DType::F32);
    let w1 = w1.annotate("(_, _, model)".parse().expect("sharding"));
    let w2 = b.parameter("w2", vec![layers, hidden, model], DType::F32);
    let w2 = w2.annotate("(_, model, _)".parse().expect("sharding"));
    let options = ScanOptions::new().remat(Remat::DotsSaveable);
    let (h, _) = b.scan_with(&[w1, w2], &[x], options, |h, w| {
        let hidden = h[0].matmul(&w[0]).tanh();
        (vec![&h[0] + &hidden.matmul(&w[1])], vec![])
    });
    let loss = (&h[0] * &h[0]).mean(&[0, 1]);
    let model = b.finish(&[&loss]).expect("traces");
    adamw_step(&model, 1)
}

/// The paper's dense Transformer (`gspmd::models::dense`) on small sizes, its two layers
/// under one scan with `remat`, f32 throughout.
fn dense_step(remat: Remat) -> TrainStep {
    let config = dense::Config {
        layers: 2,
        model: 64,
        hidden: 256,
        heads: 4,
        head_dim: 16,
        batch: 8,
        seq: 32,
        dtype: DType::F32,
        remat,
    };
    adamw_step(&dense::forward(&config).expect("traces"), 1)
}

fn dense_nothing_saveable() -> TrainStep {
    dense_step(Remat::NothingSaveable)
}

fn dense_dots_saveable() -> TrainStep {
    dense_step(Remat::DotsSaveable)
}

/// The mesh `(x, y)` of the dense Transformer.
fn dense_mesh([x, y]: [usize; 2]) -> Result<Mesh> {
    dense::mesh(x, y)
}

/// The mesh `(data, model)` of `scanned_mlp_step`.
fn data_model_mesh([data, model]: [usize; 2]) -> Result<Mesh> {
    Mesh::new([("data", data), ("model", model)])
}

/// `(predicted, most predicted, counted)` bytes allocated by one run of `step` on
/// `mesh`.
fn step_peak(step: &TrainStep, mesh: Mesh) -> (usize, usize, usize) {
    let devices = mesh.num_devices();
    let exe = compile(&step.program, &mesh).expect("compiles");
    let analysis = exe.memory_analysis();
    let b = analysis.breakdown;
    let inputs = b.parameters + b.optimizer_state;
    let threads = ThreadMesh::new(mesh).expect("threads");
    let values = sample_inputs(&step.program, 3);
    let keys: Vec<String> = (0..values.len()).map(|i| format!("in/{i}")).collect();
    for ((key, value), (_, sharding)) in keys.iter().zip(&values).zip(&exe.spmd().inputs) {
        threads.upload(key, value, sharding).expect("uploads");
    }
    drop(values);
    let inputs_resident: Vec<Input> = keys.iter().map(|k| Input::Resident(k)).collect();
    let outputs: Vec<Output> = (0..exe.spmd().outputs.len())
        .map(|k| Output::Resident(format!("out/{k}")))
        .collect();
    // A first run makes the plan, the outputs' slots and whatever the threads keep.
    exe.execute(&threads, &inputs_resident, &outputs)
        .expect("runs");
    threads
        .run(|_| {
            start_count();
            Ok(())
        })
        .expect("runs");
    start_count();
    // The devices' pools keep the first run's free buffers for the second: memory the
    // step holds, not what it held before.
    let pooled = pooled_bytes();
    exe.execute(&threads, &inputs_resident, &outputs)
        .expect("runs");
    let host = counted_peak();
    let per_device = threads.run(|_| Ok(counted_peak())).expect("runs");
    let counted = pooled + host + per_device.iter().sum::<usize>();
    let in_step = devices * (analysis.peak_bytes - inputs);
    (
        in_step,
        in_step + devices * (analysis.in_flight_bytes + analysis.pool_headroom_bytes()),
        counted,
    )
}

#[test]
fn predicted_peak_is_within_ten_percent_of_the_counted_peak() {
    type Model = (
        &'static str,
        fn() -> TrainStep,
        fn([usize; 2]) -> Result<Mesh>,
    );
    let models: [Model; 6] = [
        ("language model", language_model_step, language_model::mesh),
        ("U-Net", unet_step, denoise::mesh),
        ("mixture of experts", moe_step, moe_language_model::mesh),
        (
            "scanned MLP, dots saveable",
            scanned_mlp_step,
            data_model_mesh,
        ),
        (
            "dense Transformer, nothing saveable",
            dense_nothing_saveable,
            dense_mesh,
        ),
        (
            "dense Transformer, dots saveable",
            dense_dots_saveable,
            dense_mesh,
        ),
    ];
    let mut failures = Vec::new();
    for (name, step, mesh_of) in models {
        let step = step();
        for mesh in [[1, 1], [2, 1], [2, 4]] {
            let (low, high, counted) = step_peak(&step, mesh_of(mesh).expect("mesh"));
            let nearest = counted.clamp(low, high);
            let error = nearest as f64 / counted as f64 - 1.0;
            println!(
                "{name} {}x{}: predicted {low}..={high} bytes, counted {counted} bytes \
                 ({:+.1}%)",
                mesh[0],
                mesh[1],
                100.0 * error
            );
            if error.abs() > 0.10 {
                failures.push(format!("{name} on {}x{}", mesh[0], mesh[1]));
            }
        }
    }
    assert!(failures.is_empty(), "off by more than 10% on {failures:?}");
}
