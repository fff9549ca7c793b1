//! No whole tensor while saving or loading a sharded checkpoint: a weight of 512 KiB (and
//! its two AdamW moments) is saved from a 2x4 thread mesh and loaded onto a 4x2 one, each
//! device's block 64 KiB, under a global allocator that records the largest single
//! allocation. Neither the save nor the load may allocate a quarter of the weight at
//! once: each process holds its devices' blocks and one block-sized buffer, never a
//! gathered tensor. (The single-file format gathers every tensor whole, and is checked
//! to do so, so that the bound means something.)
//!
//! The allocator sees the whole process: this file holds one test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use gspmd::ir::{Builder, DType, Literal};
use gspmd::runtime::uniform_f32;
use gspmd::sharding::Mesh;
use gspmd::train::{Optimizer, Trainer, step_program};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

/// The system allocator, recording the largest allocation (or growth) since the last
/// [`Largest::reset`].
struct Largest(AtomicUsize);

impl Largest {
    /// Forgets the allocations so far; returns the largest of them.
    fn reset(&self) -> usize {
        self.0.swap(0, Ordering::SeqCst)
    }

    fn record(&self, size: usize) {
        self.0.fetch_max(size, Ordering::SeqCst);
    }
}

// SAFETY: every call forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.record(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.record(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.record(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static LARGEST: Largest = Largest(AtomicUsize::new(0));

#[test]
fn sharded_checkpoints_never_hold_a_whole_tensor() {
    let (rows, cols) = (512, 256);
    let whole = rows * cols * 4;
    let b = Builder::new("wide");
    let x = b
        .parameter("x", [8, rows], DType::F32)
        .annotate("(data, _)".parse().unwrap());
    let w = b
        .parameter("w", [rows, cols], DType::F32)
        .annotate("(data, model)".parse().unwrap());
    let y = x.matmul(&w);
    let loss = (&y * &y).mean(&[0, 1]);
    let model = b.finish(&[&loss]).unwrap();
    let step = step_program(&model, 0, &[1], &Optimizer::adamw(1e-3)).unwrap();
    let rng = &mut Xoshiro256PlusPlus::seed_from_u64(1);
    let initial = vec![uniform_f32(rng, &[rows, cols], -0.1, 0.1)];
    let data = vec![uniform_f32(rng, &[8, rows], -1.0, 1.0)];
    let mesh = |d, m| Mesh::new([("data", d), ("model", m)]).unwrap();
    let mut saved = Trainer::on_mesh(step.clone(), mesh(2, 4), initial.clone()).unwrap();
    saved.step(&data).unwrap();
    let mut loaded = Trainer::on_mesh(step, mesh(4, 2), initial).unwrap();
    let dir = std::env::temp_dir().join(format!("gspmd_checkpoint_memory_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    LARGEST.reset();
    saved.save(&dir).unwrap();
    let saving = LARGEST.reset();
    loaded.load(&dir).unwrap();
    let loading = LARGEST.reset();
    println!(
        "largest allocation: saving {saving} bytes, loading {loading} (a whole weight: {whole})"
    );
    assert!(
        saving < whole / 4,
        "saving allocated {saving} bytes at once"
    );
    assert!(
        loading < whole / 4,
        "loading allocated {loading} bytes at once"
    );

    // The check can fail: the single file gathers each tensor whole.
    let file = dir.join("whole.safetensors");
    saved.save(&file).unwrap();
    assert!(LARGEST.reset() >= whole);
    // And what was loaded is what was saved.
    let bits = |t: &Trainer| -> Vec<Vec<u32>> {
        (t.checkpoint().unwrap().iter())
            .map(|(_, l): &(String, Literal)| l.bit_patterns())
            .collect()
    };
    assert_eq!(bits(&loaded), bits(&saved));
    std::fs::remove_dir_all(&dir).unwrap();
}
