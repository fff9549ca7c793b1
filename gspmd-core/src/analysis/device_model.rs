//! Device models: what one device of a mesh can compute, hold and move, the figures a
//! [`CostAnalysis`](super::CostAnalysis) turns FLOPs and collective bytes into a step
//! time with.
//!
//! A [`DeviceModel`] has a peak FLOP rate and one `efficiency` (the fraction of the peak
//! the compute reaches: the only constant a user fits to measurements, everything else is
//! a published or measured figure), its memory (capacity, for whether a plan fits), a
//! fixed latency per collective, and an [`Interconnect`]:
//!
//! - [`Interconnect::Flat`]: every collective receives at one rate whatever its group
//!   (a shared-memory machine, a switch);
//! - [`Interconnect::Torus`]: chips on a torus, `devices_per_chip` devices sharing each
//!   chip's links, every mesh axis laid along one torus dim (the paper's meshes: `X` along
//!   one dim of the pod, `Y` along the other with the chip's two cores). A ring collective
//!   (all-gather, reduce-scatter, all-reduce, permute, shift) over a group spanning `d`
//!   mesh axes uses the chip's two links (both directions) along each of the `d` dims, so
//!   one device receives at `2 d link / devices_per_chip`. An all-to-all is bounded by the
//!   torus's bisection instead: on a ring (or square torus) of side `k` chips with
//!   wrap-around, half the traffic crosses `4` (`4 k` on the square) directed links, so a
//!   chip receiving `n` bytes takes `n k / (8 link)` (never less than the ring time).

use crate::ir::Op;
use crate::sharding::Mesh;

/// How a device's collectives reach the other devices (see the module docs).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Interconnect {
    /// Every collective receives at `bytes_per_second` per device.
    Flat {
        /// Bytes per second one device receives in any collective.
        bytes_per_second: f64,
    },
    /// Chips on a torus with wrap-around, each mesh axis along one torus dim.
    Torus {
        /// Bytes per second of one link in one direction.
        link_bytes_per_second: f64,
        /// Devices sharing one chip's links (TPUv3: two TensorCores).
        devices_per_chip: usize,
    },
}

/// What one device can do: the figures a step time is estimated from (see the module
/// docs).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceModel {
    /// A name for reports.
    pub name: String,
    /// Peak floating-point operations per second of one device.
    pub flops_per_second: f64,
    /// The fraction of `flops_per_second` the program's compute reaches: the one
    /// constant fitted to a measured step (1: peak). Above 1 only when fitted to a step
    /// whose communication the model over-charges (e.g. hidden behind compute).
    pub efficiency: f64,
    /// Bytes of memory one device has (for whether a plan fits).
    pub memory_bytes: usize,
    /// How collectives move data.
    pub interconnect: Interconnect,
    /// Fixed cost of one collective, in seconds (synchronisation, start-up).
    pub collective_latency: f64,
}

impl DeviceModel {
    /// One thread-mesh device on this project's build machines, as measured (see
    /// `shared/FACTS.md`, 2026-11-29): single-thread f32 matmul at 70–77 GFLOP/s (75
    /// taken), collectives moving data through memory at memcpy speed, 11–13 GB/s (12
    /// taken), and a rendezvous of 8 threads costing 50–65 µs (55 taken). Memory: 8 GiB,
    /// a share of the machine's.
    pub fn this_machine() -> Self {
        DeviceModel {
            name: "this machine (one thread per device)".into(),
            flops_per_second: 75e9,
            efficiency: 1.0,
            memory_bytes: 8 << 30,
            interconnect: Interconnect::Flat {
                bytes_per_second: 12e9,
            },
            collective_latency: 55e-6,
        }
    }

    /// One TPUv3 core (the paper's device), from Google Cloud's TPU v3 page
    /// (cloud.google.com/tpu/docs/v3, "System architecture"): a chip has two
    /// TensorCores, 123 TFLOP/s (bf16) peak and 32 GiB of HBM2 per chip, so 61.5
    /// TFLOP/s and 16 GiB per core; chips on a 2-D torus, 340 TB/s all-reduce bandwidth
    /// per pod of 1024 chips, i.e. 332 GB/s per chip over its four links, 83 GB/s per
    /// link and direction (Jouppi et al. 2020, "A Domain-Specific Supercomputer for
    /// Training Deep Neural Networks", CACM 63(7), gives 656 Gbit/s per ICI link: the
    /// same 82 GB/s). The latency per collective, 10 µs, is an assumption: no public
    /// figure. `efficiency` is 1 (peak): fit it with [`DeviceModel::with_efficiency`].
    pub fn tpu_v3_core() -> Self {
        DeviceModel {
            name: "TPUv3 core".into(),
            flops_per_second: 123e12 / 2.0,
            efficiency: 1.0,
            memory_bytes: 16 << 30,
            interconnect: Interconnect::Torus {
                link_bytes_per_second: 340e12 / 1024.0 / 4.0,
                devices_per_chip: 2,
            },
            collective_latency: 10e-6,
        }
    }

    /// The same device reaching `efficiency` of its peak FLOP rate.
    pub fn with_efficiency(mut self, efficiency: f64) -> Self {
        self.efficiency = efficiency;
        self
    }

    /// The FLOP rate the compute runs at: `flops_per_second * efficiency`.
    pub fn sustained_flops_per_second(&self) -> f64 {
        self.flops_per_second * self.efficiency
    }

    /// Seconds one run of collective `op` on `mesh` takes, its latency included, when
    /// one device receives `bytes` in it: what the cost analysis and its schedule charge.
    pub fn collective_run_seconds(&self, op: &Op, mesh: &Mesh, bytes: usize) -> f64 {
        self.collective_latency + self.collective_seconds(op, mesh, bytes)
    }

    /// Seconds one run of collective `op` on `mesh` takes when one device receives
    /// `bytes` in it (see the module docs); its latency is not included. The torus dims
    /// a group spans are the distinct mesh axes of its (sub-)axes; the mesh's last axis
    /// holds a chip's devices.
    pub fn collective_seconds(&self, op: &Op, mesh: &Mesh, bytes: usize) -> f64 {
        let bytes = bytes as f64;
        let (link, per_chip) = match self.interconnect {
            Interconnect::Flat { bytes_per_second } => return bytes / bytes_per_second,
            Interconnect::Torus {
                link_bytes_per_second,
                devices_per_chip,
            } => (link_bytes_per_second, devices_per_chip.max(1)),
        };
        // (mesh axis, devices of the group along it).
        let mut dims: Vec<(usize, usize)> = Vec::new();
        let group = op.collective_group();
        for part in (group.iter()).flat_map(|g| g.axes.iter().filter_map(|a| mesh.axis_part(a))) {
            match dims.iter_mut().find(|d| d.0 == part.axis) {
                Some(d) => d.1 *= part.size,
                None => dims.push((part.axis, part.size)),
            }
        }
        let minor = mesh.axes().len().saturating_sub(1);
        let ring = bytes * per_chip as f64 / (2.0 * dims.len().max(1) as f64 * link);
        if !matches!(op, Op::AllToAll { .. }) {
            return ring;
        }
        // The longest side of the group, in chips.
        let side = (dims.iter())
            .map(|&(axis, k)| {
                if axis == minor {
                    k.div_ceil(per_chip)
                } else {
                    k
                }
            })
            .max()
            .unwrap_or(1);
        ring.max(bytes * per_chip as f64 * side as f64 / (8.0 * link))
    }
}
