//! The step kernels' host side: pipelines, the buffers they bind, and the fixed dispatch
//! sequence of one step (`step/`, a WGSL file per pass).

use crate::error::Result;

use super::buffers::{make_buffer, Grow};
use super::device::{lazy_pipelines, Pipelines, WgpuDevice};
use super::layout::*;

/// The step kernels' entry points, in the order of [`Kernels::pipes`].
const ENTRIES: [&str; 20] = [
    "join",
    "wipe",
    "probe",
    "scan",
    "settle",
    "lp",
    "finish",
    "settle_finish",
    "draw_many",
    "draw_finish",
    "settle_light",
    "draw_finish_light",
    "settle_finish_light",
    "scan_light",
    "walk",
    "decide",
    "sample",
    "pick",
    "settle_first",
    "settle_rest",
];

/// The stage entry point `e` runs as (the names `Kernels::grid` gives): a light call's
/// `settle_light` is its `settle`, and so on.
fn stage_name(e: Entry) -> &'static str {
    ENTRIES[e as usize].trim_end_matches("_light")
}

/// An entry point of `step/`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Entry {
    Join = 0,
    Wipe,
    Probe,
    Scan,
    Settle,
    Lp,
    Finish,
    SettleFinish,
    DrawMany,
    DrawFinish,
    SettleLight,
    DrawFinishLight,
    SettleFinishLight,
    ScanLight,
    Walk,
    Decide,
    Sample,
    Pick,
    SettleFirst,
    SettleRest,
}

/// The compute pipelines, one per entry point of `step/`, each built at its first use.
pub(crate) struct Kernels {
    pub pipes: Pipelines<20>,
    /// The probe samples a row in pieces ([`super::WgpuDevice::samples_in_pieces`]).
    pub pieces: bool,
    /// `settle_finish` as one dispatch ([`super::WgpuDevice::fuses_settle`]).
    pub fused: bool,
    /// The bind group layout of every step kernel.
    pub layout: wgpu::BindGroupLayout,
    /// Bound as `masks` by calls without a token mask (one word, never read).
    pub no_mask: wgpu::Buffer,
}

impl Kernels {
    /// Compiles the module (with subgroup reductions when the device has the feature,
    /// and Philox's products in 64-bit integers when it has `SHADER_INT64`); its
    /// pipelines are built as calls first need them. A shader error is
    /// [`Error::Device`].
    fn build(
        device: &wgpu::Device,
        info: &wgpu::AdapterInfo,
        fused: bool,
        pieces: bool,
    ) -> Result<Self> {
        use super::device::Bind::*;
        let subgroups = device.features().contains(wgpu::Features::SUBGROUP);
        let int64 = device.features().contains(wgpu::Features::SHADER_INT64);
        let pipes = lazy_pipelines(
            device,
            "decoda step",
            super::shaders::shader_source_with(subgroups, int64),
            // call, logits, sparams, sstate, rmap, pen, lists, work, ctr, tokens, results,
            // masks
            &[
                Uniform, Read, Read, Write, Read, Write, Read, Write, Write, Write, Write, Read,
            ],
            ENTRIES,
            &format!("{}: building the shaders failed", info.name),
        )?;
        let no_mask =
            super::buffers::make_buffer(device, "decoda no mask", 4, wgpu::BufferUsages::STORAGE);
        Ok(Self {
            layout: pipes.binds.clone(),
            pipes,
            pieces,
            fused,
            no_mask,
        })
    }

    /// The step kernels of `ctx`'s device: checked against its limits, compiled once per
    /// device and shared by every sampler and head made from it.
    pub fn of(ctx: &WgpuDevice) -> Result<std::sync::Arc<Self>> {
        super::adapter::check_limits(ctx.device(), ctx.info())?;
        ctx.pipelines("sampler", || {
            Self::build(
                ctx.device(),
                ctx.info(),
                ctx.fuses_settle(),
                ctx.samples_in_pieces(),
            )
        })
    }

    /// Builds the pipelines of a head step whose plan is `plan` (one without draws), and
    /// the head's join and wipe: a head builds the light plan's when it is made and a
    /// slot's plan's when the slot joins or changes its parameters, so no step builds
    /// one (a call's plan is its rows' largest, one a slot already built).
    pub fn build_for(&self, plan: Plan) {
        self.pipe(Entry::Join);
        self.pipe(Entry::Wipe);
        let shape = StepShape {
            rows: 1,
            splits: 1,
            draw_groups: 0,
            plan,
            phases: 0,
            sample_parts: 1,
            vocab: CAP + 1,
        };
        for (e, ..) in self.stages(shape) {
            self.pipe(e);
        }
    }

    /// How the probe's sample passes cut a row of `v` logits whose scan pieces are
    /// `chunk` logits: (pieces, logits a piece, a multiple of 256). In pieces
    /// ([`super::WgpuDevice::samples_in_pieces`], hardware adapters by default) the
    /// scan's, at least 4,096 logits (a piece's 256 sampled tokens against its 2,048
    /// bins); else the whole row (one workgroup: lavapipe pays per workgroup, not per
    /// token). The results do not depend on it.
    pub fn sample_split(&self, v: usize, chunk: usize) -> (usize, usize) {
        let c = if self.pieces {
            chunk.max(4096).next_multiple_of(256)
        } else {
            v.next_multiple_of(256)
        };
        (v.div_ceil(c).max(1), c)
    }

    /// Entry point `e`'s pipeline (built at its first use).
    pub fn pipe(&self, e: Entry) -> &wgpu::ComputePipeline {
        self.pipes.get(e as usize)
    }

    /// The dispatches of a step of `shape`, in order: (entry point, grid x, grid y, and
    /// for a dispatch whose grid the step computes, the byte offset of its grid in
    /// [`StepBuffers::ind`]: `x` and `y` are then the most it can be).
    /// (No allocation: a sampling call records these.)
    fn stages(&self, shape: StepShape) -> impl Iterator<Item = Stage> + Clone {
        let (b, w) = (shape.rows as u32, shape.splits as u32);
        let full = shape.plan == Plan::Full;
        let fused = !full && self.fused;
        // a light call runs the light entry points: the same results from far less code
        let light = shape.plan == Plan::Light;
        // a lean call's rows on the full-row path are drawn by lp's workgroups and
        // finished after, over grids settle counts (none when no row took the path)
        let lean = shape.plan == Plan::Lean;
        let pick = |e: Entry, l: Entry| if light { l } else { e };
        // where the device does not fuse settle_finish (software adapters), settle is two
        // dispatches too: `settle_first`, then `settle_rest` for the rows whose candidate
        // list may settle them (the same code in two halves, each far faster to build)
        let split = !self.fused && !light;
        let sp = shape.sample_parts as u32;
        // the probe's second sample and pick: only for rows longer than the list holds
        // (`pick` gives a row the list holds whole its threshold at the first)
        let again = !light && shape.vocab > CAP;
        // up to settle, or settle_finish or draw_finish in a lean call
        let head = [
            (!light).then_some((Entry::Probe, b, 1, None)),
            (!light).then_some((Entry::Sample, sp, b, None)),
            (!light).then_some((Entry::Pick, b, 1, None)),
            again.then_some((Entry::Sample, sp, b, None)),
            again.then_some((Entry::Pick, b, 1, None)),
            Some((pick(Entry::Scan, Entry::ScanLight), w, b, None)),
            (!fused && !split).then_some((pick(Entry::Settle, Entry::SettleLight), b, 1, None)),
            split.then_some((Entry::SettleFirst, b, 1, None)),
            split.then_some((Entry::SettleRest, b, 1, None)),
            fused.then_some((
                pick(Entry::SettleFinish, Entry::SettleFinishLight),
                b,
                1,
                None,
            )),
            (!full && !fused).then_some((
                pick(Entry::DrawFinish, Entry::DrawFinishLight),
                b,
                1,
                None,
            )),
        ];
        // the full-row path's phases (step/walk.wgsl), over the rows settle sent down it:
        // a piece of each such row, then each such row
        let phases = (0..shape.phases).flat_map(move |_| {
            [
                (Entry::Walk, w, b, Some(0)),
                (Entry::Decide, b, 1, Some(12)),
            ]
        });
        let tail = [
            (full && shape.draw_groups > 0).then_some((
                Entry::DrawMany,
                shape.draw_groups as u32,
                b,
                None,
            )),
            (full || lean).then_some((Entry::Lp, w, b, lean.then_some(0))),
            (full || lean).then_some((Entry::Finish, b, 1, lean.then_some(12))),
        ];
        head.into_iter()
            .flatten()
            .chain(phases)
            .chain(tail.into_iter().flatten())
    }

    /// How many dispatches a step of `shape` records.
    pub fn dispatches(&self, shape: StepShape) -> usize {
        self.stages(shape).count()
    }

    /// The dispatches of a step of `shape`, in order: (entry point's name, workgroups; at
    /// most that many for the grids the step computes).
    pub fn grid(&self, shape: StepShape) -> Vec<(&'static str, u64)> {
        self.stages(shape)
            .map(|(e, x, y, _)| (stage_name(e), u64::from(x) * u64::from(y)))
            .collect()
    }

    /// Records one step into `passes` (a profiled pass per dispatch when they profile),
    /// each stage's plan from `row_bytes`, the bytes of one row of logits: the passes
    /// that walk the rows (probe, scan, lp) read each row once; the others read and
    /// write the rows' state and results (counted as 256 bytes a row).
    pub fn record_step_in(
        &self,
        passes: &mut super::profile::Passes<'_>,
        group: &wgpu::BindGroup,
        bufs: &StepBuffers,
        shape: StepShape,
        row_bytes: u64,
    ) {
        let rows = shape.rows as u64;
        let mut copied = false;
        for (e, x, y, ind) in self.stages(shape) {
            let plan = || {
                // the scan and lp read the rows, a sample pass a sixteenth of them
                let walked = match e {
                    Entry::Scan | Entry::Lp => rows * row_bytes,
                    Entry::Sample => rows * row_bytes / 16,
                    _ => 0,
                };
                crate::profile::Launch {
                    kernel: format!("sample.{}", stage_name(e)),
                    workgroups: u64::from(x) * u64::from(y),
                    bytes_read: 256 * rows + walked,
                    bytes_written: 256 * rows,
                }
            };
            match ind {
                None => passes.dispatch(self.pipe(e), group, (x, y), plan),
                Some(at) => {
                    if !copied {
                        bufs.copy_grids(passes.encoder());
                        copied = true;
                    }
                    passes.dispatch_indirect(self.pipe(e), group, &bufs.ind, at, plan);
                }
            }
        }
    }

    /// Records one step, the passes of `shape` ([`Kernels::grid`]) in one compute
    /// pass, with timestamps around it ([`StepStamps::Step`]); or, to profile it, each
    /// stage in a pass of its own with timestamps around each ([`StepStamps::Stages`]).
    pub fn record_step(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        group: &wgpu::BindGroup,
        bufs: &StepBuffers,
        shape: StepShape,
        stamps: StepStamps<'_>,
    ) {
        let stages = self.stages(shape);
        // the stages whose grids the step computes run after a copy of them, in a pass
        // of their own
        let two = stages.clone().any(|s| s.3.is_some());
        // timestamps: (query set, index before, index after) of each pass
        let pass_with =
            |encoder: &mut wgpu::CommandEncoder,
             q: Option<(&wgpu::QuerySet, Option<u32>, Option<u32>)>| {
                encoder
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("decoda step"),
                        timestamp_writes: q.map(|(q, a, b)| wgpu::ComputePassTimestampWrites {
                            query_set: q,
                            beginning_of_pass_write_index: a,
                            end_of_pass_write_index: b,
                        }),
                    })
                    .forget_lifetime()
            };
        let dispatch = |pass: &mut wgpu::ComputePass<'_>, (e, x, y, ind): Stage| {
            pass.set_bind_group(0, group, &[]);
            pass.set_pipeline(self.pipe(e));
            match ind {
                Some(at) => pass.dispatch_workgroups_indirect(&bufs.ind, at),
                None => pass.dispatch_workgroups(x, y, 1),
            }
        };
        let mut copied = false;
        match stamps {
            StepStamps::Stages(q) => {
                for (i, s) in stages.enumerate() {
                    if s.3.is_some() && !copied {
                        bufs.copy_grids(encoder);
                        copied = true;
                    }
                    let i = 2 * i as u32;
                    let mut pass = pass_with(encoder, Some((q, Some(i), Some(i + 1))));
                    dispatch(&mut pass, s);
                }
            }
            StepStamps::None | StepStamps::Step(_) => {
                let q = match stamps {
                    StepStamps::Step(q) => Some(q),
                    _ => None,
                };
                let mut pass = pass_with(encoder, q.map(|q| (q, Some(0), (!two).then_some(1))));
                for s in stages {
                    if s.3.is_some() && !copied {
                        // the first pass ends before the copy
                        drop(pass);
                        bufs.copy_grids(encoder);
                        copied = true;
                        pass = pass_with(encoder, q.map(|q| (q, None, Some(1))));
                    }
                    dispatch(&mut pass, s);
                }
            }
        }
    }
}

/// One dispatch of a step: entry point, grid x, grid y, and for a dispatch whose grid
/// the step computes, its grid's byte offset in [`StepBuffers::ind`].
type Stage = (Entry, u32, u32, Option<u64>);

/// Where a step writes timestamps.
#[derive(Clone, Copy)]
pub(crate) enum StepStamps<'a> {
    /// Nowhere.
    None,
    /// Before and after the step's compute pass: queries 0 and 1 of the set.
    Step(&'a wgpu::QuerySet),
    /// Before and after each stage, recorded in a pass of its own: queries `2i` and
    /// `2i + 1` for the `i`-th stage of the call's [`Kernels::grid`].
    Stages(&'a wgpu::QuerySet),
}

/// Which passes a call records. The host chooses it from the rows' parameters, never
/// from the logits, so a call's dispatches are known before it runs; the results are
/// the same whichever plan runs (the conformance suites run every plan against the
/// reference: rows with log-probabilities take `Full`, rows without take the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No row has filters, log-probabilities, a history to scatter or draws: `scan`,
    /// then `settle_finish` (2 dispatches, 1 read of each row). Where the device does
    /// not fuse them ([`super::WgpuDevice::fuses_settle`]: software adapters),
    /// `settle_finish` is `settle` then `draw_finish`, the same code in two dispatches.
    /// Its stages run entry points of their own (`scan_light`, `settle_light`,
    /// `draw_finish_light`, `settle_finish_light`): the scan without the list and the
    /// sums, then the status, the scan's winner and the results, without the filters'
    /// code.
    Light,
    /// No row wants log-probabilities or draws: `probe`, `scan`, `settle_finish`, `lp`,
    /// `finish` (5, or 7 unfused: `settle_first`, `settle_rest`, `draw_finish`).
    /// `settle_finish` finishes
    /// every row its candidates settle; a row on the full-row path is drawn by `lp`'s
    /// workgroups (a row's splits, as the scan's) and finished by `finish`, whose
    /// workgroups leave every other row alone (`M_LEAN`).
    Lean,
    /// `probe`, `scan`, `settle`, [`draw_many`], `lp`, `finish` (5, or 6 with draws).
    /// Where the device does not fuse `settle_finish`, `settle` is two dispatches:
    /// `settle_first`, then `settle_rest` for the rows whose candidate list may settle them
    /// (the same functions, each half far faster for a software adapter to build).
    Full,
}

/// A row's part in choosing the [`Plan`]: its `SlotU.flags` and temperature.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RowNeeds {
    /// Top-k, top-p, min-p, top-n-σ, typical-p, XTC or the kept distribution at a
    /// temperature that samples (the probe builds their candidate list; XTC's only when
    /// its coin fires, which the probe draws).
    pub filtered: bool,
    /// Log-probabilities asked for.
    pub logprobs: bool,
    /// DRY (stage 3a), which the probe computes.
    pub dry: bool,
    /// The full-row path's phases the row runs when its candidates cannot settle it
    /// (step/walk.wgsl): one for top-n-σ (its sums, when the scan could not make
    /// them), three for top-k, four for typical-p (its sums, when the scan did not make
    /// them, and three levels), three for top-p, two for XTC, five for the kept
    /// distribution (three levels, the ties by piece, the gather).
    pub phases: usize,
}

/// The full-row path's phases a call records: its rows' most ([`RowNeeds::phases`]), as
/// each row moves on by one phase a phase. With no row on the path they run no
/// workgroup.
pub(crate) fn phases(rows: impl IntoIterator<Item = RowNeeds>) -> usize {
    rows.into_iter().map(|r| r.phases).max().unwrap_or(0)
}

impl RowNeeds {
    /// From a row's flags and temperature (a row below the greedy cut-off is greedy
    /// whatever its filters, as the kernels' `cold` says).
    pub fn of(flags: u32, temperature: f32) -> Self {
        let on = |f: u32| usize::from(flags & f != 0 && temperature >= 1e-5);
        Self {
            phases: on(F_TOP_N_SIGMA)
                + 3 * on(F_TOP_K)
                + 4 * on(F_TYPICAL)
                + 3 * on(F_TOP_P)
                + 2 * on(F_XTC)
                + 5 * on(F_KEPT),
            filtered: flags
                & (F_TOP_K | F_TOP_P | F_MIN_P | F_TOP_N_SIGMA | F_TYPICAL | F_XTC | F_KEPT)
                != 0
                && temperature >= 1e-5,
            logprobs: flags & F_LOGPROBS != 0,
            dry: flags & F_DRY != 0,
        }
    }
}

impl Plan {
    /// The plan for rows with these needs; `scatter`: per-call rows write their history
    /// into the penalty areas first (the probe does); `draws`: many draws per row.
    pub fn of(rows: impl IntoIterator<Item = RowNeeds>, scatter: bool, draws: bool) -> Self {
        let (mut filtered, mut logprobs) = (false, false);
        for r in rows {
            filtered |= r.filtered || r.dry;
            logprobs |= r.logprobs;
        }
        if logprobs || draws {
            Plan::Full
        } else if filtered || scatter {
            Plan::Lean
        } else {
            Plan::Light
        }
    }

    /// `Call.mode` bits of the plan.
    pub fn mode(self) -> u32 {
        match self {
            Plan::Light => M_LIGHT,
            Plan::Lean => M_LEAN,
            Plan::Full => 0,
        }
    }

    /// Reads of a row's logits on the common path: the scan's one, the probe's sample
    /// (1/16 of the row, read at most twice), and lp's for a row with `logprobs` under
    /// `Full`. A row whose candidates cannot settle it (the full-row path) reads more.
    pub fn row_reads(self, logprobs: bool) -> f64 {
        let probe = if self == Plan::Light { 0.0 } else { 2.0 / 16.0 };
        let lp = if self == Plan::Full && logprobs {
            1.0
        } else {
            0.0
        };
        1.0 + probe + lp
    }
}

/// The grid of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepShape {
    pub rows: usize,
    pub splits: usize,
    /// Workgroups of `draw_many` (0: none).
    pub draw_groups: usize,
    /// The passes recorded.
    pub plan: Plan,
    /// The full-row path's phases recorded after settle ([`phases`]).
    pub phases: usize,
    /// Workgroups of a row in the probe's sample passes ([`Kernels::sample_split`]).
    pub sample_parts: usize,
    /// Logits a row. At most [`CAP`] (the candidate list holds every row whole), the
    /// probe's first pick settles every row, so its second sample and pick are not
    /// recorded (their workgroups would do nothing).
    pub vocab: usize,
}

/// How a row of `v` logits is cut among workgroups for a batch of `b` rows: enough
/// pieces to keep about `target` workgroups busy, none smaller than `min_chunk` logits
/// or over [`MAX_CHUNK`], at most [`MAX_SPLITS`]. Results do not depend on it.
pub(crate) fn split(v: usize, b: usize, target: usize, min_chunk: usize) -> (usize, usize) {
    let by_size = v.div_ceil(min_chunk.max(4)).max(1);
    let by_batch = target.div_ceil(b.max(1)).max(1);
    let mut splits = by_size
        .min(by_batch)
        .max(v.div_ceil(MAX_CHUNK))
        .clamp(1, MAX_SPLITS);
    let chunk = v.div_ceil(splits).next_multiple_of(4).max(4);
    splits = v.div_ceil(chunk).max(1);
    (splits, chunk)
}

/// Invocations sharing one draw of `draw_many` for rows of `v` logits.
pub(crate) fn draw_lanes(v: usize) -> usize {
    v.div_ceil(4)
        .div_ceil(DRAW_GROUPS_PER_LANE)
        .next_power_of_two()
        .clamp(1, DRAW_WG)
}

/// The buffers a step binds besides the logits and the outputs, grown on demand.
pub(crate) struct StepBuffers {
    pub call: wgpu::Buffer,
    pub sparams: Grow,
    pub sstate: Grow,
    pub rmap: Grow,
    pub pen: Grow,
    pub lists: Grow,
    pub work: Grow,
    pub ctr: Grow,
    /// The grids of the dispatches whose size the step computes (a lean call's tail),
    /// copied from `ctr` before they run ([`IND_ARGS`] words).
    pub ind: wgpu::Buffer,
    /// Bumped whenever a buffer is replaced (bind groups made before are then stale).
    pub generation: u64,
}

impl StepBuffers {
    pub fn new(device: &wgpu::Device) -> Self {
        use wgpu::BufferUsages as U;
        let st = U::STORAGE | U::COPY_DST;
        Self {
            call: make_buffer(
                device,
                "decoda call",
                std::mem::size_of::<CallU>() as u64,
                U::UNIFORM | U::COPY_DST,
            ),
            sparams: Grow::new(device, "decoda slot params", st),
            sstate: Grow::new(device, "decoda slot state", st),
            rmap: Grow::new(device, "decoda row slots", st),
            pen: Grow::new(device, "decoda penalties", st),
            lists: Grow::new(device, "decoda lists", st | U::COPY_SRC),
            // (COPY_SRC: `WgpuSampler::full_row_rows` reads the rows' paths)
            work: Grow::new(device, "decoda work", st | U::COPY_SRC),
            // (COPY_SRC: the grids the step computes, copied to `ind`)
            ctr: Grow::new(device, "decoda counters", st | U::COPY_SRC),
            ind: make_buffer(
                device,
                "decoda step grids",
                (IND_ARGS * 4) as u64,
                U::INDIRECT | U::COPY_DST,
            ),
            generation: 0,
        }
    }

    /// Records the copy of the grids a step computed (`ctr`'s first words) into
    /// [`Self::ind`], between the passes that write and read them.
    pub fn copy_grids(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.copy_buffer_to_buffer(&self.ctr.buf, 0, &self.ind, 0, (IND_ARGS * 4) as u64);
    }

    /// Makes every per-row buffer big enough for `rows` rows cut in `splits`, `slots`
    /// slot entries, `pens` penalty areas of rows of `vocab`, and `list_words` words of
    /// lists; true when some buffer was replaced.
    pub fn ensure(&mut self, device: &wgpu::Device, need: &Sizes) -> bool {
        let words = |n: usize| (n.max(1) * 4) as u64;
        let mut grown = false;
        grown |= self.sparams.ensure(
            device,
            (need.slots.max(1) * std::mem::size_of::<SlotU>()) as u64,
        );
        grown |= self
            .sstate
            .ensure(device, words(need.slots * SLOT_STATE_WORDS));
        grown |= self.rmap.ensure(device, words(need.rows.max(need.slots)));
        grown |= self.pen.ensure(device, words(need.pen_words));
        grown |= self.lists.ensure(device, words(need.list_words));
        grown |= self.work.ensure(device, words(need.work_words()));
        grown |= self.ctr.ensure(
            device,
            words(IND_ARGS + 2 * need.rows + need.rows * HIST_WORDS),
        );
        if grown {
            self.generation += 1;
        }
        grown
    }
}

/// Sizes a step needs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sizes {
    pub rows: usize,
    pub splits: usize,
    pub slots: usize,
    pub pen_words: usize,
    pub list_words: usize,
}

impl Sizes {
    /// Work words: per-row state, per-(row, split) partials, per-row candidates.
    pub fn work_words(&self) -> usize {
        self.cand_base() + self.rows * CAP * 2
    }
    pub fn part_base(&self) -> usize {
        self.rows * STATE_WORDS
    }
    pub fn cand_base(&self) -> usize {
        self.part_base() + self.rows * self.splits * PART_WORDS
    }
}

/// Penalty-area words of one slot for rows of `vocab`: two bitmaps and the counts, then
/// the DRY area (`step/dry.wgsl`: two bitmaps' worth and three runs of `DRY_CAP`).
pub(crate) fn pen_words(vocab: usize) -> usize {
    4 * vocab.div_ceil(32) + vocab + 3 * DRY_CAP
}

/// Word offset of the DRY ring in a penalty area: its last `DRY_CAP` words.
pub(crate) fn dry_ring_offset(vocab: usize) -> usize {
    pen_words(vocab) - DRY_CAP
}

#[cfg(test)]
mod tests {
    use super::split;

    /// Issue 56's count: on a GPU (1,024 workgroups aimed at, the hardware adapter's
    /// default chunk) a decode row of a real vocabulary is scanned by at least 32
    /// workgroups, and every piece stays within the limits.
    #[test]
    fn a_decode_row_spreads_over_32_workgroups_on_a_gpu() {
        let chunk = super::super::adapter::min_chunk(false);
        for v in [32_000usize, 32_768, 131_072, 151_936, 262_144] {
            let (splits, c) = split(v, 1, 1024, chunk);
            assert!(splits >= 32, "V {v}: {splits} workgroups");
            assert!(
                splits * c >= v && (splits - 1) * c < v,
                "V {v}: {splits} x {c}"
            );
            // a batch of 1,024 rows still takes one workgroup a row
            assert_eq!(split(v, 1024, 1024, chunk).0, 1, "V {v} at B = 1,024");
        }
    }
}
