//! The allocation sequence a planned run makes: every modelled tensor as an allocation and a
//! free, in the order of the phase simulation, over two steps (the second with optimizer states
//! already allocated), so that an allocator policy can be replayed over it to predict reserved
//! memory (block rounding, segment sizes and fragmentation), not only allocated memory.
//!
//! Tensors are modelled at the granularity the planner knows, because the caching allocator's
//! segments follow tensor sizes: the vocabulary matrix and a dense block's weight matrices,
//! each with its gradient and optimizer states, the loss's logits, log-probabilities and their
//! gradients, and a block's saved score matrices and MLP intermediates at their own sizes;
//! what the planner knows only as a total (other weights, other saved activations) as tensors
//! of the model's typical matrix size or of a hidden state. The live bytes of the sequence follow the estimate (the
//! `sequence_follows_the_estimate` test checks it); the reserved memory its replay predicts is
//! checked against real traces (`crates/gpumem-replay/tests/planned.rs`). Each allocation
//! names the stream it is made on ([`Stream`]): the replay keeps one pool per stream, as
//! PyTorch's allocator does, and a free stands where its block may be reused.

use crate::distributed::{reduced_at_backward_end, PhaseBuffers};
use crate::error::Result;
use crate::estimate::{
    accumulates_gradients, blas_workspace_count, busiest_stage, decode_step_units,
    kept_and_recomputed, tuple_cache, Kept, Overheads,
};
use crate::graph::build_units;
use crate::lora::adapter_matrices;
use crate::model::{Architecture, LayerKind, ModelSpec, TransformerSpec};
use crate::releases::OldRelease;
use crate::states::{model_states, trainable_params, States};
use crate::unit::{NoGradPhase, SavedGroup, ScoreTensors, Unit};
use crate::workload::{Loss, Mode, Sharding, Workload};
use serde::Serialize;

mod startup;

pub(crate) use startup::startup_peak;
pub use startup::{has_fsdp_setup, has_startup, startup_sequence};

/// The stream an allocation is made on. PyTorch's caching allocator keeps a freed block with
/// the stream it was allocated on and serves only that stream's requests from it, so memory a
/// side stream has cached is not reusable by the compute stream's tensors, nor the reverse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// The current stream: every tensor of the model's own work.
    #[default]
    Compute,
    /// FSDP1's unshard stream: the all-gathered (unsharded) flat parameters.
    Unshard,
    /// FSDP1's pre-unshard stream: the host shard's GPU copy under parameter offload.
    PreUnshard,
    /// FSDP1's post-backward stream: the reduce-scatter's buffers.
    PostBackward,
    /// DeepSpeed ZeRO-3's reduce-and-partition stream (`overlap_comm`): the copy of a gradient
    /// bucket its reduce-scatter makes (see `distributed::zero3_reduce_stream`).
    ReduceAndPartition,
}

impl Stream {
    /// The stream's number in a trace (0 = the compute stream).
    pub fn id(self) -> u64 {
        self as u64
    }
}

/// One event of a planned allocation sequence. A free stands where its block may be reused:
/// for a block another stream used (`record_stream`), once that stream's work up to the free
/// is done (see `distributed::side_streams` for FSDP1's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum PlannedEvent {
    /// A tensor of `bytes` bytes is allocated on `stream`; `id` names it until its free.
    Alloc {
        /// Identifier, unique among live tensors.
        id: u64,
        /// Bytes requested.
        bytes: u64,
        /// The stream it is allocated on.
        stream: Stream,
    },
    /// The tensor `id` is freed.
    Free {
        /// Identifier of a live tensor.
        id: u64,
    },
    /// A step (training step or forward pass) begins.
    Step {
        /// Step number, from 0.
        index: u64,
    },
}

/// Steps the sequence covers: the first allocates the optimizer states, the second is the
/// steady state.
pub const STEPS: u64 = 2;

/// At most this many tensors per unit and kind, so that a sequence stays small for any model.
const MAX_PIECES: f64 = 64.0;

/// The allocation sequence of `workload` on `model` on one GPU: in training, of the pipeline
/// stage whose peak is the step's for `--pp` (the first, with its micro-batches in flight, or
/// the last, with the head), of the whole model otherwise.
pub fn allocation_sequence(model: &ModelSpec, workload: &Workload) -> Result<Vec<PlannedEvent>> {
    Ok(planned_run(model, workload)?.events)
}

/// A planned run's allocation sequence ([`allocation_sequence`]) with the allocations the
/// process keeps after the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRun {
    /// The events, in order.
    pub events: Vec<PlannedEvent>,
    /// The cuBLAS workspaces, in the order the run makes them (the forward thread's at the
    /// forward's first matrix product; in training the autograd thread's at the backward's
    /// first). PyTorch keeps them to the end of the process, in whatever segment they were
    /// carved from; the sequence frees them at its end, as a process running only this run
    /// would exit. A process that runs several cases makes each once.
    pub process_workspaces: Vec<u64>,
}

/// [`allocation_sequence`] with the ids of the process's workspaces ([`PlannedRun`]).
pub fn planned_run(model: &ModelSpec, workload: &Workload) -> Result<PlannedRun> {
    // What the estimate refuses, a sequence refuses too: no tensor of it reaches the
    // planner's bound on a phase's memory.
    crate::estimate(model, workload, &Overheads::default())?;
    let counts = model.params();
    let trainable = trainable_params(model, workload, &counts);
    // A training step runs its busiest pipeline stage (the whole model without pipeline
    // parallelism).
    let (units, in_flight) = match workload.mode {
        Mode::Train => {
            let stage = busiest_stage(model, workload, &counts, trainable);
            (stage.units, stage.in_flight as usize)
        }
        Mode::Infer | Mode::Generate => (build_units(model, workload, workload.batch), 1),
    };
    let states = model_states(model, workload, &counts, &units, trainable);
    let mut out = Emitter {
        workspaces: Workspaces {
            bytes: workload.blas_workspace as f64,
            count: blas_workspace_count(workload.mode) as usize,
            made: Vec::new(),
        },
        ..Emitter::default()
    };
    let shapes = Shapes::of(model, workload, &units, &states);
    // FSDP1's set-up on the GPU, in the same pool, after the 4-bit loading before it: its
    // shards are the sharded weights, the loading's statistics the base's others.
    let (shards, shard_bytes) = if has_fsdp_setup(workload) {
        let (mut loaded, statistics) =
            startup::four_bit_loading(&mut out, model, workload, &units, &shapes);
        let (shards, bytes) = startup::fsdp1_setup(&mut out, model, workload, &units, &shapes);
        loaded.extend(shards);
        (loaded, bytes + statistics)
    } else if startup::is_fsdp1_training(workload) {
        startup::fsdp1_shards(&mut out, model, workload, &units, &shapes)
    } else {
        (Vec::new(), 0.0)
    };
    let persistent: Vec<u64> = [states.buffers.step_weights, states.buffers.step_gradients]
        .into_iter()
        .filter_map(|b| out.alloc(b))
        .collect();
    let other_weights = (states.weights - shard_bytes).max(0.0);
    let weights: Vec<Vec<u64>> = units
        .iter()
        .map(|u| {
            let whole = shapes.param_tensors(u, shapes.weight_per_param, 1);
            out.tensors(shapes.share(u) * other_weights, &whole, shapes.tensor)
        })
        .collect();
    match workload.mode {
        Mode::Train => train(&mut out, &units, &states, workload, &shapes, in_flight),
        Mode::Infer | Mode::Generate => {
            let preallocated = workload.static_cache_positions().is_some();
            let setup = if preallocated {
                static_cache(&mut out, &units, workload.static_causal_mask_bytes() as f64)
            } else {
                Vec::new()
            };
            let decode = Decode::of(model, workload);
            for index in 0..STEPS {
                out.events.push(PlannedEvent::Step { index });
                let pass = infer(&mut out, &units, &shapes, preallocated, &mut |_, _| {});
                match &decode {
                    Some(decode) => decode.run(&mut out, &shapes, pass),
                    None => {
                        out.free_all(pass.selection);
                        out.free_all(pass.held);
                        pass.cache.into_iter().for_each(|c| out.free_all(c));
                    }
                }
            }
            out.free_all(setup);
        }
    }
    weights.into_iter().for_each(|w| out.free_all(w));
    out.free_all(shards);
    let process_workspaces = std::mem::take(&mut out.workspaces.made);
    out.free_all(process_workspaces.clone());
    out.free_all(persistent);
    Ok(PlannedRun {
        events: out.events,
        process_workspaces,
    })
}

/// The cuBLAS workspaces a run makes: PyTorch gives each thread's handle one of `bytes` at its
/// first matrix product (`getCurrentCUDABlasHandle`, after the product's output exists), the
/// forward's on the caller's thread and the backward's on the autograd engine's, and keeps it.
/// Where it is made decides which cached block it is carved from.
#[derive(Default)]
struct Workspaces {
    /// Bytes of one (the GPU's cuBLAS workspace size).
    bytes: f64,
    /// How many the run makes (`blas_workspace_count`).
    count: usize,
    /// Those made so far.
    made: Vec<u64>,
}

/// The first unit whose forward runs a cuBLAS matrix product: the first after the embeddings
/// (a lookup); in a ResNet, whose convolutions run on cuDNN, its head's classifier.
fn first_product_unit(units: &[Unit]) -> usize {
    if units.first().is_some_and(|u| u.name == "stem") {
        return units.len() - 1;
    }
    units
        .iter()
        .position(|u| u.name != "embeddings")
        .unwrap_or(0)
}

/// Tensor sizes of a model under a workload.
struct Shapes {
    /// Bytes of a typical weight-sized tensor (one matrix of a block).
    tensor: f64,
    /// Bytes of a typical activation (one hidden state of the micro-batch).
    activation: f64,
    /// Bytes of the largest single activation (the fp32 logits of a language model): a
    /// transient larger than this is several tensors.
    largest: f64,
    /// Bytes of a typical tensor live inside a unit of the body in a no-grad forward: a
    /// transformer's hidden state; a convolution's or diffusion block's output.
    live: f64,
    /// Parameters of all units.
    params: f64,
    /// Weight bytes per parameter (its share of all the weights on this GPU).
    weight_per_param: f64,
    /// Whether each parameter is one tensor on this GPU (nothing sharded or split): only then
    /// are a unit's weights allocated at their real sizes.
    whole_params: bool,
    /// Elements of each weight matrix of a dense transformer block.
    block_matrices: Vec<u64>,
    /// Elements of each weight matrix of a vision tower's dense block.
    tower_matrices: Vec<u64>,
    /// Bytes of one hidden state of a vision tower's block (over the tower's patch tokens).
    tower_activation: f64,
    /// Elements of each weight tensor of a mixture-of-experts block, as the release planned
    /// holds them.
    moe_block_tensors: Vec<u64>,
    /// Elements on this GPU of each trained tensor of a dense block, where they are not its
    /// weights: LoRA's adapter matrices, whole, or this rank's shard of each under FSDP (FSDP1
    /// wraps every adapter as a unit of its own and shards its flat parameter; FSDP2 shards
    /// each parameter). Empty otherwise, and under ZeRO, whose gradients and optimizer states
    /// live in flat buffers.
    adapter_elements: Vec<f64>,
    /// The dense blocks that hold those adapters (each the same).
    adapter_blocks: f64,
    /// Trained parameters of all units, over which a trained total is spread (see
    /// [`Self::trained_params_of`]).
    trained_params: f64,
    /// Bytes per element of a weight matrix as ZeRO-3 gathers it: the module dtype, split over
    /// tensor-parallel ranks.
    gathered: f64,
}

impl Shapes {
    fn of(model: &ModelSpec, workload: &Workload, units: &[Unit], states: &States) -> Self {
        let params: f64 = units.iter().map(|u| u.params as f64).sum::<f64>().max(1.0);
        let per_param = states.weights / params;
        let act = workload.compute_dtype().bytes() as f64;
        let (matrix, hidden, widest) = match &model.arch {
            Architecture::Transformer(t) => {
                let h = t.hidden as f64;
                let tokens = workload.batch as f64 * stack_tokens(t, workload, None) as f64;
                let tp = workload.layout.tp as f64;
                let widest = (t.vocab as f64 / tp * 4.0).max(t.intermediate as f64 * act);
                (h * h / tp, tokens * h * act, tokens * widest)
            }
            Architecture::Resnet(r) => {
                let largest = model.params().largest_tensor as f64;
                let pixels = (workload.batch * workload.image_size.pow(2)) as f64;
                let hidden = pixels * r.features() as f64 * act / 64.0;
                (largest / 4.0, hidden, 4.0 * hidden)
            }
            Architecture::Diffusion(d) => {
                let largest = model.params().largest_tensor as f64;
                let hidden = d.typical_activation(workload);
                (largest / 4.0, hidden, 8.0 * hidden)
            }
        };
        let activation = hidden.max(512.0);
        let largest = widest.max(activation);
        let layout = &workload.layout;
        Shapes {
            tensor: (matrix * per_param).max(512.0),
            activation,
            largest,
            live: match model.arch {
                Architecture::Transformer(_) => activation,
                Architecture::Resnet(_) | Architecture::Diffusion(_) => largest,
            },
            params,
            weight_per_param: per_param,
            whole_params: layout.sharding == Sharding::None
                && layout.tp == 1
                && !layout.offload.optimizer(),
            block_matrices: match &model.arch {
                Architecture::Transformer(t) => t.block_matrices(),
                Architecture::Resnet(_) | Architecture::Diffusion(_) => Vec::new(),
            },
            tower_matrices: tower(model).map_or(Vec::new(), |(t, _)| t.block_matrices()),
            tower_activation: tower(model).map_or(0.0, |(t, image)| {
                let tokens = workload.batch as f64 * stack_tokens(t, workload, image) as f64;
                (tokens * t.hidden as f64 * act).max(512.0)
            }),
            moe_block_tensors: match &model.arch {
                Architecture::Transformer(t) => {
                    let release = OldRelease::of(t, workload);
                    t.moe_block_tensors(!release.is_some_and(|r| r.experts_as_modules()))
                }
                Architecture::Resnet(_) | Architecture::Diffusion(_) => Vec::new(),
            },
            adapter_elements: match (&model.arch, workload.lora) {
                (Architecture::Transformer(t), Some(lora))
                    if matches!(layout.sharding, Sharding::None | Sharding::Fsdp)
                        && adapters_in_dense_blocks_only(t) =>
                {
                    let sharded = layout.shard_ranks() as f64;
                    let split = sharded * layout.tp as f64;
                    adapter_matrices(t, LayerKind::default(), lora.rank, lora.targets)
                        .into_iter()
                        .map(|e| (e as f64 / split).ceil())
                        .collect()
                }
                _ => Vec::new(),
            },
            adapter_blocks: units
                .iter()
                .filter(|u| u.whole.block_matrices)
                .count()
                .max(1) as f64,
            trained_params: units
                .iter()
                .map(|u| u.trained_params() as f64)
                .sum::<f64>()
                .max(1.0),
            gathered: workload.module_dtype().bytes() as f64 / layout.tp as f64,
        }
    }

    /// Bytes of one of `unit`'s hidden states where its stack's differ from the model's
    /// typical one: an audio encoder block's, a vision tower block's.
    fn own_activation(&self, unit: &Unit) -> Option<f64> {
        if unit.whole.encoder_hidden > 0.0 {
            Some(unit.whole.encoder_hidden.max(512.0))
        } else if unit.whole.tower_block {
            Some(self.tower_activation)
        } else {
            None
        }
    }

    /// Bytes of one of `unit`'s hidden states: its stack's own, else the model's typical one.
    fn activation_of(&self, unit: &Unit) -> f64 {
        self.own_activation(unit).unwrap_or(self.activation)
    }

    /// Bytes of one of `unit`'s transient tensors in training: a block's are at most its
    /// largest saved kind (a score matrix, an MLP intermediate) or a hidden state; other
    /// units' (the loss's) up to the largest activation.
    fn transient(&self, unit: &Unit) -> f64 {
        let saved = unit
            .whole
            .saved
            .iter()
            .map(|g| g.tensor)
            .fold(0.0, f64::max);
        if unit.whole.block_matrices {
            saved.max(self.activation_of(unit))
        } else {
            self.largest
        }
    }

    /// The single tensors among `unit`'s parameter-sized tensors of `per_param` bytes per
    /// parameter, `copies` of each (an optimizer's states): its vocabulary matrix, or a dense
    /// block's weight matrices. Empty where parameters are sharded or split.
    fn param_tensors(&self, unit: &Unit, per_param: f64, copies: usize) -> Vec<f64> {
        if !self.whole_params {
            return Vec::new();
        }
        self.matrices(unit)
            .flat_map(|m| std::iter::repeat_n(m as f64 * per_param, copies))
            .collect()
    }

    /// `total` bytes of a dense block's LoRA adapters, `copies` of each (a gradient, an
    /// optimizer's states or step temporaries): one tensor per adapter matrix and copy, by its
    /// elements ([`Self::adapter_elements`]).
    fn adapter_tensors(&self, total: f64, copies: usize) -> Vec<f64> {
        let elements: f64 = self.adapter_elements.iter().sum();
        let per_copy = total / copies as f64;
        (0..copies)
            .flat_map(|_| {
                self.adapter_elements
                    .iter()
                    .map(move |&e| per_copy * e / elements)
            })
            .collect()
    }

    /// The trained parameters `unit` holds, over which per-parameter totals (gradients,
    /// optimizer states) are spread: its own, or, where they are LoRA adapters of known sizes,
    /// an equal share per dense block and none elsewhere (the embeddings and head are frozen).
    fn trained_params_of(&self, unit: &Unit) -> f64 {
        if self.adapter_elements.is_empty() {
            unit.trained_params() as f64
        } else if unit.whole.block_matrices {
            self.trained_params / self.adapter_blocks
        } else {
            0.0
        }
    }

    /// Whether `unit`'s trained tensors are LoRA adapters of known sizes.
    fn has_adapters(&self, unit: &Unit) -> bool {
        unit.whole.block_matrices && !self.adapter_elements.is_empty()
    }

    /// Elements of each of `unit`'s single parameters the planner knows by size: its
    /// vocabulary matrix, or a block's weight tensors (whole, before any sharding).
    fn matrices<'a>(&'a self, unit: &'a Unit) -> impl Iterator<Item = u64> + 'a {
        let matrices: &[u64] = if unit.whole.tower_block {
            &self.tower_matrices
        } else if unit.whole.block_matrices {
            &self.block_matrices
        } else if unit.whole.moe_tensors {
            &self.moe_block_tensors
        } else {
            std::slice::from_ref(&unit.whole.params)
        };
        matrices.iter().copied().filter(|&m| m > 0)
    }

    /// `unit`'s gathered weights its backward keeps (`States::saved_linears`), as tensors: each
    /// weight matrix whole, as the all-gather makes it.
    fn saved_linears(&self, out: &mut Emitter, unit: &Unit, states: &States) -> Vec<u64> {
        let wholes: Vec<f64> = self
            .matrices(unit)
            .map(|m| m as f64 * self.gathered)
            .collect();
        out.tensors(states.saved_linears(unit), &wholes, self.tensor)
    }

    /// The share of the model's parameters in `unit`.
    fn share(&self, unit: &Unit) -> f64 {
        unit.params as f64 / self.params
    }
}

/// Tokens one sample runs through `spec`'s stack: a vision transformer's patches of an image
/// of side `image` (the workload's when `None`) with its class token, else the positions of
/// the workload's sequence.
fn stack_tokens(spec: &TransformerSpec, workload: &Workload, image: Option<u64>) -> u64 {
    match spec.patches {
        Some(p) => p.tokens_at(image.unwrap_or(workload.image_size)),
        None => workload.tokens().max(1),
    }
}

/// The vision tower of `model` (a vision-language model's or a dual encoder's), with the image
/// side it runs at when that is its own (a vision-language model's tower reads its images at
/// its trained size; a dual encoder's, at the workload's).
fn tower(model: &ModelSpec) -> Option<(&TransformerSpec, Option<u64>)> {
    let Architecture::Transformer(t) = &model.arch else {
        return None;
    };
    match (&t.vision, &t.dual) {
        (Some(v), _) => Some((&v.tower, v.tower.patches.map(|p| p.image_size))),
        (None, Some(d)) => Some((&d.tower, None)),
        (None, None) => None,
    }
}

/// Whether every LoRA adapter of `spec` sits in a dense decoder block, the same in each: no
/// mixture of experts, encoder or vision or audio tower, whose linears differ.
fn adapters_in_dense_blocks_only(spec: &TransformerSpec) -> bool {
    spec.encoder_layers == 0
        && spec.vision.is_none()
        && spec.dual.is_none()
        && spec.audio.is_none()
        && (0..spec.layers).all(|i| !spec.layer_kind(i).moe)
}

/// Builds the events, naming tensors by a counter.
#[derive(Default)]
struct Emitter {
    events: Vec<PlannedEvent>,
    next: u64,
    workspaces: Workspaces,
}

impl Emitter {
    /// Makes the run's `index`-th cuBLAS workspace (0: the forward's, 1: the backward's) at its
    /// first matrix product, unless it exists or the run makes none.
    fn workspace(&mut self, index: usize) {
        let w = &self.workspaces;
        if w.made.len() == index && index < w.count {
            let id = self.alloc(w.bytes);
            self.workspaces.made.extend(id);
        }
    }

    /// Allocates one tensor of `bytes` on the compute stream (none when it rounds to 0 bytes).
    fn alloc(&mut self, bytes: f64) -> Option<u64> {
        self.alloc_on(bytes, Stream::Compute)
    }

    /// Allocates one tensor of `bytes` on `stream` (none when it rounds to 0 bytes).
    fn alloc_on(&mut self, bytes: f64, stream: Stream) -> Option<u64> {
        let bytes = bytes.max(0.0).round() as u64;
        if bytes == 0 {
            return None;
        }
        let id = self.next;
        self.next += 1;
        self.events.push(PlannedEvent::Alloc { id, bytes, stream });
        Some(id)
    }

    /// Allocates a sharded layout's buffers of a phase, `parts` of bytes each with the stream
    /// the producer makes it on: each part on its stream where `buffers` has side streams, the
    /// parts' sum as one tensor on the compute stream otherwise.
    fn buffers(&mut self, buffers: &PhaseBuffers, parts: &[(f64, Stream)]) -> Vec<Option<u64>> {
        if buffers.side_streams {
            parts
                .iter()
                .map(|&(bytes, stream)| self.alloc_on(bytes, stream))
                .collect()
        } else {
            vec![self.alloc(parts.iter().map(|p| p.0).sum())]
        }
    }

    /// Allocates `total` bytes as tensors of `piece` bytes (at most [`MAX_PIECES`] of them, the
    /// remainder in the last).
    fn pieces(&mut self, total: f64, piece: f64) -> Vec<u64> {
        if total < 1.0 {
            return Vec::new();
        }
        let count = (total / piece).ceil().clamp(1.0, MAX_PIECES);
        let size = total / count;
        (0..count as u64).filter_map(|_| self.alloc(size)).collect()
    }

    /// Allocates `total` bytes: each group's bytes (as far as the total reaches) as tensors
    /// of the group's size, the rest as pieces of `piece` bytes.
    fn grouped(
        &mut self,
        total: f64,
        groups: impl IntoIterator<Item = SavedGroup>,
        piece: f64,
    ) -> Vec<u64> {
        let mut left = total;
        let mut ids = Vec::new();
        for group in groups.into_iter().filter(|g| g.tensor >= 1.0) {
            let bytes = group.bytes.min(left);
            if bytes >= 1.0 {
                ids.extend(self.pieces(bytes, group.tensor));
                left -= bytes;
            }
        }
        ids.extend(self.pieces(left, piece));
        ids
    }

    /// Allocates `total` bytes: each of `wholes` as one tensor (as far as the total reaches),
    /// the rest as pieces of `piece` bytes.
    fn tensors(&mut self, total: f64, wholes: &[f64], piece: f64) -> Vec<u64> {
        let groups = wholes.iter().map(|&bytes| SavedGroup {
            bytes,
            tensor: bytes,
        });
        self.grouped(total, groups, piece)
    }

    fn free(&mut self, id: Option<u64>) {
        if let Some(id) = id {
            self.events.push(PlannedEvent::Free { id });
        }
    }

    fn free_all(&mut self, ids: Vec<u64>) {
        self.events
            .extend(ids.into_iter().map(|id| PlannedEvent::Free { id }));
    }
}

/// Two training steps: forward (saved activations accumulate, those of `in_flight`
/// micro-batches on a pipeline's first stage), backward in reverse (each unit's saved tensors
/// freed as its gradients appear), optimizer step (states created in the first step, the
/// implementation's temporaries), gradients freed (`set_to_none=True`) unless they accumulate.
fn train(
    out: &mut Emitter,
    units: &[Unit],
    states: &States,
    workload: &Workload,
    shapes: &Shapes,
    in_flight: usize,
) {
    let accumulating = accumulates_gradients(workload);
    let mut kept_gradients: Vec<Vec<u64>> = Vec::new();
    if accumulating {
        kept_gradients = units
            .iter()
            .map(|u| gradient_tensors(out, u, states, shapes))
            .collect();
    }
    let mut optimizer = Vec::new();
    for index in 0..STEPS {
        out.events.push(PlannedEvent::Step { index });
        let kept = kept_and_recomputed(units, workload.checkpointing);
        // A loop that keeps its last outputs has them alive until the forward returns (the
        // first step stands for one after a warm-up step).
        let previous = if workload.keep_outputs {
            out.alloc(units.iter().map(|u| u.retained).sum())
        } else {
            None
        };
        let ForwardLeft {
            saved,
            held,
            gathered,
        } = train_forward(out, units, &kept, states, shapes, in_flight);
        out.free(previous);
        let mut gradients = train_backward(
            out,
            units,
            (saved, gathered),
            &kept,
            states,
            workload,
            shapes,
        );
        // FSDP's root reduce-scatter: its buffers, then the root's sharded gradients.
        let buffers = &states.buffers;
        let reducing = out.alloc_on(buffers.backward_end_gradients, buffers.backward_end_stream);
        for unit in units
            .iter()
            .filter(|u| reduced_at_backward_end(workload, u))
        {
            if !accumulating {
                gradients.push(gradient_tensors(out, unit, states, shapes));
            }
        }
        out.free(reducing);
        if index == 0 {
            optimizer = per_param_tensors(
                out,
                units,
                shapes,
                states.optimizer,
                states.state_element_bytes,
            );
        }
        let temporaries = per_param_tensors(
            out,
            units,
            shapes,
            states.step_temporaries,
            states.state_element_bytes,
        );
        temporaries.into_iter().for_each(|t| out.free_all(t));
        gradients.into_iter().for_each(|g| out.free_all(g));
        held.into_iter().for_each(|h| out.free(h));
    }
    optimizer.into_iter().for_each(|o| out.free_all(o));
    kept_gradients.into_iter().for_each(|g| out.free_all(g));
}

/// A phase's unsharded weights, `bytes` with the host shard's staging copy: FSDP1 makes the
/// gathered flat parameters on its unshard stream and the staging copy on its pre-unshard
/// stream.
fn unsharded(out: &mut Emitter, buffers: &PhaseBuffers, bytes: f64) -> Vec<Option<u64>> {
    out.buffers(
        buffers,
        &[
            (bytes - buffers.staging, Stream::Unshard),
            (buffers.staging, Stream::PreUnshard),
        ],
    )
}

/// A unit's parameter gradients, as tensors.
fn gradient_tensors(out: &mut Emitter, u: &Unit, states: &States, shapes: &Shapes) -> Vec<u64> {
    let total = shapes.trained_params_of(u) * states.grad_per_param;
    let whole = if shapes.has_adapters(u) {
        shapes.adapter_tensors(total, 1)
    } else {
        shapes.param_tensors(u, states.grad_per_param, 1)
    };
    out.tensors(total, &whole, shapes.tensor)
}

/// Each optimizer state and step temporary of a whole weight is one tensor of the weight's size
/// (AdamW's two moments, SGD's momentum, foreach's per-parameter results); smaller ones (8-bit
/// states, factored second moments) are not. Allocates `total` bytes so, unit by unit. LoRA's
/// are its adapters' ([`Shapes::adapter_tensors`]), `total` split over the blocks
/// ([`Shapes::trained_params_of`]), one tensor per adapter matrix and state of `state_bytes`
/// per element.
fn per_param_tensors(
    out: &mut Emitter,
    units: &[Unit],
    shapes: &Shapes,
    total: f64,
    state_bytes: f64,
) -> Vec<Vec<u64>> {
    let per_param = total / shapes.trained_params;
    let count = (per_param / shapes.weight_per_param).floor().min(4.0) as usize;
    let adapter_elements: f64 = shapes.adapter_elements.iter().sum();
    units
        .iter()
        .map(|u| {
            // A unit's share of the trained parameters (none where it is frozen or unused).
            let unit_total = total * shapes.trained_params_of(u) / shapes.trained_params;
            if shapes.adapter_elements.is_empty() {
                // Its states have its weight matrices' shapes where those are trained (not a
                // frozen or unused unit's, nor a LoRA base's).
                let whole = if shapes.matrices(u).sum::<u64>() <= u.trained_params() {
                    shapes.param_tensors(u, shapes.weight_per_param, count)
                } else {
                    Vec::new()
                };
                return out.tensors(unit_total, &whole, shapes.tensor);
            }
            let whole = if shapes.has_adapters(u) {
                let copies = (unit_total / adapter_elements / state_bytes).round();
                shapes.adapter_tensors(unit_total, copies.clamp(1.0, 4.0) as usize)
            } else {
                Vec::new()
            };
            out.tensors(unit_total, &whole, shapes.tensor)
        })
        .collect()
}

/// What a training step's forward leaves for the rest of the step, unit by unit.
struct ForwardLeft {
    /// The tensors each unit saved for its backward.
    saved: Vec<Vec<u64>>,
    /// What each unit holds until the step ends.
    held: Vec<Option<u64>>,
    /// Each unit's weights kept gathered to the end of its backward
    /// ([`States::gathered_through_backward`]).
    gathered: Vec<Option<u64>>,
}

/// A training step's forward, with the saved tensors of `in_flight` micro-batches (1F1B's
/// first pipeline stage: the others' come before this one's backward).
fn train_forward(
    out: &mut Emitter,
    units: &[Unit],
    kept: &[Kept],
    states: &States,
    shapes: &Shapes,
    in_flight: usize,
) -> ForwardLeft {
    let mut saved = Vec::with_capacity(units.len());
    let mut held = Vec::new();
    let mut forward_held = Vec::new();
    let mut kept_gathered = Vec::with_capacity(units.len());
    let buffers = &states.buffers;
    let gather_stream = if buffers.side_streams {
        Stream::Unshard
    } else {
        Stream::Compute
    };
    // Gathered units (FSDP) while the forward runs, then while the backward runs.
    let mut gathered = unsharded(out, buffers, buffers.forward_weights);
    gathered.push(out.alloc_on(buffers.forward_pending, Stream::Unshard));
    // The root's all-gather opens the forward (its gathered weights are the embeddings'
    // backward's), with its copy on the CPU.
    let copy = out.alloc(buffers.backward_last.0 * buffers.gather_copy_share);
    out.free(copy);
    let first_product = first_product_unit(units);
    for (index, (unit, kept)) in units.iter().zip(kept).enumerate() {
        if index == first_product {
            out.workspace(0);
        }
        kept_gathered.push(out.alloc_on(states.gathered_through_backward(unit), gather_stream));
        let whole = &unit.whole;
        let transient = match unit
            .checkpointed_forward()
            .filter(|_| kept.input_only(unit))
        {
            Some(phases) => no_grad_phases(out, &phases, &mut |_| {}),
            None => grad_forward_transient(out, unit, shapes),
        };
        let save = |out: &mut Emitter| {
            let mut unit_saved = if kept.saved < unit.saved {
                // Recomputed in backward: what is kept is the block input.
                out.pieces(kept.saved, shapes.activation_of(unit))
            } else {
                out.grouped(kept.saved, whole.saved, shapes.activation_of(unit))
            };
            if !kept.wrapped {
                unit_saved.extend(shapes.saved_linears(out, unit, states));
            }
            unit_saved
        };
        let mut unit_saved = save(out);
        out.free_all(transient);
        for _ in 1..in_flight {
            unit_saved.extend(save(out));
        }
        saved.push(unit_saved);
        held.push(out.alloc(unit.held));
        forward_held.push(out.alloc(unit.forward_held));
    }
    gathered.into_iter().for_each(|g| out.free(g));
    // The model's output, dropped once the loss is taken.
    forward_held.into_iter().for_each(|h| out.free(h));
    ForwardLeft {
        saved,
        held,
        gathered: kept_gathered,
    }
}

/// A training step's backward, units in reverse, freeing each unit's `saved` tensors and,
/// once its gradients are made, the weights it kept gathered: returns the parameter gradients
/// made (none when they accumulate, none yet for those reduced at the backward's end).
fn train_backward(
    out: &mut Emitter,
    units: &[Unit],
    (saved, kept_gathered): (Vec<Vec<u64>>, Vec<Option<u64>>),
    kept: &[Kept],
    states: &States,
    workload: &Workload,
    shapes: &Shapes,
) -> Vec<Vec<u64>> {
    let accumulating = accumulates_gradients(workload);
    // FSDP's gathered units and unsharded gradients in backward, as the estimate has them:
    // the root and one block when it starts, one more block and the gradient buffers once
    // the head's gradients appear, only the root and the head's gradients in the
    // embeddings' backward.
    let buffers = &states.buffers;
    let mut gathered = unsharded(out, buffers, buffers.backward_start_weights);
    let mut gradients = Vec::new();
    let last = units.len().saturating_sub(1);
    // The backward's first matrix product is the head's, unless a fused loss made the head's
    // gradients in the forward (Liger's): then the last block's.
    let first_product = if workload.loss == Loss::Fused {
        last.saturating_sub(1)
    } else {
        last
    };
    for (index, (((unit, mut unit_saved), kept), unit_gathered)) in units
        .iter()
        .zip(saved)
        .zip(kept)
        .zip(kept_gathered)
        .enumerate()
        .rev()
    {
        if index == 0 && last > 0 {
            gathered.drain(..).for_each(|g| out.free(g));
            let (weights, gradients) = buffers.backward_last;
            gathered.extend(out.buffers(
                buffers,
                &[(weights, Stream::Unshard), (gradients, Stream::Compute)],
            ));
        }
        // A wrapped unit's recomputation saves its gathered weights again, to its backward.
        if kept.wrapped {
            unit_saved.extend(shapes.saved_linears(out, unit, states));
        }
        let mut finishing = unit_backward(
            out,
            unit,
            unit_saved,
            kept.recomputed,
            shapes,
            index == first_product,
            (buffers, buffers.prefetched_by(units, index)),
        );
        if index == last {
            finishing.extend(out.alloc(buffers.head_gradients));
        }
        if index == last && last > 0 {
            let block = buffers.backward_weights - buffers.backward_start_weights;
            gathered.extend(out.buffers(
                buffers,
                &[
                    (block, Stream::Unshard),
                    (buffers.backward_pending, Stream::Unshard),
                ],
            ));
            gathered.extend(out.buffers(
                buffers,
                &[
                    (
                        buffers.backward_gradients - buffers.backward_reduce,
                        Stream::Compute,
                    ),
                    (buffers.backward_reduce, Stream::PostBackward),
                ],
            ));
        }
        if !accumulating && !reduced_at_backward_end(workload, unit) {
            gradients.push(gradient_tensors(out, unit, states, shapes));
        }
        out.free_all(finishing);
        out.free(unit_gathered);
    }
    gathered.into_iter().for_each(|g| out.free(g));
    gradients
}

/// A unit's short-lived tensors of its forward in grad mode (`Unit::forward_transient`), as
/// tensors.
fn grad_forward_transient(out: &mut Emitter, unit: &Unit, shapes: &Shapes) -> Vec<u64> {
    out.tensors(
        unit.forward_transient,
        &unit.whole.forward_transient,
        shapes.transient(unit),
    )
}

/// A unit's backward up to its parameter gradients: recomputes `recompute` bytes, frees its
/// `saved` tensors, and returns what is live while the parameter gradients are made. The
/// backward's cuBLAS workspace is made at the unit's first product where it is the
/// backward's `first_product`. `prefetched`: the block before, gathered once the saved tensors
/// are released, and the all-gather's copy beside it while it runs
/// ([`PhaseBuffers::prefetched_by`]); it is among what is returned, the unit's own gathered
/// weights being freed with it, as the same bytes.
fn unit_backward(
    out: &mut Emitter,
    unit: &Unit,
    saved: Vec<u64>,
    recompute: f64,
    shapes: &Shapes,
    first_product: bool,
    (buffers, (prefetched, gather_copy)): (&PhaseBuffers, (f64, f64)),
) -> Vec<u64> {
    // Recomputation makes again the tensors the forward saves, at their sizes; the gradients
    // of its outputs start the unit's backward.
    let recomputed = out.grouped(recompute, unit.whole.saved, shapes.activation_of(unit));
    let whole = &unit.whole;
    // The recomputation is the unit's forward in grad mode: its short-lived tensors come and
    // go beside the saved ones and the gradient that arrived before the backward proper
    // starts.
    if recompute > 0.0 {
        let arrived = out.pieces(
            unit.gradient_transient + unit.pre_recompute_gradient,
            shapes.transient(unit),
        );
        let transient = grad_forward_transient(out, unit, shapes);
        out.free_all(transient);
        out.free_all(arrived);
    }
    let mut starting = out.tensors(
        unit.backward_transient,
        &whole.backward_transient,
        shapes.transient(unit),
    );
    // The last whole tensor of the backward's start that lives on as the gradient.
    let continued = whole
        .backward_transient
        .iter()
        .filter(|&&bytes| bytes >= 1.0)
        .count()
        .checked_sub(1)
        .filter(|&last| whole.gradient_continues && last < starting.len())
        .map(|last| starting.remove(last));
    out.free_all(saved);
    out.free_all(recomputed);
    let gathered = out.buffers(buffers, &[(prefetched, Stream::Unshard)]);
    // A block gathered this late meets the block's first norm before its backward: what it
    // saved beside the all-gather's copy, then its fp32 temporaries.
    let (norm_saved, norm_backward) = if prefetched > 0.0 {
        unit.first_norm
    } else {
        (0.0, 0.0)
    };
    let norm = out.pieces(norm_saved, shapes.transient(unit));
    let copy = out.alloc(gather_copy);
    out.free(copy);
    out.free_all(norm);
    let temporaries = out.pieces(norm_backward, shapes.transient(unit));
    out.free_all(temporaries);
    // The gradient flowing on (e.g. the logits' gradient into the LM head) comes before
    // the parameter gradients it produces.
    let mut finishing = match continued {
        Some(id) => {
            let rest = unit.gradient_transient - whole.gradient_transient.iter().sum::<f64>();
            let mut ids = out.pieces(rest, shapes.transient(unit));
            ids.push(id);
            ids
        }
        None => out.tensors(
            unit.gradient_transient,
            &whole.gradient_transient,
            shapes.transient(unit),
        ),
    };
    if first_product {
        out.workspace(1);
    }
    // What the unit still saves while its parameter gradients are made, in
    // activation-sized pieces in place of the tensors freed above.
    let through = unit.saved_through_gradients;
    finishing.extend(out.pieces(through, shapes.activation_of(unit)));
    finishing.extend(gathered.into_iter().flatten());
    out.free_all(starting);
    finishing
}

/// A static KV cache made before generation starts: gpt-fast's causal-mask buffer of `mask`
/// bytes (made beside the `ones` it comes from), then each layer's key and value tensors.
/// Returns them, alive to the end.
fn static_cache(out: &mut Emitter, units: &[Unit], mask: f64) -> Vec<u64> {
    let ones = out.alloc(mask);
    let mut kept: Vec<u64> = out.alloc(mask).into_iter().collect();
    out.free(ones);
    for unit in units.iter().filter(|u| u.kv_cache > 0.0) {
        kept.extend(out.pieces(unit.kv_cache, unit.kv_cache / 2.0));
    }
    kept
}

/// What a no-grad forward leaves for its caller: the KV cache it made (unit by unit), what its
/// outputs keep (the logits) and generation's selection of the next token.
struct Pass {
    cache: Vec<Vec<u64>>,
    held: Vec<u64>,
    selection: Vec<u64>,
}

/// One no-grad forward: each unit's live tensors while it runs, the KV cache it adds (none
/// where the cache was `preallocated`), what its output keeps; all released when the pass
/// returns but the cache and what the outputs keep ([`Pass`]). `while_running` is called with
/// each unit's index while its live tensors exist (a decode step's cache update).
fn infer(
    out: &mut Emitter,
    units: &[Unit],
    shapes: &Shapes,
    preallocated: bool,
    while_running: &mut dyn FnMut(&mut Emitter, usize),
) -> Pass {
    let mut cache = Vec::new();
    let mut held = Vec::new();
    let mut selected = Vec::new();
    let mut body = Vec::new();
    let last = units.len().saturating_sub(1);
    let first_product = first_product_unit(units);
    for (index, unit) in units.iter().enumerate() {
        if index == first_product {
            out.workspace(0);
        }
        if index == last {
            // The body returns before the head runs, releasing what it held.
            body.drain(..).for_each(|b| out.free(b));
        }
        let piece = if index == last {
            shapes.largest
        } else {
            shapes.own_activation(unit).unwrap_or(shapes.live)
        };
        // The KV cache comes with the unit's (first sublayer's) live tensors.
        let mut started = |out: &mut Emitter| {
            while_running(out, index);
            if !preallocated {
                cache.push(out.grouped(
                    unit.kv_cache,
                    unit.whole.kv_cache,
                    shapes.activation_of(unit),
                ));
            }
        };
        let live = if unit.whole.no_grad.iter().any(|p| p.bytes > 0.0) {
            no_grad_phases(out, &unit.whole.no_grad, &mut started)
        } else {
            let live = out.grouped(unit.inference_live, [unit.whole.live], piece);
            started(out);
            live
        };
        // What the unit returns exists beside its last live tensors (logits and the copy
        // they were made from).
        let selection = unit.whole.selection.min(unit.held);
        held.push(out.alloc(unit.held - selection));
        selected.extend(out.alloc(selection));
        out.free_all(live);
        if index < last {
            body.push(out.alloc(unit.body_held));
        }
    }
    body.into_iter().for_each(|b| out.free(b));
    Pass {
        cache,
        held: held.into_iter().flatten().collect(),
        selection: selected,
    }
}

/// A no-grad block's phases ([`NoGradPhase`]) one after another, each phase's tensors released
/// when the next starts; `started` is called once the first phase's tensors exist. Returns
/// the last phase's live tensors with the probabilities the block still holds.
fn no_grad_phases(
    out: &mut Emitter,
    phases: &[NoGradPhase],
    started: &mut dyn FnMut(&mut Emitter),
) -> Vec<u64> {
    let mut live = Vec::new();
    let mut kept: Option<u64> = None;
    let mut kept_bytes = 0.0;
    let mut first = true;
    for phase in phases.iter().filter(|p| p.bytes > 0.0) {
        out.free_all(std::mem::take(&mut live));
        let rest = (phase.bytes - kept_bytes - phase.scores.peak()).max(0.0);
        // Whole hidden states (the block's input and the norm's output come first), the
        // known tensors, and what is left as one more tensor.
        let whole = phase.whole.bytes.min(rest);
        let states = ((rest - whole) / phase.hidden.max(1.0)).floor();
        live = out.pieces(states * phase.hidden, phase.hidden);
        live.extend(out.pieces(whole, phase.whole.tensor));
        live.extend(out.alloc(rest - whole - states * phase.hidden));
        if std::mem::take(&mut first) {
            started(out);
        }
        if phase.scores.input > 0.0 {
            // A later attention's probabilities replace the earlier's.
            let returned = score_tensors(out, &phase.scores);
            out.free(std::mem::replace(&mut kept, returned));
            kept_bytes = phase.scores.returned_bytes();
        }
    }
    live.extend(kept);
    live
}

/// A materialising attention kernel's score matrices as it makes and releases them
/// ([`ScoreTensors`]): returns the probabilities it returns, if it does.
fn score_tensors(out: &mut Emitter, scores: &ScoreTensors) -> Option<u64> {
    let mut input = out.alloc(scores.input);
    if scores.copied {
        let copy = out.alloc(scores.input);
        out.free(std::mem::replace(&mut input, copy));
    }
    let capped = out.alloc(scores.softcap);
    let conversion = out.alloc(scores.conversion);
    let probs = out.alloc(scores.probs);
    out.free(conversion);
    let cast = out.alloc(scores.cast);
    let output = if cast.is_some() {
        out.free(probs);
        cast
    } else {
        probs
    };
    out.free(capped);
    out.free(input);
    if scores.returned {
        output
    } else {
        out.free(output);
        None
    }
}

/// At most this many decode steps are planned: a longer generation's cache grows by several
/// tokens a planned step, so that a sequence stays small for any length.
const MAX_DECODE_STEPS: u64 = 16;

/// `generate`'s decode after the prefill, for a dynamic cache: each step's forward over one
/// token, in which every layer's `DynamicCache.update` concatenates its keys and its values
/// with the new token's (`torch.cat`: a new tensor of the grown length, then the old one
/// freed), as the estimate's decode phase has it at the last step. The previous step's
/// selection of its token (`_sample`'s `next_token_logits` and `next_token_scores`) stays
/// referenced until the step's own replaces it, after the forward.
struct Decode {
    /// The model's units over one token.
    units: Vec<Unit>,
    /// Tokens in the prompt.
    prompt: f64,
    /// Tokens generated (the first comes from the prefill's logits).
    new_tokens: u64,
    /// An older release's tuple cache: each step makes every layer's new keys and values
    /// before the previous step's cache is dropped.
    tuple: bool,
}

impl Decode {
    /// The decode of `workload` on `model`, where it has one: generation of more than one
    /// token with a cache that grows (not a static one).
    fn of(model: &ModelSpec, workload: &Workload) -> Option<Decode> {
        let grows = workload.mode == Mode::Generate
            && workload.new_tokens > 1
            && workload.static_cache_positions().is_none();
        if !grows {
            return None;
        }
        Some(Decode {
            units: decode_step_units(model, workload),
            prompt: workload.seq as f64,
            new_tokens: workload.new_tokens,
            tuple: tuple_cache(model, workload),
        })
    }

    /// Runs the decode over the prefill's pass and frees what is left.
    fn run(&self, out: &mut Emitter, shapes: &Shapes, prefill: Pass) {
        let Pass {
            mut cache,
            held,
            mut selection,
        } = prefill;
        // `outputs` (the logits) are dropped at the end of each step; the selection lives on.
        out.free_all(held);
        let steps = (self.new_tokens - 1).min(MAX_DECODE_STEPS);
        for step in 1..=steps {
            // Tokens cached once this step's token is in.
            let cached = self.prompt + ((self.new_tokens - 1) * step / steps) as f64;
            let mut dropped = Vec::new();
            // Each layer's keys and values grow while the layer runs.
            let mut grow = |out: &mut Emitter, index: usize| {
                let unit = &self.units[index];
                if unit.kv_cache <= 0.0 {
                    return;
                }
                let tokens = unit.kv_window.map_or(cached, |w| w.min(cached));
                let keys_or_values = unit.kv_cache * tokens / 2.0;
                let grown: Vec<u64> = (0..2).filter_map(|_| out.alloc(keys_or_values)).collect();
                let old = std::mem::replace(&mut cache[index], grown);
                if self.tuple {
                    dropped.extend(old);
                } else {
                    out.free_all(old);
                }
            };
            let step_pass = infer(out, &self.units, shapes, true, &mut grow);
            out.free_all(dropped);
            out.free_all(std::mem::replace(&mut selection, step_pass.selection));
            out.free_all(step_pass.held);
        }
        out.free_all(selection);
        cache.into_iter().for_each(|c| out.free_all(c));
    }
}

/// Highest sum of live bytes of a sequence.
pub fn peak_live_bytes(events: &[PlannedEvent]) -> u64 {
    let mut sizes = std::collections::HashMap::new();
    let (mut live, mut peak) = (0u64, 0u64);
    for event in events {
        match *event {
            PlannedEvent::Alloc { id, bytes, .. } => {
                sizes.insert(id, bytes);
                live += bytes;
                peak = peak.max(live);
            }
            PlannedEvent::Free { id } => live -= sizes.remove(&id).unwrap_or(0),
            PlannedEvent::Step { .. } => {}
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{estimate, find_model, Overheads, Settings};

    /// The bytes and stream of each allocation of `model`'s planned sequence under `workload`.
    fn allocations(model: &ModelSpec, workload: &Workload) -> Vec<(u64, Stream)> {
        allocations_of(&allocation_sequence(model, workload).unwrap())
    }

    /// The bytes and stream of each allocation among `events`.
    fn allocations_of(events: &[PlannedEvent]) -> Vec<(u64, Stream)> {
        events
            .iter()
            .filter_map(|e| match e {
                PlannedEvent::Alloc { bytes, stream, .. } => Some((*bytes, *stream)),
                _ => None,
            })
            .collect()
    }

    /// The units of `workload` on `model` and the sequence's shapes of them.
    fn units_and_shapes(model: &ModelSpec, workload: &Workload) -> (Vec<Unit>, Shapes) {
        let units = build_units(model, workload, workload.batch);
        let counts = model.params();
        let trainable = trainable_params(model, workload, &counts);
        let states = model_states(model, workload, &counts, &units, trainable);
        let shapes = Shapes::of(model, workload, &units, &states);
        (units, shapes)
    }

    /// A model of `testdata/plan/configs/` (the measured sets' shrunk configs) by its stem.
    fn testdata_model(name: &str) -> ModelSpec {
        let path = format!(
            "{}/../../testdata/plan/configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        crate::load_config(std::path::Path::new(&path)).unwrap()
    }

    /// The bytes of each allocation of the planned sequence.
    fn allocation_sizes(model: &ModelSpec, workload: &Workload) -> Vec<u64> {
        allocations(model, workload)
            .into_iter()
            .map(|(bytes, _)| bytes)
            .collect()
    }

    fn planned(
        model: &str,
        mode: &str,
        batch: u64,
        seq: u64,
        dtype: &str,
    ) -> (ModelSpec, Workload) {
        let model = find_model(model).unwrap();
        let settings = Settings {
            mode: Some(mode.into()),
            batch: Some(batch),
            seq: Some(seq),
            dtype: Some(dtype.into()),
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        (model, workload)
    }

    /// FSDP's per-phase buffers and its end-of-backward root reduction are in the sequence too.
    #[test]
    fn sequence_follows_the_fsdp_estimate() {
        for (name, version, mp) in [("llama-3.2-1b", "2", Some("bf16")), ("gpt2", "1", None)] {
            let model = find_model(name).unwrap();
            let settings = Settings {
                batch: Some(2),
                seq: Some(1024),
                gpus: Some(8),
                fsdp: true,
                fsdp_version: Some(version.into()),
                fsdp_mp: mp.map(Into::into),
                ..Settings::default()
            };
            let workload = settings.resolve(&model).unwrap().workload;
            sequence_matching_estimate(&model, &workload, name);
        }
    }

    /// Training of `model` with FSDP `version` over 2 ranks on `target`, batch 2 × 512,
    /// parameters offloaded or not.
    fn fsdp_workload(model: &ModelSpec, version: &str, target: &str, offload: bool) -> Workload {
        let settings = Settings {
            batch: Some(2),
            seq: Some(512),
            gpus: Some(2),
            fsdp: true,
            fsdp_version: Some(version.into()),
            offload: offload.then(|| "all".into()),
            target: Some(target.into()),
            ..Settings::default()
        };
        settings.resolve(model).unwrap().workload
    }

    /// FSDP1 on a GPU makes its gathered flat parameters on the unshard stream, the offloaded
    /// shard's GPU copy on the pre-unshard stream and the reduce-scatter's buffers on the
    /// post-backward stream; FSDP2, and FSDP1 on the CPU (gloo), everything on the compute
    /// stream. The live peaks differ only by FSDP1's own buffers (the root's reduction, the
    /// unit awaiting its free event).
    #[test]
    fn fsdp1_buffers_are_on_its_streams() {
        let model = find_model("llama-3.2-1b").unwrap();
        let streams = |version: &str, target: &str| {
            let workload = fsdp_workload(&model, version, target, true);
            let events = allocation_sequence(&model, &workload).unwrap();
            let mut used: Vec<Stream> = events
                .iter()
                .filter_map(|e| match e {
                    PlannedEvent::Alloc { stream, .. } => Some(*stream),
                    _ => None,
                })
                .collect();
            used.sort_by_key(|s| s.id());
            used.dedup();
            (used, peak_live_bytes(&events))
        };
        let (fsdp1, fsdp1_peak) = streams("1", "gpu");
        assert_eq!(
            fsdp1,
            [
                Stream::Compute,
                Stream::Unshard,
                Stream::PreUnshard,
                Stream::PostBackward
            ]
        );
        let (fsdp2, fsdp2_peak) = streams("2", "gpu");
        assert_eq!(fsdp2, [Stream::Compute]);
        assert_eq!(streams("1", "cpu").0, [Stream::Compute]);
        // FSDP1 and FSDP2 differ only in the root's end-of-backward reduction.
        let difference = fsdp1_peak.abs_diff(fsdp2_peak) as f64 / fsdp2_peak as f64;
        assert!(difference < 0.05, "{fsdp1_peak} vs {fsdp2_peak}");
    }

    /// The sharded layout's buffers of `workload` (`States::buffers`).
    fn phase_buffers(model: &ModelSpec, workload: &Workload) -> PhaseBuffers {
        let counts = model.params();
        let trainable = trainable_params(model, workload, &counts);
        let units = build_units(model, workload, workload.batch);
        model_states(model, workload, &counts, &units, trainable).buffers
    }

    /// The peak of live bytes on FSDP1's unshard stream in `events`.
    fn unshard_peak(events: &[PlannedEvent]) -> f64 {
        let unshard: Vec<PlannedEvent> = events
            .iter()
            .copied()
            .filter(|e| match e {
                PlannedEvent::Alloc { stream, .. } => *stream == Stream::Unshard,
                _ => true,
            })
            .collect();
        peak_live_bytes(&unshard) as f64
    }

    /// FSDP1's unshard pool holds three units' outputs in backward (computing, prefetched, and
    /// the one resharded last, awaiting its free event) and two in forward; FSDP2 and FSDP1 on
    /// the CPU have no pending one.
    #[test]
    fn fsdp1_backward_waits_for_one_resharded_unit() {
        let model = find_model("llama-3.2-1b").unwrap();
        let buffers = |version: &str, target: &str| {
            let workload = fsdp_workload(&model, version, target, false);
            let events = allocation_sequence(&model, &workload).unwrap();
            (phase_buffers(&model, &workload), unshard_peak(&events))
        };
        let (fsdp1, unshard_peak) = buffers("1", "gpu");
        let block = fsdp1.backward_weights - fsdp1.backward_start_weights;
        assert!(block > 0.0);
        assert_eq!(fsdp1.backward_pending, block);
        let three_units = fsdp1.backward_weights + fsdp1.backward_pending;
        assert!(
            (unshard_peak - three_units).abs() < 2.0,
            "{unshard_peak} vs {three_units}"
        );
        assert_eq!(buffers("2", "gpu").0.backward_pending, 0.0);
        assert_eq!(buffers("1", "cpu").0.backward_pending, 0.0);
    }

    /// With every LoRA adapter a unit of its own, FSDP1 gathers the block before a block only
    /// as that block's backward finishes: one block gathered through backward, the previous
    /// one from the finishing moment, none pending; the unshard pool holds two. FSDP2 and
    /// FSDP1 without adapters prefetch at a block's start. On the CPU gloo's all-gather copies
    /// its output.
    #[test]
    fn fsdp1_gathers_the_block_before_late_under_adapter_units() {
        let model = find_model("llama-3.2-1b").unwrap();
        let lora = |version: &str, target: &str| {
            let settings = Settings {
                batch: Some(2),
                seq: Some(512),
                gpus: Some(2),
                fsdp: true,
                fsdp_version: Some(version.into()),
                target: Some(target.into()),
                lora_rank: Some(8),
                ..Settings::default()
            };
            settings.resolve(&model).unwrap().workload
        };
        let buffers = |workload: &Workload| phase_buffers(&model, workload);
        let full = buffers(&fsdp_workload(&model, "1", "gpu", false));
        let block = full.backward_weights - full.backward_start_weights;
        let late = lora("1", "gpu");
        let adapters = buffers(&late);
        assert_eq!(adapters.backward_weights, adapters.backward_start_weights);
        assert_eq!(adapters.backward_prefetched, block);
        assert_eq!(adapters.backward_pending, 0.0);
        assert_eq!(adapters.gather_copy_share, 0.0);
        assert_eq!(buffers(&lora("1", "cpu")).gather_copy_share, 1.0);
        assert_eq!(buffers(&lora("2", "gpu")).backward_prefetched, 0.0);
        assert_eq!(full.backward_prefetched, 0.0);
        // The unshard pool: the root and two blocks at the most.
        let events = sequence_matching_estimate(&model, &late, "FSDP1 LoRA");
        let two_blocks = adapters.backward_weights + adapters.backward_prefetched;
        let peak = unshard_peak(&events);
        assert!(
            peak <= two_blocks.max(adapters.forward_weights) + 2.0,
            "{peak}"
        );
    }

    /// A block's first norm as a late-gathered block meets it: Llama's RMSNorm under LoRA
    /// saved its fp32 copy (and a reciprocal per row), and its backward's Python ops make five
    /// fp32 hidden-sized temporaries; a fused norm (LayerNorm, Liger's RMSNorm) makes none.
    /// The finishing moment of a block with a block gathered late holds the larger of the
    /// two beside the gathered blocks.
    #[test]
    fn a_late_gathered_block_meets_the_first_norm() {
        let llama = find_model("llama-3.2-1b").unwrap();
        let tokens = 2.0 * 512.0;
        let Architecture::Transformer(spec) = &llama.arch else {
            panic!("Llama is a transformer")
        };
        let h = spec.hidden as f64;
        let workload = |model: &ModelSpec, kernels: Option<&str>| {
            Settings {
                batch: Some(2),
                seq: Some(512),
                lora_rank: Some(8),
                kernels: kernels.map(Into::into),
                ..Settings::default()
            }
            .resolve(model)
            .unwrap()
            .workload
        };
        let first_norm = |model: &ModelSpec, kernels: Option<&str>| {
            let units = build_units(model, &workload(model, kernels), 2);
            units.iter().find(|u| u.name == "block").unwrap().first_norm
        };
        assert_eq!(
            first_norm(&llama, None),
            (tokens * (4.0 * h + 4.0), tokens * 5.0 * 4.0 * h)
        );
        assert_eq!(first_norm(&llama, Some("liger")).1, 0.0);
        assert_eq!(first_norm(&find_model("gpt2").unwrap(), None).1, 0.0);
    }

    /// FSDP1 training holds each unit's sharded flat parameter as one tensor.
    #[test]
    fn fsdp1_shards_are_one_tensor_per_unit() {
        let model = find_model("llama-3.2-1b").unwrap();
        let workload = fsdp_workload(&model, "1", "gpu", false);
        let events = allocation_sequence(&model, &workload).unwrap();
        let before_steps: Vec<u64> = events
            .iter()
            .take_while(|e| !matches!(e, PlannedEvent::Step { .. }))
            .filter_map(|e| match e {
                PlannedEvent::Alloc { bytes, .. } => Some(*bytes),
                _ => None,
            })
            .collect();
        let counts = model.params();
        let dtype = workload.dtype.bytes() as f64;
        let block_shard = (counts.largest_block as f64 * dtype / 2.0).ceil() as u64;
        let shards = before_steps.iter().filter(|&&b| b == block_shard).count();
        assert_eq!(shards, model.blocks() as usize, "{before_steps:?}");
    }

    /// The sequence's peak of live bytes is the estimate's peak allocated within 5 %; returns
    /// the sequence.
    fn sequence_matching_estimate(
        model: &ModelSpec,
        workload: &Workload,
        what: &str,
    ) -> Vec<PlannedEvent> {
        let events = allocation_sequence(model, workload).unwrap();
        let planned = estimate(model, workload, &Overheads::default()).unwrap();
        let peak = peak_live_bytes(&events) as f64;
        let allocated = planned.peak_allocated_bytes as f64;
        assert!(
            ((peak - allocated) / allocated).abs() < 0.05,
            "{what}: sequence peak {peak}, estimate {allocated}"
        );
        events
    }

    /// As many frees as allocations in `events` (`what` names the sequence in the failure).
    pub(in crate::sequence) fn assert_all_freed(events: &[PlannedEvent], what: &str) {
        let allocs = events
            .iter()
            .filter(|e| matches!(e, PlannedEvent::Alloc { .. }));
        let frees = events
            .iter()
            .filter(|e| matches!(e, PlannedEvent::Free { .. }));
        assert_eq!(allocs.count(), frees.count(), "{what}");
    }

    #[test]
    fn sequence_follows_the_estimate() {
        let cases = [
            ("gpt2", "train", 4, 512, "fp32"),
            ("llama-3.2-1b", "train", 2, 1024, "bf16"),
            ("qwen3-0.6b", "infer", 4, 2048, "bf16"),
            ("qwen3-30b-a3b", "train", 1, 512, "bf16"),
            ("sd-1.5-unet", "train", 2, 77, "bf16"),
            ("sdxl-unet", "infer", 2, 77, "fp16"),
        ];
        for (name, mode, batch, seq, dtype) in cases {
            let (model, workload) = planned(name, mode, batch, seq, dtype);
            let events = sequence_matching_estimate(&model, &workload, name);
            assert_all_freed(&events, name);
        }
    }

    /// `--loss none` (`outputs.logits.sum().backward()`): the logits-sized gradient the head's
    /// backward starts with is the one its matmul reads, so the sequence holds two
    /// logits-sized tensors there (the held logits and that gradient), as the estimate does,
    /// with or without soft-capping's second gradient (Gemma 2).
    #[test]
    fn a_summed_loss_follows_the_estimate() {
        // Small models, whose logits are most of the step.
        for (name, dtype) in [("opt-2l", "fp16"), ("gemma2-4l", "bf16")] {
            let model = testdata_model(name);
            let settings = Settings {
                mode: Some("train".into()),
                batch: Some(4),
                seq: Some(256),
                dtype: Some(dtype.into()),
                optimizer: Some("none".into()),
                loss: Some("none".into()),
                ..Settings::default()
            };
            let workload = settings.resolve(&model).unwrap().workload;
            let what = format!("{name} --loss none");
            let events = sequence_matching_estimate(&model, &workload, &what);
            assert_all_freed(&events, &what);
        }
    }

    /// ZeRO-3's gathered block weights kept by PyTorch's linear (DeepSpeed before 0.19.4, no
    /// zero.Init) are allocated after each block's forward and freed with its saved tensors,
    /// as the estimate has them, with and without checkpointing.
    #[test]
    fn zero3_saved_linears_follow_the_estimate() {
        let model = find_model("llama-3.2-1b").unwrap();
        for grad_ckpt in [false, true] {
            let settings = Settings {
                batch: Some(2),
                seq: Some(1024),
                dtype: Some("bf16".into()),
                gpus: Some(4),
                zero: Some("3".into()),
                no_zero_init: true,
                deepspeed: Some("0.14.2".into()),
                grad_ckpt,
                ..Settings::default()
            };
            let workload = settings.resolve(&model).unwrap().workload;
            let what = format!("llama-3.2-1b ZeRO-3, checkpointing {grad_ckpt}");
            let events = sequence_matching_estimate(&model, &workload, &what);
            assert_all_freed(&events, &what);
        }
    }

    /// ZeRO-3 copies each gradient bucket for its reduce-scatter on its reduce-and-partition
    /// stream on a GPU (one copy per step of the whole model's gradients when they fit the
    /// bucket, in the module dtype); on the CPU the copy is on the compute stream.
    #[test]
    fn zero3_bucket_copy_is_on_its_reduce_stream() {
        let model = find_model("gpt2").unwrap();
        let copies = |target: &str| {
            let settings = Settings {
                batch: Some(1),
                seq: Some(512),
                dtype: Some("fp16".into()),
                zero: Some("3".into()),
                target: Some(target.into()),
                ..Settings::default()
            };
            let workload = settings.resolve(&model).unwrap().workload;
            allocations(&model, &workload)
                .into_iter()
                .filter(|(_, stream)| *stream == Stream::ReduceAndPartition)
                .map(|(bytes, _)| bytes)
                .collect::<Vec<u64>>()
        };
        let gradients = model.params().total() * 2;
        assert_eq!(copies("gpu"), [gradients; STEPS as usize]);
        assert!(copies("cpu").is_empty());
    }

    /// The vocabulary matrix (tied in GPT-2), its gradient, AdamW's two moments and its foreach
    /// temporary are one tensor each, and so are the loss's fp32 log-probabilities and their gradients; with
    /// FSDP, whose flat parameters hold a shard of many weights, the matrix is not whole.
    #[test]
    fn the_largest_tensors_are_allocated_whole() {
        let sizes = |workload: &Workload, model: &ModelSpec| allocation_sizes(model, workload);
        let (model, workload) = planned("gpt2", "train", 4, 512, "fp32");
        let sizes_single = sizes(&workload, &model);
        let count = |bytes: u64| sizes_single.iter().filter(|&&b| b == bytes).count();
        let vocabulary = 50257 * 768 * 4;
        // Weight (allocated once), AdamW's two moments, and per step the gradient, the tied
        // table's new gradient from the embeddings' backward and the sum accumulating it, and
        // the foreach temporary (as the GPT-2 CPU trace has them: 1, then 6 and 4 a step).
        assert_eq!(count(vocabulary), 1 + 2 + 2 * (1 + 2 + 1));
        let log_probs = 4 * 512 * 50257 * 4;
        // Per step: the logits, log-probabilities, nll_loss's and log_softmax's gradients (the
        // last is the logits' gradient: fp32 needs no cast).
        assert_eq!(count(log_probs), 2 * 4);

        let fsdp = Settings {
            batch: Some(4),
            seq: Some(512),
            gpus: Some(2),
            fsdp: true,
            ..Settings::default()
        };
        // Under FSDP the table, its gradient and states are pieces of flat parameters; only
        // the accumulation's two gradients per step (the views' in autograd) are whole.
        let workload = fsdp.resolve(&model).unwrap().workload;
        let sizes_fsdp = sizes(&workload, &model);
        let count = sizes_fsdp.iter().filter(|&&b| b == vocabulary).count();
        assert_eq!(count, 2 * STEPS as usize);
    }

    /// The cuBLAS workspaces are made where the run's first matrix products are, the
    /// forward's in the first step's forward and the backward's once the loss's gradients
    /// exist, and freed only at the sequence's end; a forward-only run makes one.
    #[test]
    fn workspaces_are_made_at_the_first_products() {
        let (model, workload) = planned("gpt2", "train", 4, 512, "fp32");
        let run = planned_run(&model, &workload).unwrap();
        let position =
            |wanted: &dyn Fn(&PlannedEvent) -> bool| run.events.iter().position(wanted).unwrap();
        let made = |id: u64| {
            position(&|e: &PlannedEvent| matches!(*e, PlannedEvent::Alloc { id: i, .. } if i == id))
        };
        let step = |index: u64| position(&|e: &PlannedEvent| *e == PlannedEvent::Step { index });
        let log_probs = 4 * 512 * 50257 * 4;
        let loss = position(
            &|e: &PlannedEvent| matches!(*e, PlannedEvent::Alloc { bytes, .. } if bytes == log_probs),
        );
        let [forward, backward] = run.process_workspaces[..] else {
            panic!("{:?}", run.process_workspaces);
        };
        assert!(step(0) < made(forward), "made before the step");
        assert!(made(forward) < loss && loss < made(backward));
        assert!(made(backward) < step(1), "made in the second step");
        let freed: Vec<usize> = run
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(**e, PlannedEvent::Free { id } if id == forward || id == backward))
            .map(|(at, _)| at)
            .collect();
        let last_alloc = run
            .events
            .iter()
            .rposition(|e| matches!(e, PlannedEvent::Alloc { .. }))
            .unwrap();
        assert!(freed.len() == 2 && freed.iter().all(|&at| at > last_alloc));

        let (model, workload) = planned("gpt2", "infer", 4, 512, "fp32");
        assert_eq!(
            planned_run(&model, &workload)
                .unwrap()
                .process_workspaces
                .len(),
            1
        );

        // A ResNet's first product is its classifier's, after its convolutions' tensors.
        let model = find_model("resnet50").unwrap();
        let settings = Settings {
            mode: Some("infer".into()),
            batch: Some(8),
            image_size: Some(224),
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        let run = planned_run(&model, &workload).unwrap();
        // The first step's allocations, in order.
        let step = |index: u64| {
            run.events
                .iter()
                .position(|e| *e == PlannedEvent::Step { index })
                .unwrap()
        };
        let first: Vec<u64> = run.events[step(0)..step(1)]
            .iter()
            .filter_map(|e| match *e {
                PlannedEvent::Alloc { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        let made = first
            .iter()
            .position(|&id| id == run.process_workspaces[0])
            .unwrap();
        assert!(
            made > first.len() / 2,
            "made at allocation {made} of the step's {}",
            first.len()
        );
    }

    /// `generate`'s decode grows every layer's keys and values into new tensors: at its last
    /// step each of GPT-2's 12 layers makes keys and values of the prompt and every new token
    /// but the last (16 + 63), in both planned steps.
    #[test]
    fn a_decode_grows_each_layers_cache() {
        let model = find_model("gpt2").unwrap();
        let settings = Settings {
            mode: Some("generate".into()),
            batch: Some(1),
            seq: Some(16),
            new_tokens: Some(64),
            dtype: Some("fp32".into()),
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        let sizes = allocation_sizes(&model, &workload);
        let last_step = (16 + 63) * 768 * 4;
        let count = sizes.iter().filter(|&&b| b == last_step).count();
        assert_eq!(count, 2 * 12 * STEPS as usize);
    }

    /// A mixture's routed experts are two tensors over all experts per layer under
    /// transformers 5 (`gate_up_proj`, `down_proj`), one matrix per expert and projection
    /// under 4.x: the planned weights follow the release.
    #[test]
    fn mixture_weights_follow_the_release() {
        let model = testdata_model("mixtral-4l");
        // hidden 512, intermediate 1024, 8 experts, 4 layers, bf16; the embeddings and the
        // untied head (8192 × 512) are the size of a `down_proj` too.
        let sizes = |transformers: Option<&str>| {
            let settings = Settings {
                mode: Some("infer".into()),
                batch: Some(1),
                // Logits of 48 positions are no expert's size.
                seq: Some(48),
                dtype: Some("bf16".into()),
                transformers: transformers.map(Into::into),
                ..Settings::default()
            };
            allocation_sizes(&model, &settings.resolve(&model).unwrap().workload)
        };
        let count = |sizes: &[u64], bytes: u64| sizes.iter().filter(|&&b| b == bytes).count();
        let (gate_up, down, expert) = (8 * 2 * 1024 * 512 * 2, 8 * 512 * 1024 * 2, 512 * 1024 * 2);
        let today = sizes(None);
        assert_eq!((count(&today, gate_up), count(&today, down)), (4, 4 + 2));
        assert_eq!(count(&today, expert), 0);
        let old = sizes(Some("4.57"));
        assert_eq!((count(&old, gate_up), count(&old, down)), (0, 2));
        assert_eq!(count(&old, expert), 4 * 8 * 3);
    }

    /// Tensors of TinyLlama's MLP-intermediate size (tokens × 5632, bf16) in its planned
    /// training step at batch 2 × 512, with or without full checkpointing.
    fn tinyllama_intermediates(grad_ckpt: bool) -> usize {
        let model = find_model("tinyllama").unwrap();
        let intermediate = 2 * 512 * 5632 * 2;
        let settings = Settings {
            mode: Some("train".into()),
            batch: Some(2),
            seq: Some(512),
            dtype: Some("bf16".into()),
            grad_ckpt,
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        let sizes = allocation_sizes(&model, &workload);
        sizes.iter().filter(|&&b| b == intermediate).count()
    }

    #[test]
    fn recomputation_makes_the_saved_tensors_again() {
        // TinyLlama under full checkpointing: each block's recomputation in backward saves its
        // MLP's intermediates again, each one tensor, as the forward without checkpointing
        // saves them.
        let count = tinyllama_intermediates;
        assert!(count(false) > 0);
        assert!(count(true) >= count(false));
    }

    #[test]
    fn a_checkpointed_forward_makes_its_tensors_as_a_no_grad_forward() {
        // TinyLlama under full checkpointing keeps nothing of a block's forward, which makes
        // its MLP's intermediates (tokens × 5632, bf16) as a no-grad forward does, one tensor
        // each, before its backward recomputes them: at least two more per block and step
        // than the same step without checkpointing makes.
        let model = find_model("tinyllama").unwrap();
        let Architecture::Transformer(spec) = &model.arch else {
            panic!("tinyllama is a transformer");
        };
        let count = tinyllama_intermediates;
        let more = 2 * spec.layers as usize * STEPS as usize;
        assert!(
            count(true) >= count(false) + more,
            "{} {}",
            count(true),
            count(false)
        );
    }

    #[test]
    fn lora_adds_its_adapters_tensors_to_a_checkpointed_forward() {
        // With LoRA (PEFT 0.10's bf16 adapters, dropout, on the GPU), each adapted linear of
        // a checkpointed block's no-grad MLP adds its scaled adapter output and the sum beside
        // the base output: two tensors of the widest adapted output (TinyLlama's 5632) per
        // token, the MLP's phase and no other.
        let model = find_model("tinyllama").unwrap();
        let phases = |lora: bool| {
            let settings = Settings {
                mode: Some("train".into()),
                batch: Some(2),
                seq: Some(512),
                dtype: Some("bf16".into()),
                grad_ckpt: true,
                lora_rank: lora.then_some(64),
                lora_targets: lora.then(|| "q,k,v,gate,up,down".into()),
                lora_dropout: lora.then_some(0.1),
                peft: lora.then(|| "0.10".into()),
                ..Settings::default()
            };
            let workload = settings.resolve(&model).unwrap().workload;
            let units = build_units(&model, &workload, workload.batch);
            let block = units.iter().find(|u| u.name == "block").unwrap();
            block.checkpointed_forward().unwrap().map(|p| p.bytes)
        };
        let (with, without) = (phases(true), phases(false));
        let tokens = 2.0 * 512.0;
        assert_eq!(with[2] - without[2], tokens * 2.0 * 2.0 * 5632.0);
        assert!(with[0] > without[0], "{with:?} {without:?}");
    }

    #[test]
    fn an_upcast_softmax_saves_its_probabilities_whole() {
        // TinyLlama's eager attention in bf16 runs its softmax in fp32 and saves that output
        // for backward: one fp32 tensor of the scores' shape per block and step.
        let model = find_model("tinyllama").unwrap();
        let Architecture::Transformer(spec) = &model.arch else {
            panic!("tinyllama is a transformer");
        };
        let settings = Settings {
            mode: Some("train".into()),
            batch: Some(2),
            seq: Some(256),
            dtype: Some("bf16".into()),
            attn: Some("eager".into()),
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        let probs = 2 * spec.heads * 256 * 256 * 4;
        let sizes = allocation_sizes(&model, &workload);
        let count = sizes.iter().filter(|&&b| b == probs).count();
        assert!(count >= spec.layers as usize * STEPS as usize, "{count}");
    }

    #[test]
    fn a_frozen_towers_matrices_get_no_states() {
        // LLaVA-4l with its vision tower frozen: the tower's 256 × 256 attention matrices
        // (fp32, 256 KiB; four in each of its four blocks) are weights only, with no gradient,
        // optimizer state or step temporary of their size.
        let model = testdata_model("llava-4l");
        let settings = Settings {
            mode: Some("train".into()),
            batch: Some(2),
            seq: Some(512),
            dtype: Some("fp32".into()),
            freeze_vision_tower: true,
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        let sizes = allocation_sizes(&model, &workload);
        let tower_attention = 256 * 256 * 4;
        let count = sizes.iter().filter(|&&b| b == tower_attention).count();
        assert_eq!(count, 4 * 4);
    }

    #[test]
    fn a_no_grad_block_makes_its_scores_and_cache_as_whole_tensors() {
        // Whisper's eager attention without gradients: each encoder block's scores, their
        // scaled copy and the softmax's output (bf16, no upcast), one score matrix each; each
        // decoder block's cross-attention keys and values over the encoder's 1500 frames.
        let model = testdata_model("whisper-4l");
        let settings = Settings {
            mode: Some("infer".into()),
            batch: Some(4),
            seq: Some(128),
            dtype: Some("bf16".into()),
            attn: Some("eager".into()),
            labels: true,
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        let Architecture::Transformer(spec) = &model.arch else {
            panic!("whisper-4l is a transformer");
        };
        let sizes = allocation_sizes(&model, &workload);
        let count = |sizes: &[u64], bytes: u64| sizes.iter().filter(|&&b| b == bytes).count();
        let scores = 4 * spec.heads * 1500 * 1500 * 2;
        assert_eq!(
            count(&sizes, scores),
            3 * spec.encoder_layers as usize * STEPS as usize
        );
        // The decoder blocks alone (the encoder's hidden states have the keys' size).
        let (units, shapes) = units_and_shapes(&model, &workload);
        let decoder = &units[1 + spec.encoder_layers as usize..units.len() - 1];
        let mut out = Emitter::default();
        infer(&mut out, decoder, &shapes, false, &mut |_, _| {});
        let decoder_sizes: Vec<u64> = allocations_of(&out.events)
            .into_iter()
            .map(|(bytes, _)| bytes)
            .collect();
        // (Besides them, the encoder's output the first decoder block holds.)
        let cross_keys = 4 * 1500 * spec.hidden * 2;
        assert_eq!(
            count(&decoder_sizes, cross_keys),
            2 * spec.layers as usize + 1
        );
    }

    /// Whisper's encoder blocks are cut into hidden states of its 1500 frames, its decoder's
    /// into hidden states of the decoder's tokens.
    #[test]
    fn an_audio_encoder_has_hidden_states_of_its_own_frames() {
        let model = testdata_model("whisper-4l");
        let settings = Settings {
            mode: Some("train".into()),
            batch: Some(2),
            seq: Some(64),
            dtype: Some("bf16".into()),
            ..Settings::default()
        };
        let workload = settings.resolve(&model).unwrap().workload;
        let (units, shapes) = units_and_shapes(&model, &workload);
        // d_model 384, bf16.
        let (encoder, decoder) = (2.0 * 1500.0 * 384.0 * 2.0, 2.0 * 64.0 * 384.0 * 2.0);
        let blocks: Vec<f64> = units
            .iter()
            .filter(|u| u.name == "block")
            .map(|u| shapes.activation_of(u))
            .collect();
        assert_eq!(blocks, [[encoder; 4], [decoder; 4]].concat());
    }

    #[test]
    fn lora_trained_tensors_are_its_adapter_matrices_or_their_shards() {
        let model = find_model("meta-llama/Llama-2-7b-hf").unwrap();
        let sizes = |gpus: u64, fsdp: bool| -> Vec<u64> {
            let settings = Settings {
                batch: Some(1),
                seq: Some(256),
                dtype: Some("bf16".into()),
                lora_rank: Some(64),
                lora_targets: Some("q,k,v,gate,up,down".into()),
                peft: Some("0.10".into()),
                gpus: Some(gpus),
                fsdp,
                fsdp_version: fsdp.then(|| "1".into()),
                ..Settings::default()
            };
            let workload = settings.resolve(&model).unwrap().workload;
            allocation_sizes(&model, &workload)
        };
        let count = |sizes: &[u64], bytes: u64| sizes.iter().filter(|&&b| b == bytes).count();
        // bf16 adapters (PEFT 0.10): q, k and v's lora_A and lora_B of 64 × 4096, gate and
        // up's lora_A of 64 × 4096 and down's lora_B of 4096 × 64: nine of 0.5 MiB per block.
        let adapter = 64 * 4096 * 2;
        // On one GPU, per block and step: each one's gradient, AdamW's two moments (made in
        // the first step) and the foreach step's temporary.
        let single = sizes(1, false);
        assert_eq!(count(&single, adapter), 32 * 9 * (2 + 2 + 2));
        // FSDP1 on 2 GPUs: every adapter is a unit of its own, and what is trained is this
        // rank's half of it: allocations of PyTorch's small pool (at most 1 MiB).
        let sharded = sizes(2, true);
        assert!(count(&sharded, adapter / 2) >= 32 * 9 * (2 + 2 + 2));
        assert_eq!(count(&sharded, adapter), 0);
    }
}
