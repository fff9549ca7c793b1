//! A sharding drawn as the mesh: one square per device, coloured by the block of the
//! tensor it holds (devices with the same colour hold the same block), as SVG.

use std::collections::HashMap;
use std::fmt::Write;

use super::escape;
use crate::sharding::{Mesh, Sharding};

/// Side of one device's square, in pixels.
const CELL: usize = 16;

/// The mesh laid out as rows (the first axis) by columns (the other axes, row-major),
/// as SVG elements: each device a square labelled with its block's number (blocks
/// numbered in mesh order), coloured by block, with a tooltip naming the device and
/// its element ranges; blocks of a value with pending sums (`unreduced`) get dashed
/// borders. Returns the elements and the width and height they cover.
///
/// `sharding` must be valid for `mesh` and `shape` ([`Sharding::validate`]).
pub(super) fn device_grid(
    mesh: &Mesh,
    shape: &[usize],
    sharding: &Sharding,
) -> (String, usize, usize) {
    let rows = mesh.axes().first().map_or(1, |(_, size)| *size);
    let columns = mesh.num_devices() / rows.max(1);
    let mut blocks: HashMap<Vec<usize>, usize> = HashMap::new();
    let ids: Vec<usize> = (mesh.device_ids().iter())
        .map(|&device| {
            let block: Vec<usize> = (0..shape.len())
                .map(|d| sharding.shard_index(d, mesh, device))
                .collect();
            let next = blocks.len();
            *blocks.entry(block).or_insert(next)
        })
        .collect();
    let dashed = if sharding.unreduced.is_empty() {
        ""
    } else {
        r#" stroke-dasharray="3 2""#
    };
    let mut svg = String::new();
    for (position, (&device, &block)) in mesh.device_ids().iter().zip(&ids).enumerate() {
        let (x, y) = ((position % columns) * CELL, (position / columns) * CELL);
        let ranges: Vec<String> = (sharding.device_block(mesh, shape, device).iter())
            .map(|(offset, len)| format!("{offset}..{}", offset + len))
            .collect();
        let fill = colour(block, blocks.len());
        let _ = write!(
            svg,
            r##"<g><title>D{device}: [{}]{}</title><rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="{fill}" stroke="#455a64" stroke-width="0.6"{dashed}/><text x="{}" y="{}">{block}</text></g>"##,
            ranges.join(", "),
            escape(&unreduced_note(sharding)),
            x + CELL / 2,
            y + CELL / 2 + 3,
        );
    }
    (svg, columns * CELL, rows * CELL)
}

/// `, partial sums over {model}` for a sharding with unreduced axes; empty otherwise.
fn unreduced_note(sharding: &Sharding) -> String {
    if sharding.unreduced.is_empty() {
        String::new()
    } else {
        format!(", partial sums over {{{}}}", sharding.unreduced.join(", "))
    }
}

/// The fill of block `block` of `blocks`: evenly spaced hues, grey when there is one
/// block (the value is replicated).
fn colour(block: usize, blocks: usize) -> String {
    if blocks <= 1 {
        return "#cfd8dc".into();
    }
    format!("hsl({}, 65%, 68%)", block * 360 / blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_holding_one_block_share_its_number_and_colour() {
        let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
        let (svg, width, height) = device_grid(&mesh, &[8, 8], &"(model, _)".parse().unwrap());
        assert_eq!((width, height), (64, 32));
        // Rows (data) hold the same four blocks: block k at column k of both rows.
        let labels: Vec<&str> = (svg.split("<text").skip(1))
            .map(|t| &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()])
            .collect();
        assert_eq!(labels, ["0", "1", "2", "3", "0", "1", "2", "3"]);
        assert!(svg.contains("<title>D5: [2..4, 0..8]</title>"), "{svg}");
        let (replicated, ..) = device_grid(&mesh, &[8], &"(_) unreduced={data}".parse().unwrap());
        assert_eq!(replicated.matches("#cfd8dc").count(), 8);
        assert!(replicated.contains("partial sums over {data}"));
        assert!(replicated.contains("stroke-dasharray"));
    }
}
