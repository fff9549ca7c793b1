use gspmd::models::transformer::language_model;
use gspmd::prelude::*;
use gspmd::runtime::sample_inputs;
use gspmd::train::{Init, Initializer, Optimizer, Trainer, step_program};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
struct A;
static ON: AtomicBool = AtomicBool::new(false);
static N: AtomicUsize = AtomicUsize::new(0);
static SITES: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);
thread_local! { static IN: Cell<bool> = const { Cell::new(false) }; }
fn record() {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    if N.fetch_add(1, Ordering::Relaxed) % 17 != 0 {
        return;
    }
    IN.with(|f| {
        if f.get() {
            return;
        }
        f.set(true);
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        let frames: Vec<&str> = bt
            .lines()
            .filter(|l| l.contains("gspmd_core::") && !l.contains("at "))
            .map(|l| l.trim())
            .take(3)
            .collect();
        let key = frames.join(" < ");
        let mut g = SITES.lock().unwrap();
        *g.get_or_insert_with(HashMap::new).entry(key).or_default() += 1;
        f.set(false);
    });
}
unsafe impl GlobalAlloc for A {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        record();
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        record();
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static G: A = A;
#[test]
fn sites() {
    let dims = language_model::Dims {
        B: 16,
        S: 16,
        V: 16,
        D: 64,
        L: 2,
        H: 4,
        K: 16,
        F: 256,
    };
    let model = language_model::trace(dims, DType::F32).unwrap();
    let trained: Vec<usize> = (3..model.params.len()).collect();
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(1e-3)).unwrap();
    let mesh = language_model::mesh([2, 4]).unwrap();
    let mut t = Trainer::on_mesh(
        step,
        mesh,
        Initializer::new(1).rule("*", Init::Uniform { bound: 0.1 }),
    )
    .unwrap();
    let data: Vec<Literal> = sample_inputs(&model, 3).into_iter().take(3).collect();
    for _ in 0..3 {
        t.step(&data).unwrap();
    }
    ON.store(true, Ordering::Relaxed);
    for _ in 0..3 {
        t.step(&data).unwrap();
    }
    ON.store(false, Ordering::Relaxed);
    let g = SITES.lock().unwrap();
    let mut v: Vec<_> = g.as_ref().unwrap().iter().collect();
    v.sort_by_key(|x| std::cmp::Reverse(*x.1));
    let tot: usize = v.iter().map(|x| *x.1).sum();
    for (k, n) in v.iter().take(30) {
        println!(
            "{:5.1}% {}",
            100.0 * **n as f64 / tot as f64,
            k.chars().take(260).collect::<String>()
        );
    }
}
