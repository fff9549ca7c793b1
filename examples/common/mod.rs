//! What the training examples share: their optimizer, the report of the compiled step, the training
//! loop (progress bar, the first steps checked against the single-device reference,
//! the loss at step 1 and the mean of the last ones, a validation loss every few
//! steps) and the loss curve written as SVG and CSV.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gspmd::prelude::*;
use gspmd::train::{AdamW, Optimizer, Trainer};
use indicatif::{ProgressBar, ProgressStyle};

/// AdamW with learning rate `lr` as the examples' loss figures were measured with:
/// `beta2 = 0.99` and no weight decay (optax's defaults are 0.999 and 1e-4).
pub fn adamw(lr: f32) -> Optimizer {
    AdamW {
        beta2: 0.99,
        weight_decay: 0.0,
        ..AdamW::new(lr)
    }
    .into()
}

/// Prints how long `trainer`'s step took to compile (`compile_time`), its op counts
/// before and after partitioning and its collectives per step; returns the compiled
/// step (`None` on the reference interpreter).
pub fn report_compiled(trainer: &Trainer, compile_time: Duration) -> Option<&Executable> {
    if !trainer.backend().partitions() {
        return None;
    }
    let exe = trainer.executable();
    println!(
        "compiled the training step for {} in {compile_time:.2?}: {} global ops -> {} per-device ops",
        exe.spmd().mesh,
        exe.propagated().nodes.len(),
        exe.spmd().program.nodes.len()
    );
    println!("collectives per step:\n{}", exe.spmd().collectives());
    Some(exe)
}

/// A validation loss every `every` steps (after steps `every`, `2 every`, ..).
pub struct Validation<'a> {
    /// Steps between validations; > 0.
    pub every: usize,
    /// The validation loss of the trainer's current parameters.
    pub loss: &'a mut dyn FnMut(&Trainer) -> gspmd::Result<f32>,
}

/// What [`train`] measured.
pub struct Run {
    /// The loss of every step.
    pub losses: Vec<f32>,
    /// `(step, validation loss)` after each validated step.
    pub validation: Vec<(usize, f32)>,
    /// The loss of step 1.
    pub first: f32,
    /// The mean loss of the last `window` steps.
    pub mean_last: f32,
    /// How many steps `mean_last` averages.
    pub window: usize,
    /// The largest relative difference of the checked steps' losses from the reference.
    pub max_diff: f32,
    /// Wall time of the loop.
    pub elapsed: Duration,
}

/// Trains `trainer` for `steps` steps on `batch()`es; the first `checked` steps also run
/// on `reference` and their losses are compared (the difference relative to the
/// reference's loss). The progress bar shows the loss, `items_per_step` `unit`s per
/// second and the last validation loss (with `validation`).
#[allow(clippy::too_many_arguments)]
pub fn train(
    trainer: &mut Trainer,
    reference: &mut Trainer,
    steps: usize,
    checked: usize,
    window: usize,
    items_per_step: usize,
    unit: &str,
    mut batch: impl FnMut() -> Vec<Literal>,
    mut validation: Option<Validation<'_>>,
) -> gspmd::Result<Run> {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} step {pos}/{len}  loss {msg}  [{elapsed_precise}]")
            .expect("valid template"),
    );
    let mut max_diff = 0.0f32;
    let (mut losses, mut validated) = (Vec::with_capacity(steps), Vec::new());
    let timer = Instant::now();
    for i in 0..steps {
        let data = batch();
        let loss = trainer.step(&data)?;
        if i < checked {
            let want = reference.step(&data)?;
            max_diff = max_diff.max((loss - want).abs() / want.abs().max(1e-12));
        }
        losses.push(loss);
        if let Some(v) = &mut validation
            && (i + 1) % v.every == 0
        {
            validated.push((i + 1, (v.loss)(trainer)?));
        }
        let rate = ((i + 1) * items_per_step) as f64 / timer.elapsed().as_secs_f64();
        let shown = validated
            .last()
            .map_or(String::new(), |(_, v)| format!("  validation {v:.4}"));
        bar.set_message(format!("{loss:.4}{shown}  {rate:.0} {unit}/s"));
        bar.inc(1);
    }
    bar.finish();
    let last = &losses[losses.len().saturating_sub(window)..];
    Ok(Run {
        first: losses.first().copied().unwrap_or(f32::NAN),
        mean_last: last.iter().sum::<f32>() / last.len().max(1) as f32,
        window: last.len(),
        max_diff,
        elapsed: timer.elapsed(),
        losses,
        validation: validated,
    })
}

/// `target/<name>` (the directory made if missing): where the examples write plots.
pub fn output_path(name: &str) -> PathBuf {
    let dir = PathBuf::from("target");
    // Best effort: a failure shows when the file is written.
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}

/// Writes `run`'s loss curve (and validation losses, if any) as an SVG at `svg` and
/// the numbers as a CSV beside it (`step,loss,validation_loss`, the last empty on steps
/// without validation); prints both paths.
pub fn write_curves(svg: &Path, title: &str, run: &Run) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let csv = svg.with_extension("csv");
    let mut text = String::from("step,loss,validation_loss\n");
    for (i, loss) in run.losses.iter().enumerate() {
        let step = i + 1;
        let validation = run.validation.iter().find(|v| v.0 == step);
        let validation = validation.map_or(String::new(), |v| v.1.to_string());
        text.push_str(&format!("{step},{loss},{validation}\n"));
    }
    std::fs::write(&csv, text)?;

    let train: Vec<(f32, f32)> = (run.losses.iter().enumerate())
        .map(|(i, &l)| ((i + 1) as f32, l))
        .collect();
    let validation: Vec<(f32, f32)> = (run.validation.iter())
        .map(|&(s, l)| (s as f32, l))
        .collect();
    let top = (train.iter().chain(&validation))
        .map(|p| p.1)
        .filter(|l| l.is_finite())
        .fold(0.0f32, f32::max);
    let root = SVGBackend::new(svg, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(1f32..train.len().max(2) as f32, 0f32..top * 1.05 + 1e-6)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()?;
    chart
        .draw_series(LineSeries::new(train, &BLUE))?
        .label("training loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if !validation.is_empty() {
        chart
            .draw_series(LineSeries::new(validation, RED.stroke_width(2)))?
            .label("validation loss")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    println!("loss curve: {} and {}", svg.display(), csv.display());
    Ok(())
}
