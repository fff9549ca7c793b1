//! [`Op::RandomBits`](crate::ir::Op::RandomBits) in StableHLO: threefry-2x32 with 20
//! rounds written out on `ui32` tensors (as JAX lowers its `threefry2x32`), so an
//! exported program draws gspmd's numbers bit for bit (see [`crate::ir::random`]).

use super::stablehlo::{Elem, Ty, Val, Writer};
use crate::ir::random::RandomOutput;

/// The rotation of the word `x1` in each round (Salmon et al. 2011, table 4).
const ROTATIONS: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];

/// The key-schedule parity constant of threefry-2x32.
const PARITY: u32 = 0x1BD1_1BDA;

impl Writer<'_> {
    /// The bits of counter `base + sum_d j_d * strides[d]` at each index `j` of `shape`
    /// under `key` (an `i32[2]`), reduced per `output`; `ty` is the result's type.
    pub(super) fn random_bits(
        &mut self,
        key: &Val,
        base: &Val,
        shape: &[usize],
        strides: &[usize],
        output: RandomOutput,
        ty: Ty,
    ) -> Val {
        let words = self.op_of(
            "stablehlo.bitcast_convert",
            &[key],
            "",
            Ty::new(&[2], Elem::U32),
        );
        let k0 = self.key_word(&words, 0, shape);
        let k1 = self.key_word(&words, 1, shape);
        let parity = self.unsigned_splat(PARITY, shape);
        let k01 = self.binary("stablehlo.xor", &k0, &k1);
        let k2 = self.binary("stablehlo.xor", &k01, &parity);
        let schedule = [k0, k1, k2];

        let base = self.op_of(
            "stablehlo.bitcast_convert",
            &[base],
            "",
            Ty::new(&[], Elem::U32),
        );
        let mut counter = self.op_of(
            "stablehlo.broadcast_in_dim",
            &[&base],
            "broadcast_dimensions = array<i64>",
            Ty::new(shape, Elem::U32),
        );
        for (d, &stride) in strides.iter().enumerate() {
            let iota = self.op_of(
                "stablehlo.iota",
                &[],
                &format!("iota_dimension = {d} : i64"),
                Ty::new(shape, Elem::U32),
            );
            // Counters are taken modulo 2^32, as the kernel's.
            let stride = self.unsigned_splat(stride as u32, shape);
            let step = self.binary("stablehlo.multiply", &iota, &stride);
            counter = self.binary("stablehlo.add", &counter, &step);
        }

        // x0 = 0 + k0, x1 = counter + k1.
        let mut x0 = schedule[0].clone();
        let mut x1 = self.binary("stablehlo.add", &counter, &schedule[1]);
        for injection in 1..=5u32 {
            for r in 0..4 {
                let rotation = ROTATIONS[(4 * (injection as usize - 1) + r) % 8];
                x0 = self.binary("stablehlo.add", &x0, &x1);
                let left = self.unsigned_splat(rotation, shape);
                let right = self.unsigned_splat(32 - rotation, shape);
                let high = self.binary("stablehlo.shift_left", &x1, &left);
                let low = self.binary("stablehlo.shift_right_logical", &x1, &right);
                let rotated = self.binary("stablehlo.or", &high, &low);
                x1 = self.binary("stablehlo.xor", &rotated, &x0);
            }
            let i = injection as usize;
            x0 = self.binary("stablehlo.add", &x0, &schedule[i % 3]);
            let x1k = self.binary("stablehlo.add", &x1, &schedule[(i + 1) % 3]);
            let step = self.unsigned_splat(injection, shape);
            x1 = self.binary("stablehlo.add", &x1k, &step);
        }

        let bits = match output {
            RandomOutput::Bits => self.binary("stablehlo.xor", &x0, &x1),
            RandomOutput::Key => {
                let mut row = shape.to_vec();
                row.push(1);
                let y0 = self.op_of("stablehlo.reshape", &[&x0], "", Ty::new(&row, Elem::U32));
                let y1 = self.op_of("stablehlo.reshape", &[&x1], "", Ty::new(&row, Elem::U32));
                self.op_of(
                    "stablehlo.concatenate",
                    &[&y0, &y1],
                    &format!("dimension = {} : i64", shape.len()),
                    ty.with_elem(Elem::U32),
                )
            }
        };
        self.op_of("stablehlo.bitcast_convert", &[&bits], "", ty)
    }

    /// Word `i` of the key's words, broadcast to `shape`.
    fn key_word(&mut self, words: &Val, i: usize, shape: &[usize]) -> Val {
        let one = self.op_of(
            "stablehlo.slice",
            &[words],
            &format!(
                "start_indices = array<i64: {i}>, limit_indices = array<i64: {}>, \
                 strides = array<i64: 1>",
                i + 1
            ),
            Ty::new(&[1], Elem::U32),
        );
        let scalar = self.op_of("stablehlo.reshape", &[&one], "", Ty::new(&[], Elem::U32));
        self.op_of(
            "stablehlo.broadcast_in_dim",
            &[&scalar],
            "broadcast_dimensions = array<i64>",
            Ty::new(shape, Elem::U32),
        )
    }
}
