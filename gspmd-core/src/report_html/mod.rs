//! The compiled program as one self-contained HTML page
//! ([`Executable::write_html`](crate::Executable::write_html)): inline CSS, SVG and a
//! little JavaScript, nothing fetched. It shows the partitioner's warnings, the
//! memory a device holds node by node (a chart), every
//! collective with its bytes and reasons, and the global program grouped into
//! collapsible sections (one per named value; inside, its values by source line),
//! each value with its sharding drawn on the mesh and the collectives its op needed.

mod chart;
mod grid;

use std::collections::HashMap;
use std::fmt::Write;

use crate::analysis::{MemoryAnalysis, bytes};
use crate::ir::{Location, Op, Program, Purpose, ValueId, Why};
use crate::partition::{CollectiveStats, Runs, SpmdProgram, bytes_received, visit_collectives};
use crate::sharding::{Mesh, Sharding};

/// The page's style sheet.
const STYLE: &str = include_str!("page.css");
/// The page's script: expand/collapse, filtering, opening the section a link points
/// into, and a line counting what rendered (`#rendered`).
const SCRIPT: &str = include_str!("page.js");

/// `text` with `&`, `<`, `>` and `"` escaped for HTML text and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

/// One collective of the per-device program, as the page lists it.
struct Collective {
    /// Its row's number in the table (the anchor `#c{n}`).
    number: usize,
    /// Its op name.
    kind: &'static str,
    /// Bytes one device receives.
    bytes: usize,
    /// The HTML of its table row.
    row: String,
}

/// The page for `propagated` (the global program after propagation) partitioned into
/// `spmd`, whose memory per device is `memory`.
pub(crate) fn page(
    propagated: &Program,
    spmd: &SpmdProgram,
    memory: &MemoryAnalysis,
    gathers: &str,
) -> String {
    let mesh = &spmd.mesh;
    let (collectives, by_user) = collectives(spmd);
    let stats = spmd.collectives();
    let mut grids = Grids::default();
    let program = program_sections(propagated, mesh, &collectives, &by_user, &mut grids);
    let mut html = String::new();
    let _ = write!(
        html,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gspmd: {name} on {mesh}</title>
<style>{STYLE}</style></head><body>
<header><h1>{name} <span class="mesh">on {mesh}</span></h1>
<div class="cards">{cards}</div><p id="rendered">rendering…</p></header>
"#,
        name = escape(&propagated.name),
        mesh = escape(&mesh.to_string()),
        cards = cards(propagated, spmd, memory),
    );
    html += &memory_section(spmd, memory);
    let _ = writeln!(
        html,
        r#"<section id="gathers"><h2>Gathered weights <small>kept for the backward pass or gathered again</small></h2><div class="gathers">{}</div></section>"#,
        escape(gathers)
    );
    if !spmd.warnings.is_empty() {
        html += r#"<section id="warnings"><h2>Warnings</h2>"#;
        for w in &spmd.warnings {
            let _ = write!(html, r#"<div class="warning">{}</div>"#, escape(w));
        }
        html += "</section>";
    }
    let _ = write!(
        html,
        r#"<section id="collectives"><h2>Collectives <small>{total} per step, {bytes} bytes received per device{per_while}</small></h2>
<div class="kinds">{kinds}</div>
<table class="collectives"><thead><tr><th>#</th><th>collective (per-device %N)</th><th>over</th><th>per-device types</th><th>bytes / device</th><th>runs</th><th>at</th><th>why (global %N)</th></tr></thead><tbody>
{rows}</tbody></table></section>
<section id="program"><h2>Program <small>{values} values; each sharding drawn on the mesh ({layout}): one square per device, same colour and number = same block, dashed = partial sums</small></h2>
<div class="tools"><button id="expand">expand all</button><button id="collapse">collapse all</button><input id="filter" placeholder="filter: name, op, line, sharding"></div>
<svg class="defs" width="0" height="0"><defs>{defs}</defs></svg>
{program}</section>
<script>{SCRIPT}</script></body></html>
"#,
        total = stats.total(),
        bytes = stats.bytes(),
        per_while = per_while(&stats),
        kinds = kinds(&stats),
        rows = collectives
            .iter()
            .map(|c| c.row.as_str())
            .collect::<String>(),
        values = propagated.nodes.len(),
        layout = mesh_layout(mesh),
        defs = grids.defs,
    );
    html
}

/// `rows: data, columns: model`: how [`grid::device_grid`] lays the mesh out.
fn mesh_layout(mesh: &Mesh) -> String {
    let names: Vec<&str> = mesh.axis_names().collect();
    match names.split_first() {
        Some((first, [])) => format!("one row: {first}"),
        Some((first, rest)) => format!("rows: {first}, columns: {}", rest.join(" × ")),
        None => "one device".into(),
    }
}

/// The memory section: the peak and what it is made of, and the timeline chart.
fn memory_section(spmd: &SpmdProgram, memory: &MemoryAnalysis) -> String {
    let program = &spmd.program;
    let (mut peak, mut at) = (String::new(), String::new());
    if let Some(p) = memory.peak_node {
        at = format!("{p} {}", program.node(p).op.name());
        let _ = write!(peak, "{at} ({})", program.node(p).location);
    }
    if let Some((v, location)) = memory.peak_value {
        let _ = write!(peak, "; largest value live: {v}");
        if let Some(location) = location {
            let _ = write!(peak, " ({location})");
        }
    }
    let collectives: Vec<(usize, &str)> = (program.nodes.iter().enumerate())
        .filter(|(_, n)| n.op.is_collective())
        .map(|(i, n)| (i, n.op.name()))
        .collect();
    let b = &memory.breakdown;
    let parts: String = [
        ("parameters", b.parameters),
        ("optimizer state", b.optimizer_state),
        ("activations kept", b.activations_kept),
        ("temporaries", b.temporaries),
    ]
    .iter()
    .map(|(label, n)| format!(r#"<span class="chip">{label}: {}</span>"#, bytes(*n)))
    .collect();
    format!(
        r#"<section id="memory"><h2>Memory per device <small>peak {} at {}</small></h2><div class="kinds">{parts}</div>{}</section>
"#,
        bytes(memory.peak_bytes),
        escape(&peak),
        chart::memory_chart(memory, &collectives, &at),
    )
}

/// The summary cards: op counts, collectives, bytes, peak memory, warnings.
fn cards(propagated: &Program, spmd: &SpmdProgram, memory: &MemoryAnalysis) -> String {
    let stats = spmd.collectives();
    [
        ("global ops", propagated.nodes.len().to_string()),
        ("per-device ops", spmd.program.nodes.len().to_string()),
        ("collectives per step", stats.total().to_string()),
        (
            "bytes received / device per step",
            stats.bytes().to_string(),
        ),
        ("peak memory / device", bytes(memory.peak_bytes)),
        ("warnings", spmd.warnings.len().to_string()),
    ]
    .iter()
    .map(|(label, value)| format!(r#"<div class="card"><b>{value}</b>{label}</div>"#))
    .collect()
}

/// `; 4 of them in while loops, counted for one iteration` when some are (see
/// [`CollectiveStats`]), else nothing.
fn per_while(stats: &CollectiveStats) -> String {
    match stats.per_while_iteration {
        0 => String::new(),
        n => format!(
            "; {n} of them in while loops, counted for one iteration (the trip count is known only at run time)"
        ),
    }
}

/// One chip per collective kind: count and bytes (each collective as often as it runs,
/// [`Runs`]).
fn kinds(stats: &CollectiveStats) -> String {
    (stats.by_kind.iter())
        .map(|(kind, (n, bytes))| {
            format!(r#"<span class="chip {kind}">{kind} × {n}: {bytes} B</span>"#)
        })
        .collect()
}

/// The collectives of `spmd` (regions' included) with their table rows, and for each
/// global value of the top-level program, the numbers of the collectives its
/// partitioning emitted.
fn collectives(spmd: &SpmdProgram) -> (Vec<Collective>, HashMap<ValueId, Vec<usize>>) {
    let mut list: Vec<(String, Runs, &Program, ValueId)> = Vec::new();
    visit_collectives(&spmd.program, "", &mut |within, runs, program, v| {
        list.push((within.to_string(), runs, program, v));
    });
    let most = (list.iter())
        .map(|(_, _, p, v)| bytes_received(p, p.node(*v), &spmd.mesh))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut by_user: HashMap<ValueId, Vec<usize>> = HashMap::new();
    let rows = (list.iter().enumerate())
        .map(|(number, (within, runs, program, v))| {
            let node = program.node(*v);
            let bytes = bytes_received(program, node, &spmd.mesh);
            let axes = node.op.collective_group().map_or(&[][..], |g| &g.axes[..]);
            let mut reasons: Vec<String> = (node.why.iter())
                .map(|w| {
                    if within.is_empty() {
                        let numbers = by_user.entry(w.user).or_default();
                        if numbers.last() != Some(&number) {
                            numbers.push(number);
                        }
                    }
                    reason(w, within.is_empty())
                })
                .collect();
            if reasons.len() > SHOWN_REASONS {
                let more = reasons.split_off(SHOWN_REASONS - 1);
                reasons.push(format!(
                    "<li><details><summary>{} more</summary><ul>{}</ul></details></li>",
                    more.len(),
                    more.concat()
                ));
            }
            let reasons = reasons.concat();
            let row = format!(
                r#"<tr class="collective {kind}" id="c{number}"><td>{number}</td><td><span class="chip {kind}">{kind}</span> <small title="value of the per-device program">{within}{v}</small></td><td>{axes}</td><td><code>{input} → {output}</code></td><td class="bytes"><span class="bar" style="width:{width}px"></span>{bytes}</td><td>{runs}</td><td>{location}</td><td><ul>{reasons}</ul></td></tr>
"#,
                kind = node.op.name(),
                within = escape(within),
                axes = escape(&axes.join(", ")),
                input = program.ty(node.operands[0]),
                output = node.ty,
                width = 1 + 80 * bytes / most,
                location = escape(&node.location.to_string()),
                runs = if *runs == Runs::ONCE {
                    "1".to_string()
                } else {
                    escape(&runs.to_string())
                },
            );
            Collective {
                number,
                kind: node.op.name(),
                bytes,
                row,
            }
        })
        .collect();
    (rows, by_user)
}

/// Reasons listed in a collective's row before the rest are folded away.
const SHOWN_REASONS: usize = 3;

/// One reason as a list item: the op that needed the collective (a link to its row
/// when `linked`), its line, and what moved from which sharding to which; the whole
/// reason, with the annotations behind both shardings, as its tooltip.
fn reason(why: &Why, linked: bool) -> String {
    let user = if linked {
        format!(r##"<a href="#v{}">{}</a>"##, why.user.index(), why.user)
    } else {
        why.user.to_string()
    };
    let moved = match (why.purpose, why.value, &why.from, &why.to) {
        (Purpose::Algorithm, ..) | (_, _, None, _) | (_, _, _, None) => {
            "inside its partitioned algorithm".into()
        }
        (Purpose::Result, _, Some(from), Some(to)) => format!(
            "result <code>{}</code> → <code>{}</code>",
            escape(&from.to_string()),
            escape(&to.to_string())
        ),
        (Purpose::Operand, value, Some(from), Some(to)) => format!(
            "{} <code>{}</code> → <code>{}</code>",
            value.map_or("intermediate".into(), |v| format!("operand {v}")),
            escape(&from.to_string()),
            escape(&to.to_string())
        ),
    };
    format!(
        r#"<li title="{full}">{user} <b>{op}</b> <small>{location}</small>: {moved}</li>"#,
        full = escape(&why.to_string()),
        op = why.op,
        location = escape(&why.location.to_string()),
    )
}

/// The distinct device grids of a page, each drawn once in the page's `<defs>` and
/// shown by reference.
#[derive(Default)]
struct Grids {
    /// (shape, sharding as text) → its number.
    numbers: HashMap<(Vec<usize>, String), usize>,
    /// The drawn grids, `<g id="g{n}">`.
    defs: String,
}

impl Grids {
    /// An `<svg class="grid">` showing `sharding` of a `shape` value on `mesh`.
    fn show(&mut self, mesh: &Mesh, shape: &[usize], sharding: &Sharding) -> String {
        let key = (shape.to_vec(), sharding.to_string());
        let next = self.numbers.len();
        let number = *self.numbers.entry(key).or_insert(next);
        let (body, width, height) = grid::device_grid(mesh, shape, sharding);
        if number == next {
            let _ = write!(self.defs, r#"<g id="g{number}">{body}</g>"#);
        }
        format!(
            r##"<svg class="grid" width="{width}" height="{height}" viewBox="0 0 {width} {height}"><use href="#g{number}"/></svg>"##
        )
    }
}

/// The start of a section's table: fixed column widths, so that every section's
/// columns line up (id, name, op, type, sharding, grid, collectives).
const VALUES_TABLE: &str = r#"<table class="values"><colgroup><col style="width:70px"><col style="width:170px"><col style="width:130px"><col style="width:190px"><col style="width:210px"><col style="width:100px"><col></colgroup>"#;

/// A collapsible section of the program: the values up to and including a named one.
struct Section {
    /// The named value closing it, or a description (`parameters`).
    title: String,
    /// Its values, in program order.
    values: Vec<ValueId>,
}

/// `program`'s values cut into sections: all parameters first, then runs of values each
/// closed by a named value (a layer's output, a gradient, an updated parameter), the
/// values after the last named one last.
fn sections(program: &Program) -> Vec<Section> {
    let mut sections = vec![Section {
        title: "parameters".into(),
        values: program.params.clone(),
    }];
    let mut run = Vec::new();
    for v in program.values() {
        let node = program.node(v);
        if matches!(node.op, Op::Parameter { .. }) {
            continue;
        }
        run.push(v);
        if let Some(name) = &node.name {
            sections.push(Section {
                title: name.clone(),
                values: std::mem::take(&mut run),
            });
        }
    }
    if !run.is_empty() {
        sections.push(Section {
            title: "outputs".into(),
            values: run,
        });
    }
    sections.retain(|s| !s.values.is_empty());
    sections
}

/// The program as `<details>` sections (a long one cut into nested [`parts`]), each a
/// table of its values under a line per source location, each value a row: id, name, op, type, sharding (text and grid, its
/// annotations in a tooltip) and the collectives its partitioning emitted.
fn program_sections(
    program: &Program,
    mesh: &Mesh,
    collectives: &[Collective],
    by_user: &HashMap<ValueId, Vec<usize>>,
    grids: &mut Grids,
) -> String {
    let named: HashMap<Location, &str> = (program.nodes.iter())
        .filter(|n| !matches!(n.op, Op::Parameter { .. }))
        .filter_map(|n| Some((n.location, n.name.as_deref()?)))
        .collect();
    let mut table = |values: &[ValueId]| {
        let mut html = VALUES_TABLE.to_string();
        for run in values.chunk_by(|&a, &b| program.node(a).location == program.node(b).location) {
            let location = program.node(run[0]).location;
            let _ = write!(
                html,
                r#"<tr class="line"><td colspan="7"><code>{}</code></td></tr>"#,
                escape(&location.to_string()),
            );
            for &v in run {
                html += &value_row(program, mesh, v, collectives, by_user, grids);
            }
        }
        html + "</table>"
    };
    let summarize = |section: &Section| summary(program, section, collectives, by_user);
    let mut html = String::new();
    for (k, section) in sections(program).iter().enumerate() {
        let open = if k == 0 { " open" } else { "" };
        let _ = write!(
            html,
            r#"<details class="section"{open}><summary>{}</summary>"#,
            summarize(section)
        );
        if section.values.len() > PART_SIZE {
            for part in parts(program, &section.values, &named) {
                let _ = write!(
                    html,
                    r#"<details class="part"><summary>{}</summary>{}</details>"#,
                    summarize(&part),
                    table(&part.values)
                );
            }
        } else {
            html += &table(&section.values);
        }
        html += "</details>\n";
    }
    html
}

/// Sections longer than this are cut into [`parts`].
const PART_SIZE: usize = 64;

/// `values` (a long section) cut where a run of values traced at the line of a named
/// value starts (`named`: location → name; not twice in a row for one name), so that
/// a pass without names, like a backward pass walking the source up, shows where it
/// is; each part titled by that name.
fn parts(program: &Program, values: &[ValueId], named: &HashMap<Location, &str>) -> Vec<Section> {
    let mut parts = vec![Section {
        title: "start".into(),
        values: Vec::new(),
    }];
    for &v in values {
        let location = program.node(v).location;
        if let Some(name) = named.get(&location)
            && let Some(part) = parts.last()
            && let Some(&previous) = part.values.last()
        {
            let title = format!("at {name} (line {})", location.line);
            if program.node(previous).location != location && title != part.title {
                parts.push(Section {
                    title,
                    values: Vec::new(),
                });
            }
        }
        if let Some(part) = parts.last_mut() {
            part.values.push(v);
        }
    }
    parts
}

/// A section's summary line: its title, how many values, its source lines, and the
/// collectives its values' ops needed (each once, all of a combined one's bytes) with
/// their bytes.
fn summary(
    program: &Program,
    section: &Section,
    collectives: &[Collective],
    by_user: &HashMap<ValueId, Vec<usize>>,
) -> String {
    let mut emitted: Vec<usize> = (section.values.iter())
        .filter_map(|v| by_user.get(v))
        .flatten()
        .copied()
        .collect();
    emitted.sort_unstable();
    emitted.dedup();
    let bytes: usize = emitted.iter().map(|&n| collectives[n].bytes).sum();
    let mut lines: Vec<u32> = (section.values.iter())
        .map(|&v| program.node(v).location.line)
        .collect();
    lines.sort_unstable();
    let lines = match (lines.first(), lines.last()) {
        (Some(a), Some(b)) if a != b => format!("lines {a}–{b}"),
        (Some(a), _) => format!("line {a}"),
        _ => String::new(),
    };
    let hot = if emitted.is_empty() {
        String::new()
    } else {
        format!(
            r#" <span class="chip hot">{} collectives, {bytes} B</span>"#,
            emitted.len()
        )
    };
    format!(
        r#"<b>{}</b> <small>{} values, {lines}</small>{hot}"#,
        escape(&section.title),
        section.values.len()
    )
}

/// One value's row (see [`program_sections`]).
fn value_row(
    program: &Program,
    mesh: &Mesh,
    v: ValueId,
    collectives: &[Collective],
    by_user: &HashMap<ValueId, Vec<usize>>,
    grids: &mut Grids,
) -> String {
    let node = program.node(v);
    let (sharding, grid) = match &node.sharding {
        Some(s) => (s.to_string(), grids.show(mesh, &node.ty.shape, s)),
        None => ("?".into(), String::new()),
    };
    let origin = crate::propagation::explain(program, v);
    let badges: String = (by_user.get(&v).into_iter().flatten())
        .map(|&n| {
            let c = &collectives[n];
            format!(
                r##"<a class="chip {kind}" href="#c{n}">{kind} {bytes} B</a>"##,
                kind = c.kind,
                bytes = c.bytes,
                n = c.number
            )
        })
        .collect();
    format!(
        r#"<tr id="v{index}"{hot}><td class="id">{v}</td><td class="name" title="{name}">{name}</td><td>{op}</td><td><code>{ty}</code></td><td title="{origin}"><code>{sharding}</code></td><td>{grid}</td><td>{badges}</td></tr>"#,
        index = v.index(),
        hot = if badges.is_empty() {
            ""
        } else {
            r#" class="hot""#
        },
        name = escape(node.name.as_deref().unwrap_or("")),
        op = node.op.name(),
        ty = node.ty,
        origin = escape(&origin),
        sharding = escape(&sharding),
    )
}
