//! The HTML report (`Executable::write_html`) of the example language model's training
//! step: self-contained, with a device grid per value, a row per collective and the
//! memory chart, and rendered in headless Chromium when one is on PATH (the script in
//! the page counts what rendered into `#rendered`; the test prints the screenshot's
//! path). With `GSPMD_REPORT_HTML=<page>` the test also renders that page (CI renders
//! the one `train_transformer --html` wrote).

use std::path::{Path, PathBuf};
use std::process::Command;

use gspmd::models::transformer::{WEIGHTS, language_model};
use gspmd::prelude::*;
use gspmd::train::{Optimizer, step_program};

/// The first of the usual Chromium executables found on PATH.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    [
        "chromium",
        "chromium-browser",
        "chromium-headless-shell",
        "google-chrome",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|candidate| candidate.is_file())
}

/// How often `needle` occurs in `text`.
fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

/// Renders `page` in headless `browser`: checks that the page's script ran and counted
/// every device grid (all drawn), collective and chart that the HTML holds, and writes a
/// screenshot next to the page; returns its path.
fn check_rendered(browser: &Path, page: &Path) -> PathBuf {
    let html = std::fs::read_to_string(page).unwrap();
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let headless = ["--headless", "--no-sandbox", "--disable-gpu"];
    let dom = Command::new(browser)
        .args(headless)
        .args(["--dump-dom", &url])
        .output()
        .unwrap();
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8(dom.stdout).unwrap();
    let grids = count(&html, r#"<svg class="grid""#);
    let want = format!(
        "rendered: {grids} device grids ({grids} drawn), {} collectives, {} charts, {} sections",
        count(&html, r#"<tr class="collective"#),
        count(&html, r#"<svg class="chart""#),
        count(&html, r#"<details class="section""#),
    );
    assert!(dom.contains(&want), "`{want}` not in the rendered page");
    let screenshot = page.with_extension("png");
    let shot = Command::new(browser)
        .args(headless)
        .arg(format!("--screenshot={}", screenshot.display()))
        .args(["--window-size=1400,2000", &url])
        .output()
        .unwrap();
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let size = std::fs::metadata(&screenshot).unwrap().len();
    assert!(size > 20_000, "{}: only {size} bytes", screenshot.display());
    println!("{want}\nscreenshot: {}", screenshot.display());
    screenshot
}

#[test]
fn the_language_model_step_report_is_one_page_that_renders() {
    let model = language_model::trace(
        language_model::Dims {
            B: 8,
            S: 16,
            V: 64,
            D: 64,
            L: 2,
            H: 4,
            K: 16,
            F: 256,
        },
        DType::F32,
        0.0,
    )
    .unwrap();
    let step = step_program(&model, 0, WEIGHTS, &Optimizer::adamw(1e-3)).unwrap();
    let exe = compile(&step.program, &language_model::mesh([2, 4]).unwrap()).unwrap();
    let dir = std::env::temp_dir().join(format!("gspmd_report_html_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("train_step.html");
    exe.write_html(&page).unwrap();

    let html = std::fs::read_to_string(&page).unwrap();
    for external in ["http://", "https://", " src=", "<link"] {
        assert!(!html.contains(external), "the page refers to `{external}`");
    }
    let sharded = exe
        .propagated()
        .nodes
        .iter()
        .filter(|n| n.sharding.is_some());
    assert_eq!(count(&html, r#"<svg class="grid""#), sharded.count());
    let collectives = exe.spmd().collectives().total();
    assert!(collectives > 0);
    assert_eq!(count(&html, r#"<tr class="collective"#), collectives);
    for name in [
        "parameters",
        "attended",
        "grad(layers.ffn.w1)",
        "new(layers.attn.wq)",
    ] {
        assert!(
            html.contains(&format!("<b>{name}</b>")),
            "no section {name}"
        );
    }

    match chromium() {
        Some(browser) => {
            check_rendered(&browser, &page);
            if let Some(other) = std::env::var_os("GSPMD_REPORT_HTML") {
                check_rendered(&browser, Path::new(&other));
            }
        }
        None => println!(
            "skipped rendering: no chromium on PATH ({})",
            page.display()
        ),
    }
}
