//! Shardy's attributes: the `sdy.mesh` and `#sdy.sharding<..>` of arguments, results
//! and `sdy.sharding_constraint`s, as gspmd meshes and shardings.

use super::text::{matching, split_top};
use crate::sharding::{DimSharding, Mesh, Sharding};

/// `sdy.mesh`'s `@mesh = <["data"=2, "model"=4]>` (after the `sdy.mesh `).
pub(super) fn parse_mesh(text: &str) -> Result<Mesh, String> {
    let at = text.find("<[").ok_or("sdy.mesh: no axis list")? + 2;
    let inner = text[at..].split(']').next().unwrap_or("");
    let axes = (split_top(inner).into_iter())
        .map(|a| {
            let (name, size) = a
                .split_once('=')
                .ok_or(format!("mesh axis `{a}` has no size"))?;
            let size = size
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("mesh axis `{a}`"))?;
            Ok((name.trim().trim_matches('"').to_string(), size))
        })
        .collect::<Result<Vec<(String, usize)>, String>>()?;
    Mesh::new(axes).map_err(|e| e.to_string())
}

/// The `sdy.sharding = #sdy.sharding<..>` in an argument's or result's attributes.
pub(super) fn sdy_sharding(text: &str, mesh: &Mesh) -> Result<Option<Sharding>, String> {
    match text.find("#sdy.sharding<") {
        Some(at) => parse_sharding(&text[at + "#sdy.sharding".len()..], mesh).map(Some),
        None => Ok(None),
    }
}

/// `<@mesh, [{"data"}, {"model", ?}p1], replicated={"x"}>`.
pub(super) fn parse_sharding(text: &str, mesh: &Mesh) -> Result<Sharding, String> {
    let open = text
        .find('[')
        .ok_or_else(|| format!("sharding `{text}` has no dims"))?;
    let close = matching(text, open).ok_or_else(|| format!("sharding `{text}` is unclosed"))?;
    let axis = |a: &str| -> Result<String, String> {
        // `"model":(1)2` is gspmd's sub-axis `model:(1)2`.
        let name = a.replace('"', "");
        match mesh.axis_part(&name) {
            Some(_) => Ok(name),
            None => Err(format!("axis `{a}` is not in the mesh ({mesh})")),
        }
    };
    let dims = (split_top(&text[open + 1..close]).into_iter())
        .map(|d| {
            let end = d
                .rfind('}')
                .ok_or_else(|| format!("dim `{d}` is not `{{..}}`"))?;
            let priority = d[end + 1..].strip_prefix('p').and_then(|p| p.parse().ok());
            let mut dim = DimSharding::closed(Vec::<String>::new());
            for a in split_top(&d[1..end]) {
                if a == "?" {
                    dim.closed = false;
                } else {
                    dim.axes.push(axis(a)?);
                }
            }
            dim.priority = priority;
            Ok(dim)
        })
        .collect::<Result<Vec<DimSharding>, String>>()?;
    let mut sharding = Sharding::new(dims);
    let set = |key: &str| -> Result<Vec<String>, String> {
        match text[close..].find(key) {
            Some(at) => {
                let rest = &text[close + at + key.len()..];
                let inner = rest.trim_start_matches('{').split('}').next().unwrap_or("");
                split_top(inner).into_iter().map(axis).collect()
            }
            None => Ok(Vec::new()),
        }
    };
    sharding.replicated = set("replicated=")?;
    sharding.unreduced = set("unreduced=")?;
    Ok(sharding)
}
