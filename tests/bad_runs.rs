//! Bad runs (issue 29, the runtime half): a run that never ends, cancelled by its
//! deadline while its devices keep meeting in collectives; zero timeouts and
//! deadlines refused; a kernel whose scratch does not fit the memory limit; a device
//! thread whose program's destructor panics. Each case asserts the exact [`Error`]
//! variant, and none may hang: every run happens on a watchdog thread the test gives up
//! on (failing) after [`WATCHDOG`].

use std::sync::mpsc;
use std::time::{Duration, Instant};

use gspmd::ir::{Builder, DType, Literal, Padding, Program};
use gspmd::prelude::*;
use gspmd::runtime::{RunPosition, interpret_with_deadline, interpret_with_memory_limit};

/// How long a case may take before the test fails as a hang.
const WATCHDOG: Duration = Duration::from_secs(60);

/// `f()` on another thread; a failed test if it does not return within [`WATCHDOG`].
fn within_watchdog<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(f());
    });
    receiver
        .recv_timeout(WATCHDOG)
        .expect("the run hung (or panicked) instead of returning")
}

fn f32s(shape: &[usize], fill: f32) -> Literal {
    Literal::full(shape, DType::F32, f64::from(fill))
}

/// `while sum(x) > -1 { x = x * 1 }` on `x: f32[8]` split over `x`: it never ends, and
/// on a mesh every iteration's condition all-reduces the partial sums, so the devices
/// meet every iteration and no collective ever times out. The line of the loop.
fn never_ending() -> (Program, u32) {
    let b = Builder::new("never_ending");
    let x = b.parameter("x", [8], DType::F32);
    let x = x.shard("(x)".parse().unwrap());
    let line = line!() + 1;
    let out = b.while_loop(
        |s| {
            let total = s[0].sum(&[0]);
            let minus_one = total.builder().scalar(-1.0);
            total.gt(&minus_one)
        },
        |s| {
            let one = s[0].builder().full([8], DType::F32, 1.0);
            vec![&s[0] * &one]
        },
        &[x],
    );
    (b.finish(&[&out[0]]).unwrap(), line)
}

/// The positions of a [`Error::DeadlineExceeded`] of `deadline`, or a failed test.
#[track_caller]
fn positions(error: Error, deadline: Duration) -> Vec<RunPosition> {
    match error {
        Error::DeadlineExceeded {
            deadline: d,
            positions,
        } => {
            assert_eq!(d, deadline);
            positions
        }
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
}

#[test]
fn a_never_ending_loop_is_cancelled_by_the_interpreter_deadline() {
    let deadline = Duration::from_millis(200);
    let (program, _) = never_ending();
    let started = Instant::now();
    let error =
        within_watchdog(move || interpret_with_deadline(&program, &[f32s(&[8], 1.0)], deadline))
            .unwrap_err();
    assert!(started.elapsed() >= deadline);
    let message = error.to_string();
    let at = positions(error, deadline);
    assert_eq!(at.len(), 1, "{message}");
    // Stopped inside the loop's regions, past its first iterations.
    assert!(at[0].op.is_some() && at[0].location.is_some(), "{message}");
    assert!(at[0].iteration.is_some_and(|i| i > 0), "{message}");
    assert!(message.contains("loop iteration"), "{message}");
}

#[test]
fn a_never_ending_loop_meeting_in_collectives_is_cancelled_by_the_mesh_deadline() {
    let deadline = Duration::from_millis(300);
    let (program, _) = never_ending();
    let mesh = Mesh::new([("x", 4)]).unwrap();
    let exe = compile(&program, &mesh).unwrap();
    let threads = ThreadMesh::new(mesh)
        .unwrap()
        .with_deadline(deadline)
        .unwrap();
    assert_eq!(threads.deadline(), Some(deadline));
    let (error, threads) = within_watchdog(move || {
        let error = exe.run(&threads, &[f32s(&[8], 1.0)]).unwrap_err();
        (error, threads)
    });
    let message = error.to_string();
    println!("{message}");
    let at = positions(error, deadline);
    // Every device is named, each inside the loop (at a node of its regions, in an
    // iteration past the first).
    let devices: Vec<usize> = at.iter().map(|p| p.device).collect();
    assert_eq!(devices, [0, 1, 2, 3], "{message}");
    for p in &at {
        assert!(p.op.is_some() && p.location.is_some(), "{message}");
        assert!(p.iteration.is_some_and(|i| i > 0), "{message}");
    }
    // The mesh runs the next program.
    let ids = within_watchdog(move || threads.run(|ctx| Ok(ctx.device())));
    assert_eq!(ids.unwrap(), [0, 1, 2, 3]);
}

#[test]
fn a_run_within_its_deadline_is_unaffected() {
    let b = Builder::new("quick");
    let x = b.parameter("x", [8], DType::F32);
    let y = x.shard("(x)".parse().unwrap()).sum(&[0]);
    let program = b.finish(&[&y]).unwrap();
    let mesh = Mesh::new([("x", 2)]).unwrap();
    let exe = compile(&program, &mesh).unwrap();
    let threads = ThreadMesh::new(mesh)
        .unwrap()
        .with_deadline(Duration::from_secs(30))
        .unwrap();
    let x = f32s(&[8], 1.0);
    let want = interpret(&program, std::slice::from_ref(&x)).unwrap();
    assert_eq!(exe.run(&threads, std::slice::from_ref(&x)).unwrap(), want);
    let within = interpret_with_deadline(&program, &[x], Duration::from_secs(30)).unwrap();
    assert_eq!(within, want);
}

#[test]
fn zero_timeouts_and_deadlines_are_refused() {
    let zero = |r: Result<ThreadMesh>| match r {
        Err(Error::ZeroDuration { setting }) => setting,
        other => panic!("expected ZeroDuration, got {other:?}"),
    };
    let threads = || ThreadMesh::new(Mesh::new([("x", 2)]).unwrap()).unwrap();
    assert_eq!(
        zero(threads().with_timeout(Duration::ZERO)),
        "ThreadMesh::with_timeout"
    );
    assert_eq!(
        zero(threads().with_deadline(Duration::ZERO)),
        "ThreadMesh::with_deadline"
    );
    assert!(matches!(
        Reference::new().with_deadline(Duration::ZERO),
        Err(Error::ZeroDuration {
            setting: "Reference::with_deadline"
        })
    ));
    let (program, _) = never_ending();
    assert!(matches!(
        interpret_with_deadline(&program, &[f32s(&[8], 1.0)], Duration::ZERO),
        Err(Error::ZeroDuration {
            setting: "interpret_with_deadline"
        })
    ));
    // `None` still means no bound.
    let unbounded = threads().with_timeout(None).unwrap().with_deadline(None);
    assert_eq!(unbounded.unwrap().deadline(), None);
}

/// A 31x31 convolution of a 128x128 image of 32 features into one: 2 MiB in, 64 KiB
/// out, but its kernel reads the image through a copy padded by 15 on every side,
/// 3.2 MB.
fn wide_convolution() -> (Program, u32) {
    let b = Builder::new("wide_convolution");
    let image = b.parameter("image", [1, 128, 128, 32], DType::F32);
    let kernel = b.parameter("kernel", [31, 31, 32, 1], DType::F32);
    let line = line!() + 1;
    let out = image.conv2d(&kernel, [1, 1], Padding::Same);
    (b.finish(&[&out]).unwrap(), line)
}

#[test]
fn a_kernel_whose_scratch_exceeds_the_memory_limit_is_out_of_memory() {
    const LIMIT: usize = 4 << 20;
    let (program, line) = wide_convolution();
    let inputs = [f32s(&[1, 128, 128, 32], 1.0), f32s(&[31, 31, 32, 1], 1.0)];
    let is_the_convolution = |e: &Error| match e {
        Error::OutOfMemory {
            op,
            location,
            bytes,
            scratch,
            limit,
            ..
        } => {
            *op == "convolution"
                && location.line == line
                && *bytes == 128 * 128 * 4
                && *scratch >= 158 * 158 * 32 * 4
                && *limit == LIMIT
        }
        _ => false,
    };
    let error = interpret_with_memory_limit(&program, &inputs, LIMIT).unwrap_err();
    assert!(is_the_convolution(&error), "{error:?}");
    assert!(error.to_string().contains("kernel scratch"), "{error}");
    // On a mesh of one device with the same limit.
    let mesh = Mesh::new([("x", 1)]).unwrap();
    let threads = ThreadMesh::new(mesh.clone())
        .unwrap()
        .with_memory_limit(LIMIT);
    let error = compile(&program, &mesh)
        .unwrap()
        .run(&threads, &inputs)
        .unwrap_err();
    match &error {
        Error::DeviceFailed { cause, .. } => assert!(is_the_convolution(cause), "{error:?}"),
        other => panic!("{other:?}"),
    }
    // With room for the scratch it runs.
    let roomy = interpret_with_memory_limit(&program, &inputs, 128 << 20).unwrap();
    assert_eq!(roomy[0].shape(), [1, 128, 128, 1]);
}

/// Panics when dropped, as a user's value captured by a program might.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("a destructor panics on purpose");
    }
}

#[test]
fn a_destructor_panicking_on_a_device_thread_does_not_end_the_thread() {
    let threads = ThreadMesh::new(Mesh::new([("x", 2), ("y", 2)]).unwrap()).unwrap();
    let (result, threads) = within_watchdog(move || {
        let bomb = PanicsWhenDropped;
        // The program, with what it captures, is dropped on the device that finishes
        // last, after the run's result is sent: the run succeeded, the panic hook
        // reports the destructor's panic.
        let result = threads.run(move |ctx| {
            let _captured = &bomb;
            Ok(ctx.device())
        });
        (result, threads)
    });
    assert_eq!(result.unwrap(), [0, 1, 2, 3]);
    // Every device thread is alive: the mesh runs again, twice, and a program's own
    // panic is still the run's typed error.
    for _ in 0..2 {
        let ids = threads.run(|ctx| Ok(ctx.device())).unwrap();
        assert_eq!(ids, [0, 1, 2, 3]);
    }
    let panicked = threads.run(|ctx| {
        assert_ne!(ctx.device(), 2, "device 2 panics on purpose");
        Ok(())
    });
    assert!(
        matches!(panicked, Err(Error::DevicePanicked { device: 2, .. })),
        "{panicked:?}"
    );
    assert_eq!(threads.run(|ctx| Ok(ctx.device())).unwrap(), [0, 1, 2, 3]);
}
