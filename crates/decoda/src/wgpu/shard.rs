//! Vocabulary-sharded sampling's summaries from a shard's logits on the device
//! ([`WgpuShard`]): the rounds of [`crate::shard`] computed by `shard.wgsl` over logits
//! already in a [`wgpu::Buffer`], returned as the same [`Round1`], [`Round2`] and
//! [`Round3`] the host computes, so shards on devices and on hosts merge alike.
//!
//! Each round is one or two dispatches over a grid of (chunk of 4,096 ids, row), reading
//! the shard's logits once (round 1 twice for rows with lists), and a readback of
//! per-workgroup partials: a few words each, never the logits. Round 1's lists come from
//! a histogram of the values' keys (2,048 bins of their top 11 bits): the host finds the
//! bin holding the list's last entry, the device gathers every value at or above it, and
//! the host ranks those. That is exact for z and the raw logits (every value left out is
//! below every value gathered); for `y = z / T`, where a division can make two z's y
//! equal, the host checks that the list's last y is above every y a left-out z can give,
//! and gathers from a lower bin when it is not. How many a row gathers depends on its
//! values: a row whose values crowd into one bin gathers that bin whole.

use std::sync::Arc;

use wgpu::util::DeviceExt;

use super::buffers::make_buffer;
use super::device::{lazy_pipelines, Bind, Pipelines, WgpuDevice};
use super::shaders::{SHADER_FMATH, SHADER_FMATH_INT64, SHADER_HALF};
use super::views::DeviceLogits;
use crate::error::{Error, Result};
use crate::params::{LogprobsMode, Request};
use crate::pipeline::touches_into;
use crate::shard::{
    check_merged, check_rows, digest, list_sizes, listed, ranked, Decision, Plan, Round1, Round2,
    Round3,
};

/// Ids a workgroup covers (`CHUNK` in `shard.wgsl`).
const CHUNK: usize = 4096;
/// Partial words per (row, chunk) (`PW`).
const PW: usize = 8;
/// Histogram bins per row and list (`BINS`).
const BINS: usize = 2048;
const NONE: u32 = u32::MAX;

const RF_MASK: u32 = 1;
const RF_TOUCH: u32 = 2;
const RF_HIST_Z: u32 = 4;
const RF_HIST_X: u32 = 8;
const RF_LSE: u32 = 16;

const K_NONE: u32 = 0;
const K_RAW: u32 = 1;
const K_Z: u32 = 2;
const K_DRAW: u32 = 3;
const K_DRAW_RAW: u32 = 4;

/// The call block (`ShardCall` in `shard.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ShardCallU {
    pub rows: u32,
    pub width: u32,
    pub offset: u32,
    pub stride: u32,
    pub base: u32,
    pub chunks: u32,
    pub zero: u32,
    pub dtype: u32,
}

/// One row's parameters (`RowP` in `shard.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ShardRowU {
    pub flags: u32,
    pub t: f32,
    pub seed_lo: u32,
    pub seed_hi: u32,
    pub step_lo: u32,
    pub step_hi: u32,
    pub touch_off: u32,
    pub touch_len: u32,
    pub mask_off: u32,
    pub rep: f32,
    pub freq: f32,
    pub pres: f32,
    pub kind: u32,
    pub token: u32,
    pub floor: f32,
    pub vmax: f32,
    pub thr_z: u32,
    pub thr_x: u32,
    pub gz_off: u32,
    pub gx_off: u32,
}

/// The WGSL module of [`WgpuShard`]'s kernels (`shard.wgsl`, the half conversion and the
/// arithmetic shared with the CPU), with Philox's products in 64-bit integers when
/// `int64`.
pub fn shard_shader_source(int64: bool) -> String {
    let fmath = if int64 {
        SHADER_FMATH_INT64
    } else {
        SHADER_FMATH
    };
    format!(
        "{}\n{}\n{SHADER_HALF}\n{fmath}",
        include_str!("shard.wgsl"),
        include_str!("keys.wgsl")
    )
}

/// The entry points, in `Pipelines` order.
const ENTRIES: [&str; 4] = ["r1", "r1_gather", "r2", "r3"];
const R1: usize = 0;
const R1_GATHER: usize = 1;
const R2: usize = 2;
const R3: usize = 3;

/// A total order's key of a value (`key_of` in `shard.wgsl`): `a.total_cmp(b)` is
/// `key(a).cmp(key(b))`.
fn key_of(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

fn from_key(k: u32) -> f32 {
    if k & 0x8000_0000 != 0 {
        f32::from_bits(k & 0x7fff_ffff)
    } else {
        f32::from_bits(!k)
    }
}

/// Computes a shard's summaries on the device: [`crate::shard::round1`], `round2` and
/// `round3` for logits in a [`wgpu::Buffer`], the same summaries (round 2's partial
/// log-sum-exp within the contract's `1e-5` of the host's: the device adds in f32 per
/// workgroup). Built from a [`WgpuDevice`]; its pipelines are the device's, compiled once.
///
/// ```no_run
/// use decoda::shard::{decide, finish, plan};
/// use decoda::wgpu::{DeviceLogits, WgpuDevice, WgpuShard};
/// use decoda::{DType, Request, SamplingParams};
///
/// # fn logits_buffer() -> wgpu::Buffer { unimplemented!() }
/// let device = WgpuDevice::new()?;
/// let shard = WgpuShard::new(&device)?;
/// // this rank's LM head wrote logits [1, 75_968] for ids 75_968 .. 151_936
/// let buffer = logits_buffer();
/// let view = DeviceLogits { buffer: &buffer, dtype: DType::F32, rows: 1, vocab: 75_968,
///     row_stride: 75_968, offset: 0 };
/// let reqs = [Request::new(SamplingParams { temperature: 0.8, top_k: 50, ..Default::default() }, 7)];
/// let mine = shard.round1(&view, 75_968, 151_936, &reqs)?;
/// // ... all-gather `mine` (serde) into `r1[shard][row]`, then on every rank:
/// # let r1 = vec![mine.clone(), mine];
/// let plans = plan(&r1, 151_936, &reqs)?;
/// let r2 = vec![shard.round2(&view, 75_968, 151_936, &reqs, &plans)?];
/// let decisions = decide(&r2, &plans, &reqs);
/// # let _ = (decisions, finish);
/// # Ok::<(), decoda::Error>(())
/// ```
pub struct WgpuShard {
    ctx: WgpuDevice,
    pipes: Arc<Pipelines<4>>,
}

impl std::fmt::Debug for WgpuShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuShard")
            .field("adapter", &self.ctx.adapter_name())
            .finish()
    }
}

/// One call's view checked: its call block and its row count.
struct View<'a> {
    buffer: &'a wgpu::Buffer,
    call: ShardCallU,
    rows: usize,
}

impl WgpuShard {
    /// The summaries' kernels on `device` (compiled the first time a device needs them).
    pub fn new(device: impl AsRef<WgpuDevice>) -> Result<Self> {
        let ctx = device.as_ref().clone();
        let int64 = ctx.uses_int64();
        let dev = ctx.device().clone();
        let pipes = ctx.pipelines(&format!("shard int64={int64}"), || {
            lazy_pipelines::<4>(
                &dev,
                "decoda shard",
                shard_shader_source(int64),
                &[
                    Bind::Uniform,
                    Bind::Read,
                    Bind::Read,
                    Bind::Read,
                    Bind::Read,
                    Bind::Write,
                    Bind::Write,
                    Bind::Write,
                    Bind::Write,
                ],
                ENTRIES,
                "the shard summaries' kernels",
            )
        })?;
        Ok(Self { ctx, pipes })
    }

    /// The device context this was built from.
    pub fn device(&self) -> &WgpuDevice {
        &self.ctx
    }

    fn view<'a>(
        &self,
        logits: &DeviceLogits<'a>,
        first_id: usize,
        vocab: usize,
        reqs: &[Request],
    ) -> Result<View<'a>> {
        check_rows(logits.vocab, first_id, vocab, reqs)?;
        if logits.rows != reqs.len() {
            return Err(Error::Shape(format!(
                "{} rows of logits for {} requests",
                logits.rows,
                reqs.len()
            )));
        }
        logits.check(self.ctx.device())?;
        let max = self
            .ctx
            .device()
            .limits()
            .max_compute_workgroups_per_dimension as usize;
        let chunks = logits.vocab.div_ceil(CHUNK);
        if logits.rows > max || chunks > max {
            return Err(Error::Shape(format!(
                "[{}, {}] logits: at most {max} rows and {} ids a shard on this adapter",
                logits.rows,
                logits.vocab,
                max * CHUNK
            )));
        }
        if vocab > u32::MAX as usize {
            return Err(Error::Shape(format!(
                "a vocabulary of {vocab}: at most 2^32 - 1 ids"
            )));
        }
        Ok(View {
            buffer: logits.buffer,
            rows: logits.rows,
            call: ShardCallU {
                rows: logits.rows as u32,
                width: logits.vocab as u32,
                offset: first_id as u32,
                stride: logits.row_stride as u32,
                base: logits.offset as u32,
                chunks: chunks as u32,
                zero: 0,
                dtype: super::call::dtype_code(logits.dtype),
            },
        })
    }

    /// The rows' parameters with their touch records and masks (the shard's ids only).
    fn rows(&self, v: &View<'_>, reqs: &[Request]) -> (Vec<ShardRowU>, Vec<u32>, Vec<u32>) {
        let (lo, hi) = (v.call.offset, v.call.offset + v.call.width);
        let (w_lo, w_hi) = (lo as usize / 32, (hi as usize - 1) / 32 + 1);
        let mut touches = Vec::new();
        let mut masks = Vec::new();
        let mut touched = Vec::new();
        let rows = reqs
            .iter()
            .map(|req| {
                let p = &req.params;
                let mut r = ShardRowU {
                    t: p.temperature,
                    seed_lo: req.state.seed as u32,
                    seed_hi: (req.state.seed >> 32) as u32,
                    step_lo: req.state.step as u32,
                    step_hi: (req.state.step >> 32) as u32,
                    rep: p.repetition_penalty,
                    freq: p.frequency_penalty,
                    pres: p.presence_penalty,
                    ..Default::default()
                };
                touched.clear();
                touches_into(req, &mut touched);
                let mine: Vec<_> = touched
                    .iter()
                    .filter(|(t, _)| (lo..hi).contains(t))
                    .collect();
                if !mine.is_empty() {
                    r.flags |= RF_TOUCH;
                    r.touch_off = touches.len() as u32;
                    r.touch_len = mine.len() as u32;
                    for (t, tc) in mine {
                        touches.extend([
                            *t,
                            u32::from(tc.bias.is_some()) | (u32::from(tc.seen) << 1),
                            tc.bias.unwrap_or(0.0).to_bits(),
                            tc.count,
                            tc.dry.to_bits(),
                        ]);
                    }
                }
                if let Some(m) = &req.allowed {
                    r.flags |= RF_MASK;
                    r.mask_off = masks.len() as u32;
                    masks.extend_from_slice(&m[w_lo..w_hi]);
                }
                r
            })
            .collect();
        (rows, touches, masks)
    }

    /// Runs `entry` over every (chunk, row) and reads back the first `read` words of
    /// each of `parts`, `hist`, `counts` and `gath` (sizes in words).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        v: &View<'_>,
        rows: &[ShardRowU],
        touches: &[u32],
        masks: &[u32],
        entries: &[usize],
        hist_words: usize,
        gath_words: usize,
        read: [bool; 4],
    ) -> Result<[Vec<u32>; 4]> {
        let device = self.ctx.device();
        use wgpu::BufferUsages as U;
        let init = |label: &str, bytes: &[u8], usage: U| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: if bytes.is_empty() { &[0; 16] } else { bytes },
                usage,
            })
        };
        let call = init("decoda shard call", bytemuck::bytes_of(&v.call), U::UNIFORM);
        let rowp = init("decoda shard rows", bytemuck::cast_slice(rows), U::STORAGE);
        let tbuf = init(
            "decoda shard touches",
            bytemuck::cast_slice(touches),
            U::STORAGE,
        );
        let mbuf = init(
            "decoda shard masks",
            bytemuck::cast_slice(masks),
            U::STORAGE,
        );
        let words = [
            v.rows * v.call.chunks as usize * PW,
            hist_words,
            2 * v.rows,
            gath_words,
        ];
        let limits = device.limits();
        let most = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        for (w, what) in
            words
                .iter()
                .zip(["partials", "histograms", "gather counts", "gathered values"])
        {
            if 4 * *w as u64 > most {
                return Err(Error::Shape(format!(
                    "the call's {what} need {} bytes, past the adapter's {most}-byte \
                     storage binding: fewer rows a call (or a smaller top_k)",
                    4 * *w as u64
                )));
            }
        }
        let rw = U::STORAGE | U::COPY_SRC | U::COPY_DST;
        let outs: Vec<wgpu::Buffer> = words
            .iter()
            .map(|w| make_buffer(device, "decoda shard out", (4 * w.max(&4)) as u64, rw))
            .collect();
        let all = [
            &call, v.buffer, &rowp, &tbuf, &mbuf, &outs[0], &outs[1], &outs[2], &outs[3],
        ];
        let entries_bg: Vec<wgpu::BindGroupEntry> = all
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("decoda shard"),
            layout: &self.pipes.binds,
            entries: &entries_bg,
        });
        let mut enc =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        // histograms and gather counters start at zero
        enc.clear_buffer(&outs[1], 0, None);
        enc.clear_buffer(&outs[2], 0, None);
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_bind_group(0, &group, &[]);
            for &e in entries {
                pass.set_pipeline(self.pipes.get(e));
                pass.dispatch_workgroups(v.call.chunks, v.rows as u32, 1);
            }
        }
        let mut stages = Vec::new();
        for (i, out) in outs.iter().enumerate() {
            if read[i] {
                let bytes = 4 * words[i] as u64;
                let st = make_buffer(
                    device,
                    "decoda shard read",
                    bytes.max(16),
                    U::MAP_READ | U::COPY_DST,
                );
                if bytes > 0 {
                    enc.copy_buffer_to_buffer(out, 0, &st, 0, bytes);
                }
                stages.push(Some((st, bytes)));
            } else {
                stages.push(None);
            }
        }
        self.ctx.queue().submit([enc.finish()]);
        let mut res: [Vec<u32>; 4] = Default::default();
        for (i, s) in stages.into_iter().enumerate() {
            if let Some((st, bytes)) = s {
                if bytes > 0 {
                    res[i] = self.ctx.read_back::<u32>(&st, bytes)?;
                }
            }
        }
        Ok(res)
    }

    /// Round 1 on the shard of ids `first_id .. first_id + logits.vocab` of a vocabulary
    /// of `vocab`: [`crate::shard::round1`]'s summaries, the same values.
    pub fn round1(
        &self,
        logits: &DeviceLogits<'_>,
        first_id: usize,
        vocab: usize,
        reqs: &[Request],
    ) -> Result<Vec<Round1>> {
        let v = self.view(logits, first_id, vocab, reqs)?;
        let (mut rows, touches, masks) = self.rows(&v, reqs);
        let sizes: Vec<(usize, usize, usize)> = reqs.iter().map(|r| list_sizes(r, vocab)).collect();
        for (r, &(m_y, n_z, n_x)) in rows.iter_mut().zip(&sizes) {
            if m_y.max(n_z) > 0 {
                r.flags |= RF_HIST_Z;
            }
            if n_x > 0 {
                r.flags |= RF_HIST_X;
            }
        }
        let chunks = v.call.chunks as usize;
        // the histograms only when some row lists (a greedy or plain-temperature call
        // without log-probabilities reads back its partials alone)
        let lists = rows.iter().any(|r| r.flags & (RF_HIST_Z | RF_HIST_X) != 0);
        let hist_words = if lists { v.rows * 2 * BINS } else { 0 };
        let [parts, hist, _, _] = self.run(
            &v,
            &rows,
            &touches,
            &masks,
            &[R1],
            hist_words,
            0,
            [true, lists, false, false],
        )?;
        let mut out: Vec<Round1> = reqs
            .iter()
            .enumerate()
            .map(|(r, req)| {
                let mut bad = (0u64, 0u64);
                let mut zmax = (f32::NEG_INFINITY, NONE);
                let mut xmax = f32::NEG_INFINITY;
                for c in 0..chunks {
                    let p = &parts[(r * chunks + c) * PW..][..PW];
                    bad.0 += u64::from(p[0]);
                    bad.1 += u64::from(p[1]);
                    let z = f32::from_bits(p[2]);
                    // chunks in id order: a tie keeps the earlier
                    if p[3] != NONE && (zmax.1 == NONE || z > zmax.0) {
                        zmax = (z, p[3]);
                    }
                    let x = from_key(p[4]);
                    if x > xmax {
                        xmax = x;
                    }
                }
                Round1 {
                    digest: digest(req, vocab),
                    bad,
                    zmax: if zmax.1 == NONE {
                        (f32::NEG_INFINITY, u32::MAX)
                    } else {
                        zmax
                    },
                    xmax,
                    top_y: Vec::new(),
                    top_z: Vec::new(),
                    top_x: Vec::new(),
                }
            })
            .collect();
        // the lists: gather from the bin holding each list's last entry, lower while
        // a y list's last entry is not above every y a left-out z can give
        let hist_of = |r: usize, x: bool| &hist[(2 * r + usize::from(x)) * BINS..][..BINS];
        let mut todo: Vec<usize> = (0..reqs.len())
            .filter(|&r| sizes[r].0.max(sizes[r].1).max(sizes[r].2) > 0)
            .collect();
        let mut start: Vec<(usize, usize)> = vec![(BINS, BINS); reqs.len()];
        for &r in &todo {
            let (m_y, n_z, n_x) = sizes[r];
            start[r] = (
                from_top(hist_of(r, false), m_y.max(n_z)),
                from_top(hist_of(r, true), n_x),
            );
        }
        while !todo.is_empty() {
            // each row's gather counts (z's, the raw logits'), known from the histograms
            let mut want = vec![(0usize, 0usize); reqs.len()];
            let mut at = 0usize;
            for row in rows.iter_mut() {
                row.flags &= !(RF_HIST_Z | RF_HIST_X);
            }
            for &r in &todo {
                let (m_y, n_z, n_x) = sizes[r];
                let row = &mut rows[r];
                // a list's threshold (the key of its bin's first value), where its pairs
                // go, and how many there are
                let mut list = |x: bool, bin: usize, off: &mut u32, thr: &mut u32| {
                    *thr = (bin as u32) << 21;
                    *off = (2 * at) as u32;
                    let n: usize = hist_of(r, x)[bin..].iter().map(|&c| c as usize).sum();
                    at += n;
                    n
                };
                if m_y.max(n_z) > 0 {
                    row.flags |= RF_HIST_Z;
                    want[r].0 = list(false, start[r].0, &mut row.gz_off, &mut row.thr_z);
                }
                if n_x > 0 {
                    row.flags |= RF_HIST_X;
                    want[r].1 = list(true, start[r].1, &mut row.gx_off, &mut row.thr_x);
                }
            }
            let [_, _, counts, gath] = self.run(
                &v,
                &rows,
                &touches,
                &masks,
                &[R1_GATHER],
                0,
                2 * at,
                [false, false, true, true],
            )?;
            let mut again = Vec::new();
            for &r in &todo {
                let (m_y, n_z, n_x) = sizes[r];
                let pairs = |off: u32, n: u32| -> Vec<(u32, f32)> {
                    (0..n as usize)
                        .map(|i| {
                            let w = off as usize + 2 * i;
                            (gath[w], f32::from_bits(gath[w + 1]))
                        })
                        .collect()
                };
                if n_x > 0 {
                    let got = counts[2 * r + 1];
                    if got as usize != want[r].1 {
                        return Err(gathered_wrong(r, got, want[r].1));
                    }
                    out[r].top_x = ranked(pairs(rows[r].gx_off, got), n_x);
                }
                if m_y.max(n_z) == 0 {
                    continue;
                }
                let got = counts[2 * r];
                if got as usize != want[r].0 {
                    return Err(gathered_wrong(r, got, want[r].0));
                }
                let zs = pairs(rows[r].gz_off, got);
                out[r].top_z = ranked(zs.clone(), n_z);
                let t = reqs[r].params.temperature;
                let ys: Vec<(u32, f32)> = zs
                    .into_iter()
                    .map(|(i, z)| (i, z / t))
                    .filter(|c| listed(c.1))
                    .collect();
                out[r].top_y = ranked(ys, m_y);
                // a z left out is at most the largest key below the bin gathered (when
                // that is -inf's or below, nothing left out is listed)
                let below = ((start[r].0 as u32) << 21).wrapping_sub(1);
                if m_y > 0 && start[r].0 > 0 && below > key_of(f32::NEG_INFINITY) {
                    let y_out = from_key(below) / t;
                    let sure = y_out == f32::NEG_INFINITY
                        || out[r].top_y.len() == m_y
                            && out[r].top_y[m_y - 1].1.total_cmp(&y_out).is_gt();
                    if !sure {
                        // the next lower bin that holds any value (or every value)
                        let h = hist_of(r, false);
                        let lower = (0..start[r].0).rev().find(|&b| h[b] > 0).unwrap_or(0);
                        start[r].0 = lower;
                        again.push(r);
                    }
                }
            }
            todo = again;
        }
        Ok(out)
    }

    /// Round 2 on the shard, from the plans every rank merged from round 1:
    /// [`crate::shard::round2`]'s summaries (the partial log-sum-exp added in f32 per
    /// workgroup, so within the contract's `1e-5` of the host's, not its bits).
    pub fn round2(
        &self,
        logits: &DeviceLogits<'_>,
        first_id: usize,
        vocab: usize,
        reqs: &[Request],
        plans: &[Plan],
    ) -> Result<Vec<Round2>> {
        let v = self.view(logits, first_id, vocab, reqs)?;
        check_merged(reqs, plans, None)?;
        let (mut rows, touches, masks) = self.rows(&v, reqs);
        for ((row, req), plan) in rows.iter_mut().zip(reqs).zip(plans) {
            let raw = req.params.logprobs_mode == LogprobsMode::Raw;
            let lp = req.params.logprobs.is_some();
            if lp {
                row.flags |= RF_LSE;
            }
            match *plan {
                Plan::Failed(_) => row.kind = K_NONE,
                Plan::Greedy { token, zmax, xmax } => {
                    row.kind = if raw { K_RAW } else { K_Z };
                    row.token = token;
                    row.vmax = if raw { xmax } else { zmax };
                }
                Plan::Draw { ymax, floor, xmax } => {
                    row.kind = if raw && lp { K_DRAW_RAW } else { K_DRAW };
                    row.floor = floor;
                    row.vmax = if raw { xmax } else { ymax };
                }
            }
        }
        let chunks = v.call.chunks as usize;
        let [parts, _, _, _] = self.run(
            &v,
            &rows,
            &touches,
            &masks,
            &[R2],
            0,
            0,
            [true, false, false, false],
        )?;
        let (lo, hi) = (v.call.offset, v.call.offset + v.call.width);
        Ok(plans
            .iter()
            .enumerate()
            .map(|(r, plan)| {
                let mut out = Round2::default();
                if matches!(plan, Plan::Failed(_)) {
                    return out;
                }
                for c in 0..chunks {
                    let p = &parts[(r * chunks + c) * PW..][..PW];
                    out.lse_part += f64::from(f32::from_bits(p[4]));
                    if p[1] != NONE {
                        let s = f32::from_bits(p[0]);
                        // chunks in id order: a tie keeps the earlier
                        if out.best.is_none_or(|b| s > b.0) {
                            out.best = Some((s, p[1], f32::from_bits(p[2]), f32::from_bits(p[3])));
                        }
                    }
                }
                if let Plan::Greedy { token, .. } = *plan {
                    if (lo..hi).contains(&token) {
                        let c = (token - lo) as usize / CHUNK;
                        out.greedy_x = Some(f32::from_bits(parts[(r * chunks + c) * PW + 5]));
                    }
                }
                if reqs[r].params.logprobs.is_none() {
                    out.lse_part = 0.0;
                }
                out
            })
            .collect())
    }

    /// Round 3 on the shard (rows with log-probabilities; 0 for the others): its tokens
    /// ranked before each row's chosen one, as [`crate::shard::round3`] counts them.
    pub fn round3(
        &self,
        logits: &DeviceLogits<'_>,
        first_id: usize,
        vocab: usize,
        reqs: &[Request],
        plans: &[Plan],
        decisions: &[Decision],
    ) -> Result<Vec<Round3>> {
        let v = self.view(logits, first_id, vocab, reqs)?;
        check_merged(reqs, plans, Some(decisions))?;
        let (mut rows, touches, masks) = self.rows(&v, reqs);
        for (row, (req, (plan, d))) in rows
            .iter_mut()
            .zip(reqs.iter().zip(plans.iter().zip(decisions)))
        {
            row.kind = K_NONE;
            let Ok(token) = d.token else { continue };
            if req.params.logprobs.is_none() {
                continue;
            }
            row.token = token;
            row.vmax = d.value;
            row.kind = match (req.params.logprobs_mode, plan) {
                (LogprobsMode::Raw, _) => K_RAW,
                (LogprobsMode::Processed, Plan::Greedy { .. }) => K_Z,
                (LogprobsMode::Processed, Plan::Draw { floor, .. }) => {
                    row.floor = *floor;
                    K_DRAW
                }
                (_, Plan::Failed(_)) => K_NONE,
            };
        }
        let chunks = v.call.chunks as usize;
        let [parts, _, _, _] = self.run(
            &v,
            &rows,
            &touches,
            &masks,
            &[R3],
            0,
            0,
            [true, false, false, false],
        )?;
        Ok((0..reqs.len())
            .map(|r| {
                (0..chunks)
                    .map(|c| u64::from(parts[(r * chunks + c) * PW]))
                    .sum()
            })
            .collect())
    }
}

/// The lowest bin from which the histogram's top holds at least `n` values (0 when it
/// holds fewer: every value).
fn from_top(hist: &[u32], n: usize) -> usize {
    if n == 0 {
        return hist.len();
    }
    let mut cum = 0usize;
    for b in (0..hist.len()).rev() {
        cum += hist[b] as usize;
        if cum >= n {
            return b;
        }
    }
    0
}

fn gathered_wrong(row: usize, got: u32, want: usize) -> Error {
    Error::Device(format!(
        "row {row}: the device gathered {got} values where its histogram counted {want}"
    ))
}
