//! The (sub-)axes a random sharding draws from, shared by the random differential
//! suites (partition_random, pipeline_random).

use gspmd_core::sharding::Mesh;
use rand::RngExt;
use rand::rngs::Xoshiro256PlusPlus;

/// The mesh's axes, major to minor, each whose size has a proper divisor cut one time
/// in three into two sub-axes at a random divisor `k` (`model:(1)k`, `model:(k)n/k`),
/// so random shardings place parts of an axis independently: on one dim in either
/// order, on different dims, or one of them nowhere.
pub fn random_axes(rng: &mut Xoshiro256PlusPlus, mesh: &Mesh) -> Vec<String> {
    let mut axes = Vec::new();
    for (name, size) in mesh.axes() {
        let divisors: Vec<usize> = (2..*size).filter(|k| size.is_multiple_of(*k)).collect();
        if !divisors.is_empty() && rng.random_range(0..3) == 0 {
            let k = divisors[rng.random_range(0..divisors.len())];
            axes.push(Mesh::sub_axis(name, 1, k));
            axes.push(Mesh::sub_axis(name, k, size / k));
        } else {
            axes.push(name.clone());
        }
    }
    axes
}
