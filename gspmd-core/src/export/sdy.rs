//! Shardy's `sdy` dialect text of a [`Mesh`] and of a [`Sharding`]: `sdy.mesh @mesh =
//! <["data"=2, "model"=4]>` and `#sdy.sharding<@mesh, [{"data"}, {"model", ?}p1]>`.

use crate::sharding::{Mesh, Sharding};

/// The symbol every exported sharding names.
pub(super) const MESH: &str = "@mesh";

/// `sdy.mesh @mesh = <["data"=2, "model"=4]>`, with `device_ids=[..]` when the mesh's
/// device order is not `0..n` (the device at row-major position `i` is `device_ids[i]`,
/// gspmd's and Shardy's meaning alike).
pub(super) fn mesh_op(mesh: &Mesh) -> String {
    let axes: Vec<String> = (mesh.axes().iter())
        .map(|(name, size)| format!("\"{name}\"={size}"))
        .collect();
    let ids = mesh.device_ids();
    let order = if ids.iter().enumerate().all(|(i, &d)| i == d) {
        String::new()
    } else {
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        format!(", device_ids=[{}]", ids.join(", "))
    };
    format!("sdy.mesh {MESH} = <[{}]{order}>", axes.join(", "))
}

/// An axis or sub-axis as Shardy writes it: `"model"`, `"model":(2)2`.
fn axis(mesh: &Mesh, name: &str) -> String {
    match mesh.axis_part(name) {
        Some(part) if !part.is_whole(mesh.axes()[part.axis].1) => {
            format!(
                "\"{}\":({}){}",
                mesh.axes()[part.axis].0,
                part.pre,
                part.size
            )
        }
        Some(part) => format!("\"{}\"", mesh.axes()[part.axis].0),
        // Validated shardings name only (sub-)axes of the mesh; keep anything else
        // visible rather than dropping it.
        None => format!("\"{name}\""),
    }
}

/// A list of axes, sorted in mesh order as Shardy requires of replicated and
/// unreduced axes: `{"data", "model"}`.
fn axis_set(mesh: &Mesh, axes: &[String]) -> String {
    let mut sorted: Vec<&String> = axes.iter().collect();
    sorted.sort_by_key(|a| mesh.axis_part(a).map(|p| (p.axis, p.pre)));
    let names: Vec<String> = sorted.into_iter().map(|a| axis(mesh, a)).collect();
    format!("{{{}}}", names.join(", "))
}

/// What of a sharding an exported attribute keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// Everything: open dims (`?`), priorities, replicated and unreduced axes (a
    /// traced program's annotations, for XLA to propagate from).
    Annotation,
    /// The dims' axes, closed (a complete sharding after propagation, or a manual
    /// computation's boundary); pending sums are the partitioner's business.
    Split,
}

/// The body of a sharding, `<@mesh, [{"data"}, {}]>` (without the `#sdy.sharding`
/// prefix that an attribute of its own takes). The caller has checked that no dim is
/// reversed (Shardy has no per-dim device order).
pub(super) fn sharding_body(mesh: &Mesh, sharding: &Sharding, keep: Keep) -> String {
    let dims: Vec<String> = (sharding.dims.iter())
        .map(|d| {
            let mut parts: Vec<String> = d.axes.iter().map(|a| axis(mesh, a)).collect();
            let annotation = keep == Keep::Annotation;
            if annotation && !d.closed {
                parts.push("?".into());
            }
            let priority = match d.priority {
                Some(p) if annotation => format!("p{p}"),
                _ => String::new(),
            };
            format!("{{{}}}{priority}", parts.join(", "))
        })
        .collect();
    let mut text = format!("<{MESH}, [{}]", dims.join(", "));
    if keep == Keep::Annotation {
        if !sharding.replicated.is_empty() {
            text += &format!(", replicated={}", axis_set(mesh, &sharding.replicated));
        }
        if !sharding.unreduced.is_empty() {
            text += &format!(", unreduced={}", axis_set(mesh, &sharding.unreduced));
        }
    }
    text + ">"
}

/// `#sdy.sharding<@mesh, [..]>`: a sharding attribute of its own (a function argument's
/// or result's, a `sharding_constraint`'s).
pub(super) fn sharding_attr(mesh: &Mesh, sharding: &Sharding, keep: Keep) -> String {
    format!("#sdy.sharding{}", sharding_body(mesh, sharding, keep))
}

/// `{"data", "model"}` in mesh order: a manual computation's `manual_axes`.
pub(super) fn manual_axes(mesh: &Mesh, axes: &[String]) -> String {
    axis_set(mesh, axes)
}
