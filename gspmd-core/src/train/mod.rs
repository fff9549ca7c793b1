//! Training: the whole step — forward, backward and optimizer update — as one program,
//! so that propagation and partitioning see all of it (GSPMD shards the weight update
//! and the optimizer state like the weights), and a host loop that runs it.
//!
//! - `names`: parameters by name: [`Trainable`] (glob patterns or indices), [`glob_match`].
//! - `optimizer`: [`Optimizer`]s as chains of gradient [`Transform`]s (optax's design:
//!   [`chain`], [`clip_by_global_norm`], [`add_decayed_weights`], ...; [`Sgd`],
//!   [`AdamW`], [`Lion`], [`Adafactor`]), emitted as IR.
//! - `schedule`: [`Schedule`], the learning rate per step (a run-time input).
//! - `step`: [`step_program`] builds a [`TrainStep`] on top of [`crate::autodiff::grad`];
//!   `accumulate`: gradient accumulation over microbatches as a `scan`.
//! - `outputs`: aux outputs (JAX's `has_aux`): model outputs besides the loss that a
//!   step or an evaluation returns by name ([`StepOutput`], [`Fetch`]).
//! - `init`: [`Initializer`], initial values by name from a counter-based generator,
//!   made block by block on the devices that hold them.
//! - `data`: [`Source`]s of examples ([`Dataset`] in memory, [`SafetensorsFile`] read
//!   row by row) and [`Batches`] of them or of a function, each process reading only its
//!   devices' rows of a batch.
//! - `trainer`: [`Trainer`] runs steps on any [`Backend`](crate::runtime::Backend) (the
//!   reference interpreter, a thread mesh, MPI ranks) and feeds outputs back as inputs.
//! - `checkpoint`: [`Trainer::save`] / [`Trainer::load`] on any backend: sharded
//!   checkpoint directories (each process writes its devices' blocks; loading reshards
//!   onto any mesh), or one safetensors file of global tensors ([`save_checkpoint`] /
//!   [`load_checkpoint`]).

mod accumulate;
mod checkpoint;
mod data;
mod init;
mod names;
mod optimizer;
mod outputs;
mod schedule;
mod step;
mod trainer;

pub use checkpoint::{load_checkpoint, save_checkpoint};
pub use data::{Batch, Batches, DataLayout, Dataset, SafetensorsFile, Source};
pub use init::{Init, Initializer};
pub use names::{Trainable, glob_match, glob_match_any, param_names};
pub use optimizer::{
    Adafactor, AdamW, Emitter, Lion, Mask, Optimizer, Param, Sgd, Slot, Transform,
    add_decayed_weights, chain, check_hyper_parameters, clip_by_block_rms, clip_by_global_norm,
    scale, scale_by_adafactor_step, scale_by_adam, scale_by_factored_rms, scale_by_learning_rate,
    scale_by_lion, scale_masked, trace,
};
pub use outputs::{AuxOutput, Fetch, StepOutput, output_name};
pub use schedule::Schedule;
pub use step::{
    InputRole, RNG, StateSlot, StepInput, StepOptions, TrainStep, TrainedParam, step_program,
    step_program_with,
};
pub use trainer::{Evaluator, Initial, STEP_COUNT, Trainer};
