//! The memory timeline of a per-device program as an SVG chart: the bytes one device
//! holds at each node, the peak marked, the collectives as ticks under the curve.

use std::fmt::Write;

use super::escape;
use crate::analysis::{MemoryAnalysis, bytes};

/// Drawing size (the chart scales to the page's width).
const WIDTH: usize = 1200;
const HEIGHT: usize = 230;
/// Room for the bytes axis on the left and the node axis at the bottom.
const LEFT: usize = 80;
const BOTTOM: usize = 34;
const TOP: usize = 12;
const RIGHT: usize = 16;

/// The chart of `memory.timeline` (one entry per node of the per-device program),
/// with `collectives` (node index, op name) as ticks and the peak labelled `peak
/// <bytes> at <peak>`. Empty for an empty timeline.
pub(super) fn memory_chart(
    memory: &MemoryAnalysis,
    collectives: &[(usize, &str)],
    peak: &str,
) -> String {
    let timeline = &memory.timeline;
    if timeline.is_empty() {
        return String::new();
    }
    let top = timeline.iter().copied().max().unwrap_or(0).max(1) as f64;
    let (plot_w, plot_h) = (
        (WIDTH - LEFT - RIGHT) as f64,
        (HEIGHT - TOP - BOTTOM) as f64,
    );
    let last = (timeline.len() - 1).max(1) as f64;
    let x = |i: usize| LEFT as f64 + plot_w * i as f64 / last;
    let y = |b: usize| TOP as f64 + plot_h * (1.0 - b as f64 / top);
    let base = y(0);
    let mut svg = format!(
        r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="memory timeline">"#
    );
    for k in 0..=4 {
        let b = (top * k as f64 / 4.0) as usize;
        let _ = write!(
            svg,
            r#"<line class="tick" x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}"/><text class="axis" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 6,
            y(b) + 4.0,
            bytes(b),
            y = y(b),
        );
    }
    let points: String = (timeline.iter().enumerate())
        .map(|(i, &b)| format!("L{:.1},{:.1}", x(i), y(b)))
        .collect();
    let _ = write!(
        svg,
        r#"<path class="area" d="M{LEFT},{base:.1}{points}L{:.1},{base:.1}Z"/><path class="curve" d="M{}"/>"#,
        x(timeline.len() - 1),
        &points[1..],
    );
    for &(i, kind) in collectives {
        let _ = write!(
            svg,
            r#"<line class="coll {kind}" x1="{x:.1}" x2="{x:.1}" y1="{base:.1}" y2="{:.1}"><title>{kind} at node %{i}</title></line>"#,
            base + 8.0,
            x = x(i),
        );
    }
    if let Some(p) = memory.peak_node {
        let (px, py) = (x(p.index()), y(memory.peak_bytes));
        let anchor = if px > (WIDTH / 2) as f64 {
            "end"
        } else {
            "start"
        };
        let dx = if anchor == "end" { -8.0 } else { 8.0 };
        let _ = write!(
            svg,
            r#"<circle class="peak" cx="{px:.1}" cy="{py:.1}" r="4"/><text class="peak" x="{:.1}" y="{:.1}" text-anchor="{anchor}">peak {} at {}</text>"#,
            px + dx,
            py + 14.0,
            bytes(memory.peak_bytes),
            escape(peak),
        );
    }
    let _ = write!(
        svg,
        r#"<text class="axis" x="{LEFT}" y="{}">node 0</text><text class="axis" x="{}" y="{}" text-anchor="end">node {} of the per-device program (red ticks: collectives)</text></svg>"#,
        HEIGHT - 6,
        WIDTH - RIGHT,
        HEIGHT - 6,
        timeline.len() - 1,
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::MemoryBreakdown;
    use crate::ir::ValueId;

    #[test]
    fn the_curve_has_a_point_per_node_and_the_peak_is_marked() {
        let memory = MemoryAnalysis {
            peak_bytes: 4096,
            breakdown: MemoryBreakdown::default(),
            peak_node: Some(ValueId(2)),
            peak_value: None,
            timeline: vec![1024, 2048, 4096, 1024],
            in_flight_bytes: 0,
        };
        let svg = memory_chart(&memory, &[(1, "all_reduce")], "%2");
        let curve = svg.split(r#"<path class="curve" d=""#).nth(1).unwrap();
        let curve = &curve[..curve.find('"').unwrap()];
        assert_eq!(
            curve.matches('L').count() + 1,
            memory.timeline.len(),
            "{curve}"
        );
        assert!(svg.contains("peak 4.00 KiB at %2"), "{svg}");
        assert!(svg.contains(r#"<line class="coll all_reduce""#), "{svg}");
        // The peak point is at the top of the plot, node 2 of 0..=3.
        assert!(
            svg.contains(&format!(
                r#"cx="{:.1}" cy="{TOP}.0""#,
                LEFT as f64 + 2.0 * (WIDTH - LEFT - RIGHT) as f64 / 3.0
            )),
            "{svg}"
        );
    }
}
