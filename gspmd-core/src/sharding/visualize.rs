//! Text pictures of which device holds which block of a sharded tensor (like JAX's
//! `jax.debug.visualize_array_sharding`).

use super::mesh::Mesh;
use super::spec::Sharding;
use super::tiling::dim_shard;

/// Widest a column grows (in characters) to show a block's size relative to the others.
const MAX_COLUMN_WIDTH: usize = 24;
/// Tallest a row grows (in lines) to show a block's size relative to the others.
const MAX_ROW_HEIGHT: usize = 4;

/// Pictures how `sharding` lays a tensor of `shape` out over `mesh`.
///
/// Rank 1 and 2: a grid of boxes, one per block (dim 0 down, the last dim across),
/// labelled with the devices holding it (`D0,D4` for a block replicated on devices 0
/// and 4); widths and heights are roughly proportional to the block sizes, so the short
/// last block of an uneven dim shows. Other ranks: one line per device, `D3 -> [0..4,
/// 2..4]` (its block's range per dim). A last line names unreduced axes, if any.
///
/// `sharding` must be valid for `mesh` and `shape` ([`Sharding::validate`]).
///
/// ```
/// # use gspmd_core::sharding::{visualize, Mesh};
/// let mesh = Mesh::new([("x", 2)]).unwrap();
/// let s = "(x)".parse().unwrap();
/// assert_eq!(visualize(&mesh, &[4], &s), "┌────┬────┐\n│ D0 │ D1 │\n└────┴────┘\n");
/// ```
pub fn visualize(mesh: &Mesh, shape: &[usize], sharding: &Sharding) -> String {
    let mut out = match shape.len() {
        1 | 2 => grid(mesh, shape, sharding),
        _ => device_list(mesh, shape, sharding),
    };
    if !sharding.unreduced.is_empty() {
        out += &format!("unreduced over {{{}}}\n", sharding.unreduced.join(", "));
    }
    out
}

/// Box grid for rank 1 (one row) or rank 2.
fn grid(mesh: &Mesh, shape: &[usize], sharding: &Sharding) -> String {
    let col_dim = shape.len() - 1;
    let row_shards = if col_dim == 1 {
        sharding.num_shards(0, mesh)
    } else {
        1
    };
    let col_shards = sharding.num_shards(col_dim, mesh);
    let mut labels = vec![vec![Vec::new(); col_shards]; row_shards];
    for device in 0..mesh.num_devices() {
        let row = if col_dim == 1 {
            sharding.shard_index(0, mesh, device)
        } else {
            0
        };
        let col = sharding.shard_index(col_dim, mesh, device);
        if let Some(devices) = labels.get_mut(row).and_then(|r| r.get_mut(col)) {
            devices.push(format!("D{device}"));
        }
    }
    let labels: Vec<Vec<String>> = labels
        .into_iter()
        .map(|row| row.into_iter().map(|devices| devices.join(",")).collect())
        .collect();

    let min_widths: Vec<usize> = (0..col_shards)
        .map(|c| {
            let widest = labels.iter().map(|row| row[c].chars().count()).max();
            widest.unwrap_or(0) + 2
        })
        .collect();
    let widths = extents(shape[col_dim], &min_widths, MAX_COLUMN_WIDTH);
    let heights = if col_dim == 1 {
        extents(shape[0], &vec![1; row_shards], MAX_ROW_HEIGHT)
    } else {
        vec![1]
    };

    let mut out = rule(&widths, '┌', '┬', '┐');
    for (r, (row, &height)) in labels.iter().zip(&heights).enumerate() {
        if r > 0 {
            out += &rule(&widths, '├', '┼', '┤');
        }
        for line in 0..height {
            out.push('│');
            for (label, &width) in row.iter().zip(&widths) {
                let text = if line == (height - 1) / 2 {
                    label.as_str()
                } else {
                    ""
                };
                out += &format!("{text:^width$}│");
            }
            out.push('\n');
        }
    }
    out + &rule(&widths, '└', '┴', '┘')
}

/// A horizontal border line over columns of `widths`.
fn rule(widths: &[usize], left: char, cross: char, right: char) -> String {
    let segments: Vec<String> = widths.iter().map(|&w| "─".repeat(w)).collect();
    format!("{left}{}{right}\n", segments.join(&cross.to_string()))
}

/// Drawn extents of the blocks of a dim of `size` cut in `min.len()` shards: each at
/// least its `min`, and otherwise proportional to the block's length, scaled so that the
/// smallest non-empty block still gets its minimum (up to `cap` for a full block).
fn extents(size: usize, min: &[usize], cap: usize) -> Vec<usize> {
    let lens: Vec<usize> = (0..min.len())
        .map(|i| dim_shard(size, min.len(), i).1)
        .collect();
    let chunk = lens.iter().copied().max().unwrap_or(0);
    let widest_min = min.iter().copied().max().unwrap_or(0);
    let full = lens
        .iter()
        .zip(min)
        .filter(|(len, _)| **len > 0)
        .map(|(&len, &m)| (m * chunk).div_ceil(len))
        .max()
        .unwrap_or(widest_min)
        .min(cap.max(widest_min));
    lens.iter()
        .zip(min)
        .map(|(&len, &m)| {
            // `full * len / chunk`, rounded to nearest.
            let scaled = (2 * full * len + chunk) / (2 * chunk).max(1);
            scaled.max(m)
        })
        .collect()
}

/// `D3 -> [0..4, 2..4]` per device, for ranks without a picture.
fn device_list(mesh: &Mesh, shape: &[usize], sharding: &Sharding) -> String {
    (0..mesh.num_devices())
        .map(|device| {
            let ranges: Vec<String> = sharding
                .device_block(mesh, shape, device)
                .iter()
                .map(|(offset, len)| format!("{offset}..{}", offset + len))
                .collect();
            format!("D{device} -> [{}]\n", ranges.join(", "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh_2x4() -> Mesh {
        Mesh::new([("data", 2), ("model", 4)]).unwrap()
    }

    /// 2x4 mesh whose row-major positions hold these device ids.
    fn permuted_2x4() -> Mesh {
        Mesh::with_device_order([("data", 2), ("model", 4)], vec![2, 5, 0, 7, 4, 1, 6, 3]).unwrap()
    }

    fn show(mesh: &Mesh, shape: &[usize], text: &str) -> String {
        visualize(mesh, shape, &text.parse().unwrap())
    }

    #[test]
    fn rank_1_labels_replicated_blocks_with_all_their_devices() {
        let expected = "\
┌───────┬───────┬───────┬───────┐
│ D0,D4 │ D1,D5 │ D2,D6 │ D3,D7 │
└───────┴───────┴───────┴───────┘
";
        assert_eq!(show(&mesh_2x4(), &[8], "(model)"), expected);
        let expected = "\
┌─────────────────────────┐
│ D0,D1,D2,D3,D4,D5,D6,D7 │
└─────────────────────────┘
";
        assert_eq!(show(&mesh_2x4(), &[8], "(_)"), expected);
    }

    #[test]
    fn rank_2_follows_the_device_order() {
        let expected = "\
┌────┬────┬────┬────┐
│ D2 │ D5 │ D0 │ D7 │
├────┼────┼────┼────┤
│ D4 │ D1 │ D6 │ D3 │
└────┴────┴────┴────┘
";
        assert_eq!(show(&permuted_2x4(), &[8, 8], "(data, model)"), expected);
        let expected = "\
┌────┬────┐
│ D2 │ D4 │
├────┼────┤
│ D5 │ D1 │
├────┼────┤
│ D0 │ D6 │
├────┼────┤
│ D7 │ D3 │
└────┴────┘
";
        assert_eq!(show(&permuted_2x4(), &[8, 8], "(model, data)"), expected);
    }

    #[test]
    fn uneven_blocks_are_smaller() {
        // Rows: 3 over 2 is 2 + 1; columns: 10 over 4 is 3 + 3 + 3 + 1.
        let expected = "\
┌────────────┬────────────┬────────────┬────┐
│     D2     │     D5     │     D0     │ D7 │
│            │            │            │    │
├────────────┼────────────┼────────────┼────┤
│     D4     │     D1     │     D6     │ D3 │
└────────────┴────────────┴────────────┴────┘
";
        assert_eq!(show(&permuted_2x4(), &[3, 10], "(data, model)"), expected);
    }

    #[test]
    fn higher_ranks_list_device_blocks() {
        // (_, model, data) on [2, 7, 5]: dim 1 in chunks of 2, dim 2 in chunks of 3;
        // device d sits at (data, model) = (p / 4, p % 4), p its position in the order.
        let expected = "\
D0 -> [0..2, 4..6, 0..3]
D1 -> [0..2, 2..4, 3..5]
D2 -> [0..2, 0..2, 0..3]
D3 -> [0..2, 6..7, 3..5]
D4 -> [0..2, 0..2, 3..5]
D5 -> [0..2, 2..4, 0..3]
D6 -> [0..2, 4..6, 3..5]
D7 -> [0..2, 6..7, 0..3]
";
        assert_eq!(
            show(&permuted_2x4(), &[2, 7, 5], "(_, model, data)"),
            expected
        );
    }

    #[test]
    fn rank_0_and_unreduced() {
        let mesh = Mesh::new([("x", 2)]).unwrap();
        assert_eq!(
            show(&mesh, &[], "() unreduced={x}"),
            "D0 -> []\nD1 -> []\nunreduced over {x}\n"
        );
    }
}
