//! MoE dispatch on the device (`moe.wgsl`): a [`SwitchMlp`]'s weights uploaded once in
//! their own format, and each call recorded into an encoder with device buffers in and
//! out — routing, the plan, the grouped products and the combine all on the device. The
//! branch is decided per call from N against the layer's `sort_cutoff`; the grids are
//! sized by N, N*k, E, D and H, never by the routing, so nothing goes back to the host.

use std::sync::Mutex;

use crate::backend::MoeLayer;
use crate::error::{Error, Result};
use crate::moe::{
    Dispatch, DispatchPlan, ExpertWeights, GateUp, MoeOutput, Router, Routing, SwitchMlp,
    WeightDtype,
};

use super::buffers::{make_buffer, Grow};
use super::device::{lazy_pipelines, poisoned, Pipelines, WgpuDevice};
use super::profile::{Passes, Profiler};
use super::rows;
use crate::profile::Launch;

/// The WGSL of the MoE kernels (without the shared arithmetic).
pub const SHADER_MOE: &str = include_str!("moe.wgsl");

/// The complete MoE module (with `fmath.wgsl`) for f32 experts.
pub fn moe_shader_source() -> String {
    moe_shader_source_for(0, 0, 0)
}

/// The complete module for experts of weight format `dtype` (0 f32, 1 bf16, 2 f16,
/// 3 affine) with `bits`-bit codes in groups of `group`: the grouped products are
/// compiled for that format alone.
pub fn moe_shader_source_for(dtype: u32, bits: u32, group: u32) -> String {
    moe_shader_source_with(dtype, bits, group, false, true)
}

/// [`moe_shader_source_for`], the experts' team sums with subgroup operations when
/// `subgroups` (devices with `Features::SUBGROUP`): the same bits; the input rows and the
/// activations between the gate/up and the down products loaded as vec4s when
/// `vec4_inputs` (`moe_x4.wgsl`: for layers whose hidden and intermediate widths are
/// whole vec4s; wrong results otherwise), else one float at a time (`moe_x1.wgsl`): the
/// same bits.
pub fn moe_shader_source_with(
    dtype: u32,
    bits: u32,
    group: u32,
    subgroups: bool,
    vec4_inputs: bool,
) -> String {
    let inputs = if vec4_inputs {
        include_str!("moe_x4.wgsl")
    } else {
        include_str!("moe_x1.wgsl")
    };
    format!(
        "{}{SHADER_MOE}\n{inputs}\n{}\n{}\n{}",
        super::shaders::weight_format_source(dtype, bits, group),
        super::shaders::SHADER_FMATH,
        super::shaders::SHADER_TILE,
        super::shaders::team_source(subgroups)
    )
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MoeParams {
    pub tokens: u32,
    pub top_k: u32,
    pub experts: u32,
    pub hidden: u32,
    pub inter: u32,
    pub sorted: u32,
    pub router: u32,
    pub separate: u32,
    pub dtype: u32,
    pub bits: u32,
    pub group: u32,
    pub zero: u32,
    pub gate_w: u32,
    pub gate_s: u32,
    pub gate_b: u32,
    pub up_w: u32,
    pub up_s: u32,
    pub up_b: u32,
    pub down_w: u32,
    pub down_s: u32,
    pub down_b: u32,
    pub w_idx_in: u32,
    pub w_wt: u32,
    pub w_order: u32,
    pub w_idx: u32,
    pub w_inv: u32,
    pub w_off: u32,
    pub w_act: u32,
    pub w_out: u32,
    pub e_lo: u32,
    pub e_hi: u32,
    pub accumulate: u32,
    pub w_tb: u32,
    pub w_tiles: u32,
}

/// The MoE kernels' pipelines (built when a layer is made), indexed by the constants
/// below.
type Pipes = Pipelines<9>;
const ROUTE: usize = 0;
const COUNT: usize = 1;
const PLACE: usize = 2;
const ACT: usize = 3;
const DOWN: usize = 4;
const COMBINE: usize = 5;
const DOWN_COMBINE: usize = 6;
const ACT_TILED: usize = 7;
const DOWN_TILED: usize = 8;

/// Rows of one expert a tiled product's workgroup computes (`tile.wgsl`).
const TILE_ROWS: usize = 32;

/// The routing of a recorded call.
#[derive(Debug, Clone, Copy)]
pub enum MoeRouting<'a> {
    /// Router logits `[N, E]` f32 in a device buffer, routed on the device.
    Logits {
        /// The buffer (STORAGE).
        buffer: &'a wgpu::Buffer,
        /// Experts per token.
        top_k: usize,
        /// The router.
        router: Router,
    },
    /// A routing from the host (uploaded with the call's parameters).
    Given(&'a Routing),
}

/// Calls routed on the device whose parameters and bind group are kept.
#[derive(Clone, PartialEq, Eq, Hash)]
struct CallKey {
    n: usize,
    k: usize,
    sorted: bool,
    router: u32,
    accumulate: bool,
    x: wgpu::Buffer,
    logits: wgpu::Buffer,
    y: wgpu::Buffer,
}

/// Most kept calls (a model has a few shapes: prefill lengths and the decode batch).
const CALL_CACHE: usize = 64;

struct Scratch {
    work: Grow,
    /// The experts' activations between the gate/up and the down products ([rows, H]).
    acts: Grow,
    counts: Grow,
    logits: Grow,
    x: Grow,
    y: Grow,
    read: Grow,
}

/// A SwiGLU expert layer on the device.
pub struct WgpuMoe {
    ctx: WgpuDevice,
    pipes: std::sync::Arc<Pipes>,
    /// The weights in parts of whole experts, each in a buffer of its own with the
    /// parameters (offsets, expert range) of its dispatches.
    parts: Vec<(wgpu::Buffer, MoeParams)>,
    experts: usize,
    hidden: usize,
    inter: usize,
    sort_cutoff: usize,
    /// Bytes one expert's gate and up matrices, and its down matrix, take on the device
    /// (the plan of a profiled call).
    gate_up_bytes: u64,
    down_bytes: u64,
    scratch: Mutex<Scratch>,
    calls: Mutex<std::collections::HashMap<CallKey, (Vec<wgpu::BindGroup>, wgpu::Buffer)>>,
    /// The call's parameters, a block per part: copied from a staging buffer by each
    /// recorded call just before its dispatches, so calls recorded back to back each see
    /// their own.
    params_buf: wgpu::Buffer,
}

impl std::fmt::Debug for WgpuMoe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuMoe")
            .field("adapter", &self.ctx.adapter_name())
            .field("experts", &self.experts)
            .field("hidden", &self.hidden)
            .field("intermediate", &self.inter)
            .finish()
    }
}

/// Appends experts `e_lo .. e_hi` of a matrix `[E, out, in]` (weights, then scales and
/// biases for affine ones) to `all` in the device's row layout ([`super::rows`]), the
/// weights starting on a `vec4<u32>`; returns their offsets.
fn push_matrix(all: &mut Vec<u32>, w: &ExpertWeights, e_lo: usize, e_hi: usize) -> (u32, u32, u32) {
    let (r0, r1) = (e_lo * w.out_features(), e_hi * w.out_features());
    all.resize(all.len().next_multiple_of(4), 0);
    let o = all.len() as u32;
    rows::push_rows(all, w, r0, r1);
    if rows::row_groups(w) == 0 {
        return (o, 0, 0);
    }
    let s = all.len() as u32;
    rows::push_side(all, w, r0, r1, false);
    let b = all.len() as u32;
    rows::push_side(all, w, r0, r1, true);
    (o, s, b)
}

/// Words one expert of a matrix takes on the device.
fn expert_words(w: &ExpertWeights) -> usize {
    w.out_features() * (rows::row_words(w) + 2 * rows::row_groups(w))
}

/// Most tiles `rows` (token, expert) rows routed among `experts` experts can make: the
/// sum over the experts that hold rows of ceil(rows_e / TILE_ROWS), at most
/// (rows + (TILE_ROWS - 1) m) / TILE_ROWS for m = min(experts, rows) such experts. A
/// sorted call's tiled products dispatch this many tiles' workgroups, and those past the
/// routing's own tiles do nothing; a few rows (N = 1, k = 8: 8 tiles, not 129 at E = 128)
/// launch few of them.
fn max_tiles(rows: usize, experts: usize) -> usize {
    (rows + (TILE_ROWS - 1) * experts.min(rows)) / TILE_ROWS
}

/// `n` workgroups as a grid within the per-dimension limit (the kernels flatten it).
fn flat_grid(n: usize) -> (usize, usize) {
    let n = n.max(1);
    (n.min(65535), n.div_ceil(65535))
}

impl WgpuMoe {
    /// Uploads `layer`'s weights to a device (a [`WgpuDevice`], or a
    /// [`super::WgpuSampler`] on one), whose compiled MoE pipelines every layer made from
    /// it shares. Every matrix must have the same dtype (as checkpoints have).
    pub fn new(on: &impl AsRef<WgpuDevice>, layer: &SwitchMlp) -> Result<Self> {
        let ctx = on.as_ref().clone();
        let device = ctx.device().clone();
        let dtype = layer.down().dtype();
        let (gate, up) = match layer.gate_up() {
            GateUp::Fused(w) => (w, None),
            GateUp::Separate { gate, up } => (gate, Some(up)),
        };
        if gate.dtype() != dtype || up.is_some_and(|u| u.dtype() != dtype) {
            return Err(Error::InvalidMoe {
                field: "weights",
                value: "matrices of different dtypes".into(),
                expected: "one dtype for gate, up and down on the device",
            });
        }
        // parts of whole experts, each within what one binding holds
        let expert_bytes = 4
            * (expert_words(gate) + up.map_or(0, expert_words) + expert_words(layer.down()) + 1)
                as u64;
        let limit = ctx.weight_part_bytes();
        let per = (limit / expert_bytes) as usize;
        if per == 0 {
            return Err(Error::Shape(format!(
                "one expert's weights take {expert_bytes} bytes; this adapter binds at most {limit}"
            )));
        }
        let (code, bits, group) = match dtype {
            WeightDtype::F32 => (0, 0, 1),
            WeightDtype::Bf16 => (1, 0, 1),
            WeightDtype::F16 => (2, 0, 1),
            WeightDtype::Affine(q) => (3, q.bits, q.group as u32),
        };
        let base = MoeParams {
            experts: layer.experts() as u32,
            hidden: layer.hidden() as u32,
            inter: layer.intermediate() as u32,
            separate: u32::from(up.is_some()),
            dtype: code,
            bits,
            group,
            ..Default::default()
        };
        let experts = layer.experts();
        let mut parts = Vec::new();
        for e_lo in (0..experts).step_by(per) {
            let e_hi = (e_lo + per).min(experts);
            let mut all = Vec::new();
            let (gw, gs, gb) = push_matrix(&mut all, gate, e_lo, e_hi);
            let (uw, us, ub) = match up {
                Some(u) => push_matrix(&mut all, u, e_lo, e_hi),
                None => (0, 0, 0),
            };
            let (dw, ds, db) = push_matrix(&mut all, layer.down(), e_lo, e_hi);
            // read as vec4<u32>: whole vec4s
            all.resize(all.len().next_multiple_of(4), 0);
            use wgpu::util::DeviceExt;
            let weights = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&format!("decoda moe weights, experts {e_lo}..{e_hi}")),
                contents: bytemuck::cast_slice(&all),
                usage: wgpu::BufferUsages::STORAGE,
            });
            let offsets = MoeParams {
                gate_w: gw,
                gate_s: gs,
                gate_b: gb,
                up_w: uw,
                up_s: us,
                up_b: ub,
                down_w: dw,
                down_s: ds,
                down_b: db,
                e_lo: e_lo as u32,
                e_hi: e_hi as u32,
                ..base
            };
            parts.push((weights, offsets));
        }
        let sg = ctx.device().features().contains(wgpu::Features::SUBGROUP);
        let x4 = layer.hidden().is_multiple_of(4) && layer.intermediate().is_multiple_of(4);
        let pipes = ctx.pipelines(&format!("moe {code} {bits} {group} {sg} {x4}"), || {
            build(&device, ctx.info(), code, bits, group, x4)
        })?;
        // a layer runs many calls: every kernel now, none inside a call
        pipes.build_all();
        use wgpu::BufferUsages as U;
        let st = U::STORAGE | U::COPY_DST | U::COPY_SRC;
        Ok(Self {
            scratch: Mutex::new(Scratch {
                work: Grow::new(&device, "decoda moe work", st),
                acts: Grow::new(&device, "decoda moe activations", st),
                counts: Grow::new(&device, "decoda moe counts", st),
                logits: Grow::new(&device, "decoda moe logits", st),
                x: Grow::new(&device, "decoda moe x", st),
                y: Grow::new(&device, "decoda moe y", st),
                read: Grow::new(&device, "decoda moe read", U::MAP_READ | U::COPY_DST),
            }),
            params_buf: make_params(&device, parts.len()),
            ctx,
            pipes,
            parts,
            experts: layer.experts(),
            hidden: layer.hidden(),
            inter: layer.intermediate(),
            sort_cutoff: layer.sort_cutoff(),
            gate_up_bytes: 4 * (expert_words(gate) + up.map_or(0, expert_words)) as u64,
            down_bytes: 4 * expert_words(layer.down()) as u64,
            calls: Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// The bind group of part `part`'s dispatches, its parameters at `params.1`.
    #[allow(clippy::too_many_arguments)]
    fn group(
        &self,
        params: (&wgpu::Buffer, u64),
        part: usize,
        x: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        work: &wgpu::Buffer,
        acts: &wgpu::Buffer,
        counts: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        self.ctx.device().create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("decoda moe"),
            layout: &self.pipes.binds,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: params.0,
                        offset: params.1,
                        size: std::num::NonZeroU64::new(std::mem::size_of::<MoeParams>() as u64),
                    }),
                },
                entry(1, &self.parts[part].0),
                entry(2, x),
                entry(3, logits),
                entry(4, work),
                entry(5, counts),
                entry(6, y),
                entry(7, acts),
            ],
        })
    }

    /// Compute dispatches a call records: the routing when it is on the device, the
    /// plan's two when sorted; then an unsorted call on a layer in one part runs the
    /// gate/up product and the down product with the combine (2), and otherwise the
    /// gate/up and down products run once per part of the weights (tiled when sorted),
    /// then the combine.
    pub fn dispatches(&self, device_routing: bool, dispatch: Dispatch) -> usize {
        let products = if self.parts.len() == 1 && dispatch == Dispatch::Unsorted {
            // act, then down and combine in one
            2
        } else {
            2 * self.parts.len() + 1
        };
        usize::from(device_routing) + if dispatch == Dispatch::Sorted { 2 } else { 0 } + products
    }

    /// The branch a call with `tokens` tokens takes: sorted iff `tokens > sort_cutoff`.
    pub fn dispatch_for(&self, tokens: usize) -> Dispatch {
        if tokens > self.sort_cutoff {
            Dispatch::Sorted
        } else {
            Dispatch::Unsorted
        }
    }

    /// The call's parameters for each part.
    fn part_params(&self, n: usize, k: usize, dispatch: Dispatch, router: u32) -> Vec<MoeParams> {
        (0..self.parts.len())
            .map(|i| self.params_of(i, n, k, dispatch, router))
            .collect()
    }

    /// The call's parameters (of the first part).
    fn params(&self, n: usize, k: usize, dispatch: Dispatch, router: u32) -> MoeParams {
        self.params_of(0, n, k, dispatch, router)
    }

    /// The call's parameters for part `part` (its weights' offsets and experts).
    fn params_of(
        &self,
        part: usize,
        n: usize,
        k: usize,
        dispatch: Dispatch,
        router: u32,
    ) -> MoeParams {
        let rows = (n * k) as u32;
        let mut p = self.parts[part].1;
        p.tokens = n as u32;
        p.top_k = k as u32;
        p.sorted = u32::from(dispatch == Dispatch::Sorted);
        p.router = router;
        p.w_idx_in = 0;
        p.w_wt = rows;
        p.w_order = 2 * rows;
        p.w_idx = 3 * rows;
        p.w_inv = 4 * rows;
        p.w_off = 5 * rows;
        // (the activations have a buffer of their own, loaded as vec4s)
        p.w_act = 0;
        p.w_out = 5 * rows + self.experts as u32 + 1;
        p.w_tb = p.w_out + rows * self.hidden as u32;
        p.w_tiles = p.w_tb + self.experts as u32 + 1;
        p
    }

    /// Most tiles a sorted call of `rows` (token, expert) rows can have: [`max_tiles`]
    /// over all the layer's experts.
    fn max_tiles(&self, rows: usize) -> usize {
        max_tiles(rows, self.experts)
    }

    /// Records one call into `encoder`: `x [n, D]` f32 (a STORAGE buffer), the routing
    /// (router logits on the device, or one from the host), `y [n, D]` f32 out (STORAGE).
    /// Returns the branch, chosen from `n`. `dispatch` forces one (tests, benchmarks).
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        x: &wgpu::Buffer,
        n: usize,
        routing: MoeRouting<'_>,
        y: &wgpu::Buffer,
        dispatch: Option<Dispatch>,
    ) -> Result<Dispatch> {
        self.record_in(
            &mut Passes::new(encoder, None),
            x,
            n,
            routing,
            y,
            dispatch,
            false,
        )
    }

    /// [`WgpuMoe::record`] into `passes` (one pass, or a profiled pass per dispatch);
    /// with `accumulate`, y += the layer's output (a residual stream) instead of y =.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_in(
        &self,
        passes: &mut Passes<'_>,
        x: &wgpu::Buffer,
        n: usize,
        routing: MoeRouting<'_>,
        y: &wgpu::Buffer,
        dispatch: Option<Dispatch>,
        accumulate: bool,
    ) -> Result<Dispatch> {
        let (k, router) = match routing {
            MoeRouting::Logits { top_k, router, .. } => (
                top_k,
                match router {
                    Router::SoftmaxTopK { renormalize: false } => 0,
                    Router::SoftmaxTopK { renormalize: true } => 1,
                    Router::TopKSoftmax => 2,
                },
            ),
            MoeRouting::Given(r) => {
                if r.tokens != n {
                    return Err(Error::Shape(format!(
                        "a routing of {} tokens for {n} rows of x",
                        r.tokens
                    )));
                }
                crate::moe::check_ids(&r.indices, r.top_k, self.experts)?;
                (r.top_k, 0)
            }
        };
        if k == 0 || k > self.experts {
            return Err(Error::InvalidMoe {
                field: "top_k",
                value: k.to_string(),
                expected: "1 ..= experts",
            });
        }
        let d = self.hidden;
        let need_x = (n * d * 4) as u64;
        if x.size() < need_x || y.size() < need_x {
            return Err(Error::Shape(format!(
                "x and y need {need_x} bytes for [{n}, {d}]; they have {} and {}",
                x.size(),
                y.size()
            )));
        }
        if let MoeRouting::Logits { buffer, .. } = routing {
            if buffer.size() < (n * self.experts * 4) as u64 {
                return Err(Error::Shape(format!(
                    "router logits need {} bytes for [{n}, {}]",
                    n * self.experts * 4,
                    self.experts
                )));
            }
        }
        if n == 0 {
            return Ok(self.dispatch_for(0));
        }
        if n > 65535 {
            return Err(Error::Shape(format!(
                "{n} tokens in one call; at most 65535"
            )));
        }
        let dispatch = dispatch.unwrap_or_else(|| self.dispatch_for(n));
        let p = self.params(n, k, dispatch, router);
        let acc = u32::from(accumulate);
        // the parameter blocks, one per part, at uniform-offset alignment (made only when
        // a call's parameters are new: a kept call makes nothing)
        let param_bytes = || {
            let mut pp = self.part_params(n, k, dispatch, router);
            for q in &mut pp {
                q.accumulate = acc;
            }
            let mut bytes = vec![0u8; pp.len() * PARAM_STRIDE as usize];
            for (i, q) in pp.iter().enumerate() {
                let at = i * PARAM_STRIDE as usize;
                bytes[at..at + std::mem::size_of::<MoeParams>()]
                    .copy_from_slice(bytemuck::bytes_of(q));
            }
            bytes
        };
        let work_words = p.w_tiles as usize + 2 * self.max_tiles(n * k);
        let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
        let limit = self.ctx.device().limits().max_storage_buffer_binding_size;
        if (work_words * 4) as u64 > limit {
            return Err(Error::Shape(format!(
                "{n} tokens need {} bytes of work space; this adapter binds at most {limit}",
                work_words * 4
            )));
        }
        let act_bytes = (4 * n * k * self.inter) as u64;
        if act_bytes > limit {
            return Err(Error::Shape(format!(
                "{n} tokens need {act_bytes} bytes of activations; this adapter binds at most {limit}"
            )));
        }
        let grew = sc.work.ensure(self.ctx.device(), (work_words * 4) as u64)
            | sc.acts.ensure(self.ctx.device(), act_bytes)
            | sc.counts
                .ensure(self.ctx.device(), (self.experts * 4) as u64);
        if grew {
            // a grown buffer is a new buffer: the kept calls' bind groups would compute
            // into the old one, which the host no longer reads (whichever branch grew it)
            self.calls.lock().map_err(|_| poisoned())?.clear();
        }
        let (groups, counts) = match routing {
            // device routing: the parameters and bind group of each (shape, buffers) are
            // made once, so a decode loop writes nothing and creates nothing per call
            MoeRouting::Logits { buffer, .. } => {
                let key = CallKey {
                    n,
                    k,
                    sorted: dispatch == Dispatch::Sorted,
                    router,
                    accumulate,
                    x: x.clone(),
                    logits: buffer.clone(),
                    y: y.clone(),
                };
                let mut cache = self.calls.lock().map_err(|_| poisoned())?;
                if cache.len() >= CALL_CACHE && !cache.contains_key(&key) {
                    cache.clear();
                }
                let entry = cache.entry(key).or_insert_with(|| {
                    use wgpu::util::DeviceExt;
                    let params =
                        self.ctx
                            .device()
                            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                                label: Some("decoda moe call params"),
                                contents: &param_bytes(),
                                usage: wgpu::BufferUsages::UNIFORM,
                            });
                    let groups = (0..self.parts.len())
                        .map(|i| {
                            self.group(
                                (&params, i as u64 * PARAM_STRIDE),
                                i,
                                x,
                                buffer,
                                &sc.work.buf,
                                &sc.acts.buf,
                                &sc.counts.buf,
                                y,
                            )
                        })
                        .collect();
                    (groups, sc.counts.buf.clone())
                });
                entry.clone()
            }
            // a host routing: the parameters and the routing through a staging buffer
            MoeRouting::Given(r) => {
                let mut bytes = param_bytes();
                bytes.extend_from_slice(bytemuck::cast_slice(&r.indices));
                bytes.extend(r.weights.iter().flat_map(|w| w.to_bits().to_le_bytes()));
                let (stage, _) = self
                    .ctx
                    .stages()
                    .take(self.ctx.device(), bytes.len() as u64);
                self.ctx.queue().write_buffer(&stage, 0, &bytes);
                let psize = self.parts.len() as u64 * PARAM_STRIDE;
                let encoder = passes.encoder();
                encoder.copy_buffer_to_buffer(&stage, 0, &self.params_buf, 0, psize);
                let rbytes = (2 * n * k * 4) as u64;
                encoder.copy_buffer_to_buffer(&stage, psize, &sc.work.buf, 0, rbytes);
                self.ctx.stages().release_after(encoder, stage);
                // (no router logits: any read-only buffer)
                let groups = (0..self.parts.len())
                    .map(|i| {
                        self.group(
                            (&self.params_buf, i as u64 * PARAM_STRIDE),
                            i,
                            x,
                            &self.parts[0].0,
                            &sc.work.buf,
                            &sc.acts.buf,
                            &sc.counts.buf,
                            y,
                        )
                    })
                    .collect();
                (groups, sc.counts.buf.clone())
            }
        };
        let rows = n * k;
        if dispatch == Dispatch::Sorted {
            passes
                .encoder()
                .clear_buffer(&counts, 0, Some((self.experts * 4) as u64));
        }
        let (e, d64, h64) = (self.experts as u64, d as u64, self.inter as u64);
        let (n64, rows64) = (n as u64, rows as u64);
        let g0 = &groups[0];
        let launch = |kernel: &str, grid: (usize, usize), read: u64, written: u64| Launch {
            kernel: format!("moe.{kernel}"),
            workgroups: (grid.0 * grid.1) as u64,
            bytes_read: read,
            bytes_written: written,
        };
        let mut run = |group: &wgpu::BindGroup,
                       pipe: &wgpu::ComputePipeline,
                       grid: (usize, usize),
                       plan: &dyn Fn() -> Launch| {
            passes.dispatch(pipe, group, (grid.0 as u32, grid.1 as u32), plan);
        };
        if let MoeRouting::Logits { .. } = routing {
            // one workgroup a token
            let grid = (n, 1);
            run(g0, self.pipes.get(ROUTE), grid, &|| {
                launch("route", grid, 4 * n64 * e, 8 * rows64)
            });
        }
        if dispatch == Dispatch::Sorted {
            let grid = (rows.div_ceil(256), 1);
            run(g0, self.pipes.get(COUNT), grid, &|| {
                launch("count", grid, 4 * rows64, 4 * rows64)
            });
            // every workgroup walks the whole routing; the tile table too
            let grid = (self.experts, 1);
            let tiles = self.max_tiles(rows) as u64;
            run(g0, self.pipes.get(PLACE), grid, &|| {
                launch(
                    "place",
                    grid,
                    4 * rows64 * (e + 1),
                    12 * rows64 + 8 * (e + 1) + 8 * tiles,
                )
            });
        }
        // the products part by part: each dispatch computes the rows of its experts (a
        // part's share of the rows, in the plan, is its share of the experts); an unsorted
        // call on a layer in one part combines in its down dispatch; a sorted call runs
        // the tiled products (an expert's weights read once per TILE_ROWS of its rows)
        let sorted = dispatch == Dispatch::Sorted;
        let fused = self.parts.len() == 1 && !sorted;
        for (g, (_, p)) in groups.iter().zip(&self.parts) {
            let part_e = u64::from(p.e_hi - p.e_lo);
            let share = |b: u64| b * part_e / e;
            if sorted {
                // enough tiles for any routing: the sum over the part's experts of
                // ceil(rows_e / 32)
                let tiles = max_tiles(rows, part_e as usize);
                // the tiles a routing spread evenly over the part's experts reads
                let expect = |per: u64| {
                    let rows_p = share(rows64).max(1);
                    let per_e = rows_p.div_ceil(part_e.max(1));
                    part_e.min(rows_p) * per_e.div_ceil(TILE_ROWS as u64) * per
                };
                let grid = flat_grid(self.inter.div_ceil(4) * tiles);
                run(g, self.pipes.get(ACT_TILED), grid, &|| {
                    let read = expect(self.gate_up_bytes) + share(4 * rows64) + 4 * n64 * d64;
                    launch("act_tiled", grid, read, share(4 * rows64 * h64))
                });
                let grid = flat_grid(d.div_ceil(8) * tiles);
                run(g, self.pipes.get(DOWN_TILED), grid, &|| {
                    let read = expect(self.down_bytes) + share(4 * rows64 * (h64 + 1));
                    launch("down_tiled", grid, read, share(4 * rows64 * d64))
                });
                continue;
            }
            let grid = flat_grid(self.inter.div_ceil(4) * rows);
            run(g, self.pipes.get(ACT), grid, &|| {
                // each row streams its expert's gate and up rows; x once
                let read = share(rows64 * self.gate_up_bytes + 4 * rows64) + 4 * n64 * d64;
                launch("act", grid, read, share(4 * rows64 * h64))
            });
            if fused {
                let grid = flat_grid(d.div_ceil(4) * n);
                run(g, self.pipes.get(DOWN_COMBINE), grid, &|| {
                    let read =
                        rows64 * (self.down_bytes + 4 * h64 + 8) + acc as u64 * 4 * n64 * d64;
                    launch("down_combine", grid, read, 4 * n64 * d64)
                });
            } else {
                let grid = flat_grid(d.div_ceil(4) * rows);
                run(g, self.pipes.get(DOWN), grid, &|| {
                    let read = share(rows64 * self.down_bytes + 4 * rows64 * (h64 + 1));
                    launch("down", grid, read, share(4 * rows64 * d64))
                });
            }
        }
        if !fused {
            let grid = (d.div_ceil(256), n);
            run(g0, self.pipes.get(COMBINE), grid, &|| {
                let read = 4 * rows64 * (d64 + 2) + acc as u64 * 4 * n64 * d64;
                launch("combine", grid, read, 4 * n64 * d64)
            });
        }
        drop(sc);
        Ok(dispatch)
    }

    /// Profiles one call with a routing from the host (`moe-bench --profile`): uploads x
    /// and the routing, records the call with each dispatch in a pass of its own between
    /// timestamps, and returns every dispatch with its plan and device time.
    #[doc(hidden)]
    pub fn profile_call(
        &self,
        x: &[f32],
        routing: &Routing,
        dispatch: Dispatch,
    ) -> Result<Vec<crate::profile::DispatchTime>> {
        let n = x.len() / self.hidden.max(1);
        let (xb, yb) = {
            let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
            sc.x.ensure(self.ctx.device(), (x.len().max(1) * 4) as u64);
            sc.y.ensure(self.ctx.device(), (x.len().max(1) * 4) as u64);
            (sc.x.buf.clone(), sc.y.buf.clone())
        };
        self.ctx
            .queue()
            .write_buffer(&xb, 0, bytemuck::cast_slice(x));
        let mut prof = Profiler::new(&self.ctx);
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&Default::default());
        let mut passes = Passes::new(&mut enc, Some(&mut prof));
        self.record_in(
            &mut passes,
            &xb,
            n,
            MoeRouting::Given(routing),
            &yb,
            Some(dispatch),
            false,
        )?;
        drop(passes);
        prof.resolve(&mut enc);
        self.ctx.queue().submit([enc.finish()]);
        prof.finish(&self.ctx)
    }

    /// Host inputs in, results out: uploads x (and router logits), records, submits and
    /// reads back y, and the plan and routing the device used.
    fn run_host(
        &self,
        x: &[f32],
        routing: HostRouting<'_>,
        dispatch: Option<Dispatch>,
    ) -> Result<(MoeOutput, Routing, DispatchPlan)> {
        let d = self.hidden;
        if !x.len().is_multiple_of(d) {
            return Err(Error::Shape(format!(
                "x holds {} values, not rows of D = {d}",
                x.len()
            )));
        }
        let n = x.len() / d;
        let k = match routing {
            HostRouting::Logits { top_k, .. } => top_k,
            HostRouting::Given(r) => r.top_k,
        };
        let (xb, yb, lb) = {
            let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
            sc.x.ensure(self.ctx.device(), (x.len().max(1) * 4) as u64);
            sc.y.ensure(self.ctx.device(), (x.len().max(1) * 4) as u64);
            if let HostRouting::Logits { logits, .. } = routing {
                sc.logits
                    .ensure(self.ctx.device(), (logits.len().max(1) * 4) as u64);
            }
            (sc.x.buf.clone(), sc.y.buf.clone(), sc.logits.buf.clone())
        };
        self.ctx
            .queue()
            .write_buffer(&xb, 0, bytemuck::cast_slice(x));
        if let HostRouting::Logits { logits, .. } = routing {
            self.ctx
                .queue()
                .write_buffer(&lb, 0, bytemuck::cast_slice(logits));
        }
        let rows = n * k;
        let (taken, read, total) = self.ctx.submit_checked(|enc| {
            let taken = match routing {
                HostRouting::Logits { top_k, router, .. } => self.record(
                    enc,
                    &xb,
                    n,
                    MoeRouting::Logits {
                        buffer: &lb,
                        top_k,
                        router,
                    },
                    &yb,
                    dispatch,
                )?,
                HostRouting::Given(r) => {
                    self.record(enc, &xb, n, MoeRouting::Given(r), &yb, dispatch)?
                }
            };
            let p = self.params(n, k, taken, 0);
            // read back y, the routing and the plan
            let parts = [
                (yb.clone(), 0u64, (n * d * 4) as u64),
                (self.work_buf()?, 0, (5 * rows * 4) as u64),
                (
                    self.work_buf()?,
                    (p.w_off as u64) * 4,
                    ((self.experts + 1) * 4) as u64,
                ),
            ];
            let total: u64 = parts.iter().map(|p| p.2).sum();
            let read = {
                let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
                sc.read.ensure(self.ctx.device(), total.max(4));
                sc.read.buf.clone()
            };
            let mut at = 0;
            for (buf, off, len) in &parts {
                if *len > 0 {
                    enc.copy_buffer_to_buffer(buf, *off, &read, at, *len);
                }
                at += len;
            }
            Ok((taken, read, total))
        })?;
        let words: Vec<u32> = self.ctx.read_back(&read, total)?;
        let y: Vec<f32> = words[..n * d].iter().map(|&w| f32::from_bits(w)).collect();
        let w = &words[n * d..];
        let routing = Routing {
            tokens: n,
            top_k: k,
            indices: w[..rows].to_vec(),
            weights: w[rows..2 * rows]
                .iter()
                .map(|&v| f32::from_bits(v))
                .collect(),
        };
        let plan = match taken {
            Dispatch::Sorted => DispatchPlan {
                dispatch: taken,
                top_k: k,
                order: w[2 * rows..3 * rows].to_vec(),
                idx: w[3 * rows..4 * rows].to_vec(),
                inv_order: w[4 * rows..5 * rows].to_vec(),
                offsets: w[5 * rows..5 * rows + self.experts + 1].to_vec(),
            },
            Dispatch::Unsorted => {
                DispatchPlan::new(&routing.indices, k, self.experts, Dispatch::Unsorted)?
            }
        };
        Ok((MoeOutput { y, dispatch: taken }, routing, plan))
    }

    fn work_buf(&self) -> Result<wgpu::Buffer> {
        Ok(self
            .scratch
            .lock()
            .map_err(|_| poisoned())?
            .work
            .buf
            .clone())
    }

    /// The plan the device built for a call (a test hook: it reruns the call).
    #[doc(hidden)]
    pub fn device_plan(
        &self,
        x: &[f32],
        routing: &Routing,
        dispatch: Dispatch,
    ) -> Result<DispatchPlan> {
        Ok(self
            .run_host(x, HostRouting::Given(routing), Some(dispatch))?
            .2)
    }
}

#[derive(Clone, Copy)]
enum HostRouting<'a> {
    Logits {
        logits: &'a [f32],
        top_k: usize,
        router: Router,
    },
    Given(&'a Routing),
}

fn entry(binding: u32, buf: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buf.as_entire_binding(),
    }
}

/// Bytes between the parameter blocks of a call's parts (uniform offset alignment).
const PARAM_STRIDE: u64 = 256;

fn make_params(device: &wgpu::Device, parts: usize) -> wgpu::Buffer {
    make_buffer(
        device,
        "decoda moe params",
        parts as u64 * PARAM_STRIDE,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    )
}

fn build(
    device: &wgpu::Device,
    info: &wgpu::AdapterInfo,
    dtype: u32,
    bits: u32,
    group: u32,
    x4: bool,
) -> Result<Pipes> {
    use super::device::Bind::*;
    lazy_pipelines(
        device,
        "decoda moe.wgsl",
        moe_shader_source_with(
            dtype,
            bits,
            group,
            device.features().contains(wgpu::Features::SUBGROUP),
            x4,
        ),
        &[Uniform, Read, Read, Read, Write, Write, Write, Write],
        [
            "route",
            "count",
            "place",
            "act",
            "down",
            "combine",
            "down_combine",
            "act_tiled",
            "down_tiled",
        ],
        &format!("{}: building the MoE shaders failed", info.name),
    )
}

impl MoeLayer for WgpuMoe {
    fn name(&self) -> String {
        format!("wgpu:{}", self.ctx.adapter_name())
    }

    fn dims(&self) -> (usize, usize, usize) {
        (self.experts, self.hidden, self.inter)
    }

    fn sort_cutoff(&self) -> usize {
        self.sort_cutoff
    }

    fn forward_with(&self, x: &[f32], routing: &Routing, dispatch: Dispatch) -> Result<MoeOutput> {
        if Some(x.len()) != routing.tokens.checked_mul(self.hidden) {
            return Err(Error::Shape(format!(
                "x holds {} values, but [N={}, D={}] needs {}",
                x.len(),
                routing.tokens,
                self.hidden,
                routing.tokens.saturating_mul(self.hidden)
            )));
        }
        Ok(self
            .run_host(x, HostRouting::Given(routing), Some(dispatch))?
            .0)
    }

    fn route_forward(
        &self,
        x: &[f32],
        router_logits: &[f32],
        top_k: usize,
        router: Router,
    ) -> Result<(Routing, MoeOutput)> {
        // the same checks as the CPU's route (the device does not see bad values)
        crate::moe::route_with(router_logits, self.experts, top_k, router)?;
        let (out, routing, _) = self.run_host(
            x,
            HostRouting::Logits {
                logits: router_logits,
                top_k,
                router,
            },
            None,
        )?;
        Ok((routing, out))
    }
}

#[cfg(test)]
mod tests {
    use super::{max_tiles, TILE_ROWS};

    /// The most tiles of every way to route `rows` rows among `experts` experts (counts
    /// per expert, each ceil(count / TILE_ROWS) tiles): every split, by dynamic
    /// programming over the experts.
    fn most_tiles(rows: usize, experts: usize) -> usize {
        // best[r]: the most tiles r rows make among the experts so far
        let mut best: Vec<usize> = (0..=rows).map(|r| r.div_ceil(TILE_ROWS)).collect();
        for _ in 1..experts {
            best = (0..=rows)
                .map(|r| {
                    (0..=r)
                        .map(|c| c.div_ceil(TILE_ROWS) + best[r - c])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
        }
        best[rows]
    }

    /// The grid's bound holds every routing's tiles and is the most one can have, so
    /// no routing's tile goes without a workgroup and no workgroup is spent beyond it.
    #[test]
    fn max_tiles_is_the_most_any_routing_makes() {
        for experts in 1..=9 {
            for rows in (0..=70).chain([95, 96, 97, 128, 129, 300]) {
                assert_eq!(
                    max_tiles(rows, experts),
                    most_tiles(rows, experts),
                    "rows {rows}, experts {experts}"
                );
            }
        }
        // the decode shapes the bound is for: one token of k = 8 at E = 128
        assert_eq!(max_tiles(8, 128), 8);
        assert_eq!(max_tiles(512, 16), (512 + 31 * 16) / 32);
    }
}
