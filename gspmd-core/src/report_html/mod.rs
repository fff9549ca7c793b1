//! The compiled program as one self-contained HTML page
//! ([`Executable::write_html`](crate::Executable::write_html)): inline CSS, SVG and a
//! little JavaScript, nothing fetched. It shows the partitioner's warnings, every
//! collective with its bytes and reasons, and the global program grouped into
//! collapsible sections (one per named value; inside, its values by source line),
//! each value with its sharding drawn on the mesh and the collectives its op needed.

mod grid;

use std::collections::HashMap;
use std::fmt::Write;

use crate::ir::{Op, Program, Purpose, ValueId, Why};
use crate::partition::{SpmdProgram, bytes_received, visit_collectives};
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
/// `spmd`.
pub(crate) fn page(propagated: &Program, spmd: &SpmdProgram) -> String {
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
        cards = cards(propagated, spmd),
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
        r#"<section id="collectives"><h2>Collectives <small>{total} per step, {bytes} bytes received per device</small></h2>
<div class="kinds">{kinds}</div>
<table class="collectives"><thead><tr><th>#</th><th>collective</th><th>over</th><th>per-device types</th><th>bytes / device</th><th>at</th><th>why</th></tr></thead><tbody>
{rows}</tbody></table></section>
<section id="program"><h2>Program <small>{values} values; each sharding drawn on the mesh ({layout}): one square per device, same colour and number = same block, dashed = partial sums</small></h2>
<div class="tools"><button id="expand">expand all</button><button id="collapse">collapse all</button><input id="filter" placeholder="filter: name, op, line, sharding"></div>
<svg class="defs" width="0" height="0"><defs>{defs}</defs></svg>
{program}</section>
<script>{SCRIPT}</script></body></html>
"#,
        total = stats.total(),
        bytes = stats.bytes(),
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

/// The summary cards: op counts, collectives, bytes, warnings.
fn cards(propagated: &Program, spmd: &SpmdProgram) -> String {
    let stats = spmd.collectives();
    [
        ("global ops", propagated.nodes.len().to_string()),
        ("per-device ops", spmd.program.nodes.len().to_string()),
        ("collectives", stats.total().to_string()),
        ("bytes received / device", stats.bytes().to_string()),
        ("warnings", spmd.warnings.len().to_string()),
    ]
    .iter()
    .map(|(label, value)| format!(r#"<div class="card"><b>{value}</b>{label}</div>"#))
    .collect()
}

/// One chip per collective kind: count and bytes.
fn kinds(stats: &crate::partition::CollectiveStats) -> String {
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
    let mut list: Vec<(String, &Program, ValueId)> = Vec::new();
    visit_collectives(&spmd.program, "", &mut |within, program, v| {
        list.push((within.to_string(), program, v));
    });
    let most = (list.iter())
        .map(|(_, p, v)| bytes_received(p, p.node(*v), &spmd.mesh))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut by_user: HashMap<ValueId, Vec<usize>> = HashMap::new();
    let rows = (list.iter().enumerate())
        .map(|(number, (within, program, v))| {
            let node = program.node(*v);
            let bytes = bytes_received(program, node, &spmd.mesh);
            let axes = node.op.collective_group().map_or(&[][..], |g| &g.axes[..]);
            let mut reasons: Vec<String> = (node.why.iter())
                .map(|w| {
                    if within.is_empty() {
                        by_user.entry(w.user).or_default().push(number);
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
                r#"<tr class="collective {kind}" id="c{number}"><td>{number}</td><td><span class="chip {kind}">{kind}</span> <small>{within}{v}</small></td><td>{axes}</td><td><code>{input} → {output}</code></td><td class="bytes"><span class="bar" style="width:{width}px"></span>{bytes}</td><td>{location}</td><td><ul>{reasons}</ul></td></tr>
"#,
                kind = node.op.name(),
                within = escape(within),
                axes = escape(&axes.join(", ")),
                input = program.ty(node.operands[0]),
                output = node.ty,
                width = 1 + 80 * bytes / most,
                location = escape(&node.location.to_string()),
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

/// The program as `<details>` sections, each a table of its values under a line per
/// source location, each value a row: id, name, op, type, sharding (text and grid, its
/// annotations in a tooltip) and the collectives its partitioning emitted.
fn program_sections(
    program: &Program,
    mesh: &Mesh,
    collectives: &[Collective],
    by_user: &HashMap<ValueId, Vec<usize>>,
    grids: &mut Grids,
) -> String {
    let mut html = String::new();
    for section in sections(program) {
        let emitted: Vec<&Collective> = (section.values.iter())
            .filter_map(|v| by_user.get(v))
            .flatten()
            .map(|&n| &collectives[n])
            .collect();
        let bytes: usize = emitted.iter().map(|c| c.bytes).sum();
        let lines = {
            let mut lines: Vec<u32> = (section.values.iter())
                .map(|&v| program.node(v).location.line)
                .collect();
            lines.sort_unstable();
            match (lines.first(), lines.last()) {
                (Some(a), Some(b)) if a != b => format!("lines {a}–{b}"),
                (Some(a), _) => format!("line {a}"),
                _ => String::new(),
            }
        };
        let open = if html.is_empty() { " open" } else { "" };
        let _ = write!(
            html,
            r#"<details class="section"{open}><summary><b>{title}</b> <small>{n} values, {lines}</small>{coll}</summary>"#,
            title = escape(&section.title),
            n = section.values.len(),
            coll = if emitted.is_empty() {
                String::new()
            } else {
                format!(
                    r#" <span class="chip hot">{} collectives, {bytes} B</span>"#,
                    emitted.len()
                )
            },
        );
        html += VALUES_TABLE;
        for run in section
            .values
            .chunk_by(|&a, &b| program.node(a).location == program.node(b).location)
        {
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
        html += "</table>";
        html += "</details>\n";
    }
    html
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
