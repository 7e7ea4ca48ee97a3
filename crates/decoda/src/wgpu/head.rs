//! The sampling head on the device: slots whose parameters, seed, step, history
//! (presence bitmap and output counts) and stop conditions live in device buffers.
//!
//! [`WgpuHead::record_step`] records one decode step into the caller's encoder: the
//! step kernels sample each row of a [`DeviceLogits`] view for its slot and advance the
//! slot on the device, writing the tokens to [`WgpuHead::tokens`] (which the model's
//! next embedding lookup can read). The host writes nothing per step; only when the
//! batch composition (the row -> slot map or the logits view) changes does it write the
//! new map. Each step's tokens come back through a ring of readback buffers that are
//! mapped when the step's submission has run: [`WgpuHead::poll`] returns the steps that
//! are done, in order, so a loop can run ahead of its readbacks.
//!
//! Per slot the device keeps its parameters (104 bytes), its state (32 bytes), its logit
//! bias, stop ids, DRY penalty table and breakers (45 KiB), its history as two bitmaps
//! of V bits (seen tokens, biased tokens) and a dense u32 count per token (`4 V + V / 4`
//! bytes: 608 KiB at V = 151,936), and its DRY area: the ring of its last 4,096 tokens,
//! and per step the penalised tokens (two more bitmaps of V bits and two runs of 4,096
//! words: 86 KiB at V = 151,936). Dense counts make a lookup one load and the update one
//! atomic add; a sparse table would be smaller for short outputs but needs a search per
//! touched token and a bound on the output length.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::head::{
    self, FinishReason, Head, SlotRequest, SlotStep, SlotVerify, Verifying, MAX_SLOT_BIAS,
    MAX_SLOT_STOP,
};
use crate::logits::Logits;
use crate::params::{SamplingParams, MAX_BREAKERS, MAX_BREAKER_LEN};

use super::buffers::{make_buffer, Grow};
use super::call::{
    bind_group_raw, call_block, dry_lists, push_history, row_flags, slot_params, step_group,
    CallShape, MAX_VOCAB,
};
use super::device::WgpuDevice;
use super::host::{checked, parse_kept, parse_logprobs, row_status};
use super::kernels::{
    self, Entry, Kernels, Plan, RowNeeds, Sizes, StepBuffers, StepShape, StepStamps,
};
use super::layout::*;
use super::profile::{Passes, Profiler};
use super::views::{DeviceLogits, DeviceMasks};

/// Where a head step writes timestamps.
pub(crate) enum Stamping<'a> {
    /// Nowhere.
    None,
    /// Around the step's compute pass (a 2-query set; the benchmarks).
    Step(&'a wgpu::QuerySet),
    /// Around each dispatch, in a pass of its own, with its plan (a profile).
    Dispatches(&'a mut Profiler),
}

/// List words of one slot: its bias pairs, its stop ids, then its DRY penalty table (one
/// entry per excess a window allows) and sequence breakers ((length, ids...) each).
const SLOT_LIST_WORDS: usize =
    2 * MAX_SLOT_BIAS + MAX_SLOT_STOP + (DRY_CAP + 1) + MAX_BREAKERS * (MAX_BREAKER_LEN + 1);

/// A step recorded by [`WgpuHead::record_step`], identified in order.
pub type StepId = u64;

/// The results of one step, returned by [`WgpuHead::poll`] and [`WgpuHead::wait`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepResults {
    /// Which step (in recording order, from 0).
    pub id: StepId,
    /// One entry per row of the step, in row order.
    pub rows: Vec<SlotStep>,
}

/// A readback buffer of the ring.
struct Readback {
    buf: wgpu::Buffer,
    ready: Arc<AtomicBool>,
    /// The step it holds (None: free).
    step: Option<(StepId, Vec<usize>, bool)>,
}

/// What the host remembers of a slot.
#[derive(Debug, Clone)]
struct HostSlot {
    params: SamplingParams,
    stop: Vec<u32>,
    max_tokens: Option<u64>,
    seed: u64,
    /// The most tokens the slot's history can reach: prompt, earlier output and
    /// `max_tokens` (`usize::MAX` without a limit); bounds its DRY window.
    history_most: usize,
}

/// The sampling head on a wgpu device. See the module docs.
pub struct WgpuHead {
    pub(crate) ctx: WgpuDevice,
    kernels: Arc<Kernels>,
    slots: usize,
    vocab: usize,
    bufs: StepBuffers,
    /// A second call block and row map for joins and leaves.
    op_call: wgpu::Buffer,
    op_rmap: wgpu::Buffer,
    tokens: wgpu::Buffer,
    results: wgpu::Buffer,
    /// What the step buffers hold now: the call block and the row map.
    current: Option<(CallU, Vec<u32>)>,
    bind: Option<(wgpu::Buffer, Option<wgpu::Buffer>, u64, wgpu::BindGroup)>,
    /// The host API's masks (`step_masked`), uploaded per step.
    mask_upload: Grow,
    /// The slots' fixed masks ([`SlotRequest::allowed`]), `[slots, ceil(V / 32)]`, made at
    /// the first join with one; written at joins only.
    slot_masks: Option<wgpu::Buffer>,
    /// Which slots have a fixed mask.
    masked: Vec<bool>,
    op_bind: Option<(u64, wgpu::BindGroup)>,
    ring: Vec<Readback>,
    next_step: StepId,
    host: Vec<Option<HostSlot>>,
    bytes_written: u64,
    upload: Grow,
    /// While a verify records its positions: the lists offset of the position's drafted
    /// tokens, and whether slots halted at an earlier position stay put.
    verifying: Option<(u32, bool)>,
    /// Compute dispatches of the last recorded step.
    last_dispatches: usize,
}

impl WgpuHead {
    /// Compute dispatches the last recorded step ran: 2 when no slot of the step has
    /// filters or log-probabilities, 3 with filters, 5 with log-probabilities.
    pub fn step_dispatches(&self) -> usize {
        self.last_dispatches
    }
}

impl std::fmt::Debug for WgpuHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuHead")
            .field("adapter", &self.ctx.adapter_name())
            .field("slots", &self.slots)
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl WgpuHead {
    /// A head of `slots` slots for a vocabulary of `vocab` tokens on a device (a
    /// [`WgpuDevice`], or a [`super::WgpuSampler`] on one), sharing its compiled kernels.
    /// Allocates every slot's state up front.
    pub fn new(on: &impl AsRef<WgpuDevice>, slots: usize, vocab: usize) -> Result<Self> {
        let ctx = on.as_ref().clone();
        if slots == 0 || vocab == 0 {
            return Err(Error::Shape(
                "a head needs at least one slot and one token".into(),
            ));
        }
        if slots > MAX_GRID || vocab > MAX_VOCAB {
            return Err(Error::Shape(format!(
                "{slots} slots of {vocab} tokens: at most {MAX_GRID} slots and {} tokens",
                MAX_VOCAB
            )));
        }
        let kernels = Kernels::of(&ctx)?;
        // a head steps many times: the light plan's kernels now, a slot's plan's when it
        // joins or changes its parameters, none inside a step
        kernels.build_for(Plan::Light);
        let device = ctx.device().clone();
        let max_binding = device.limits().max_storage_buffer_binding_size;
        let pen_bytes = (slots * kernels::pen_words(vocab) * 4) as u64;
        if pen_bytes > max_binding {
            return Err(Error::Shape(format!(
                "{slots} slots of {vocab} tokens need {pen_bytes} bytes of history state; this \
                 adapter binds at most {max_binding}"
            )));
        }
        let mut bufs = StepBuffers::new(&device);
        let (splits, _) = kernels::split(vocab, 1, ctx.target_wg(), ctx.min_chunk());
        bufs.ensure(
            &device,
            &Sizes {
                rows: slots,
                splits,
                slots,
                pen_words: slots * kernels::pen_words(vocab),
                list_words: slots * SLOT_LIST_WORDS,
            },
        );
        use wgpu::BufferUsages as U;
        let u = U::STORAGE | U::COPY_SRC | U::COPY_DST;
        let upload = Grow::new(&device, "decoda head logits", U::STORAGE | U::COPY_DST);
        let mask_upload = Grow::new(&device, "decoda head masks", U::STORAGE | U::COPY_DST);
        Ok(Self {
            op_call: make_buffer(
                &device,
                "decoda head op call",
                std::mem::size_of::<CallU>() as u64,
                U::UNIFORM | U::COPY_DST,
            ),
            op_rmap: make_buffer(
                &device,
                "decoda head op slots",
                256,
                U::STORAGE | U::COPY_DST,
            ),
            tokens: make_buffer(&device, "decoda head tokens", (slots * 4) as u64, u),
            results: make_buffer(
                &device,
                "decoda head results",
                (slots * (RES_WORDS + KEPT_WORDS) * 4) as u64,
                u,
            ),
            kernels,
            ctx,
            slots,
            vocab,
            bufs,
            current: None,
            bind: None,
            mask_upload,
            slot_masks: None,
            masked: vec![false; slots],
            op_bind: None,
            ring: Vec::new(),
            next_step: 0,
            host: vec![None; slots],
            bytes_written: 0,
            upload,
            verifying: None,
            last_dispatches: 0,
        })
    }

    /// The tokens of the last step recorded, u32 per row (0 for a failed or finished
    /// row): what the next step's embedding lookup reads.
    pub fn tokens(&self) -> &wgpu::Buffer {
        &self.tokens
    }

    /// Bytes the head has written from the host for its steps (the row map and call
    /// block when the batch composition changes; joins, leaves and parameter changes are
    /// not counted). Constant across steps of an unchanged batch.
    pub fn host_bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Records one step into `encoder`: row `r` of `logits` is sampled for slot
    /// `rows[r]`, and the slots advance on the device. Returns the step's id; its
    /// results come back through [`WgpuHead::poll`] once the submission holding it has
    /// run. Joins, leaves and parameter changes take effect from the next submission.
    pub fn record_step(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        rows: &[usize],
    ) -> Result<StepId> {
        self.record_step_with(encoder, logits, None, rows, Stamping::None)
    }

    /// [`WgpuHead::record_step`] with a token mask per row on the device (row `r`'s mask
    /// for slot `rows[r]` at this step; stage 0 of the contract, read where the kernels
    /// read the logits: nothing passes through the host).
    pub fn record_step_masked(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        masks: &DeviceMasks<'_>,
        rows: &[usize],
    ) -> Result<StepId> {
        self.record_step_with(encoder, logits, Some(masks), rows, Stamping::None)
    }

    /// [`WgpuHead::record_step`] with timestamps written around the step's compute pass
    /// into `timestamps` (a 2-query set).
    /// Writes `slot`'s fixed mask (all ones without one, once any slot has had one).
    fn write_slot_mask(&mut self, slot: usize, mask: Option<&[u32]>) {
        let w = self.vocab.div_ceil(32);
        self.masked[slot] = mask.is_some();
        if mask.is_none() && self.slot_masks.is_none() {
            return;
        }
        if self.slot_masks.is_none() {
            let buf = make_buffer(
                self.ctx.device(),
                "decoda head slot masks",
                (self.slots * w * 4) as u64,
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            );
            self.ctx.queue().write_buffer(
                &buf,
                0,
                bytemuck::cast_slice(&vec![u32::MAX; self.slots * w]),
            );
            self.slot_masks = Some(buf);
        }
        let buf = self.slot_masks.as_ref().expect("made above");
        let words = mask.map_or_else(|| vec![u32::MAX; w], <[u32]>::to_vec);
        self.ctx
            .queue()
            .write_buffer(buf, (slot * w * 4) as u64, bytemuck::cast_slice(&words));
    }

    /// [`WgpuHead::record_step`] with each of the step's dispatches in a profiled pass of
    /// its own (`generate --profile`).
    pub(crate) fn record_step_profiled(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        rows: &[usize],
        prof: &mut Profiler,
    ) -> Result<StepId> {
        self.record_step_with(encoder, logits, None, rows, Stamping::Dispatches(prof))
    }

    pub(crate) fn record_step_with(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        masks: Option<&DeviceMasks<'_>>,
        rows: &[usize],
        stamps: Stamping<'_>,
    ) -> Result<StepId> {
        let joined: Vec<bool> = self.host.iter().map(Option::is_some).collect();
        head::step_door(rows, &joined, logits.rows, logits.vocab, self.vocab, &[])?;
        if let Some(m) = masks {
            m.check(logits.rows, logits.vocab)?;
            if let Some(r) = rows.iter().position(|&s| self.masked[s]) {
                return Err(Error::InvalidParameter {
                    row: r,
                    field: "allowed",
                    value: "a step mask for a slot with a fixed mask".into(),
                    expected: "one mask per slot and step on the device head",
                });
            }
        }
        // the slots' fixed masks, by slot, when a row of the step has one
        let slot_view;
        let (masks, by_slot) = match (masks, &self.slot_masks) {
            (None, Some(buf)) if rows.iter().any(|&s| self.masked[s]) => {
                slot_view = DeviceMasks {
                    buffer: buf,
                    offset: 0,
                    row_stride: self.vocab.div_ceil(32),
                };
                (Some(&slot_view), true)
            }
            (m, _) => (m, false),
        };
        logits.check(self.ctx.device())?;
        let b = rows.len();
        let id = self.next_step;
        if b == 0 {
            return Err(Error::Shape("a step needs at least one row".into()));
        }
        let v = self.vocab;
        let (splits, chunk) = kernels::split(v, b, self.ctx.target_wg(), self.ctx.min_chunk());
        // the passes, from the rows' parameters (the head keeps the penalty areas up to
        // date itself, so nothing is scattered)
        let needs = rows
            .iter()
            .filter_map(|&s| self.host[s].as_ref())
            .map(|h| RowNeeds::of(row_flags(&h.params, v), h.params.temperature));
        let plan = Plan::of(needs.clone(), false, false);
        let phases = kernels::phases(needs);
        // the buffers were sized for every slot at construction (one row has the most
        // splits), so a step never reallocates the slots' state
        let sizes = Sizes {
            rows: self.slots,
            splits,
            slots: self.slots,
            pen_words: self.slots * kernels::pen_words(v),
            list_words: self.bufs_list_words(),
        };
        let (sample_parts, sample_chunk) = self.kernels.sample_split(v, chunk);
        let mut call = call_block(
            logits,
            masks,
            CallShape {
                rows: b,
                splits,
                chunk,
                sample_chunk,
                sizes: &sizes,
                plan,
                mode: M_HEAD | if by_slot { M_SLOT_MASK } else { 0 },
                draws: 0,
                draw_lanes: 1,
            },
        );
        if let Some((at, halts)) = self.verifying {
            call.verify = at;
            call.mode |= M_VERIFY | if halts { M_HALTS } else { 0 };
        }
        let rmap: Vec<u32> = rows.iter().map(|&s| s as u32).collect();
        let changed = !matches!(&self.current, Some((c, m)) if *c == call && *m == rmap);
        if changed {
            // through a staging buffer of its own, copied by this step's commands
            let mut bytes = bytemuck::bytes_of(&call).to_vec();
            bytes.extend_from_slice(bytemuck::cast_slice(&rmap));
            let (stage, _) = self
                .ctx
                .stages()
                .take(self.ctx.device(), bytes.len() as u64);
            self.ctx.queue().write_buffer(&stage, 0, &bytes);
            self.bytes_written += bytes.len() as u64;
            let c = std::mem::size_of::<CallU>() as u64;
            encoder.copy_buffer_to_buffer(&stage, 0, &self.bufs.call, 0, c);
            encoder.copy_buffer_to_buffer(&stage, c, &self.bufs.rmap.buf, 0, (b * 4) as u64);
            self.ctx.stages().release_after(encoder, stage);
            self.current = Some((call, rmap));
        }
        let mask_buf = masks.map(|m| m.buffer.clone());
        let fresh = !matches!(&self.bind, Some((l, m, g, _)) if l == logits.buffer && *m == mask_buf && *g == self.bufs.generation);
        if fresh {
            let group = bind_group_raw(
                self.ctx.device(),
                &self.kernels,
                &self.bufs,
                (
                    logits.buffer,
                    masks.map_or(&self.kernels.no_mask, |m| m.buffer),
                ),
                &self.tokens,
                &self.results,
            );
            self.bind = Some((logits.buffer.clone(), mask_buf, self.bufs.generation, group));
        }
        let group = &self.bind.as_ref().expect("set above").3;
        let shape = StepShape {
            rows: b,
            splits,
            draw_groups: 0,
            plan,
            phases,
            sample_parts,
            vocab: v,
        };
        self.last_dispatches = self.kernels.dispatches(shape);
        match stamps {
            Stamping::None => {
                self.kernels
                    .record_step(encoder, group, &self.bufs, shape, StepStamps::None)
            }
            Stamping::Step(q) => {
                self.kernels
                    .record_step(encoder, group, &self.bufs, shape, StepStamps::Step(q))
            }
            Stamping::Dispatches(prof) => {
                let row_bytes = (logits.vocab * logits.dtype.size()) as u64;
                let mut passes = Passes::new(encoder, Some(prof));
                self.kernels
                    .record_step_in(&mut passes, group, &self.bufs, shape, row_bytes);
            }
        }
        // the step's results into a readback buffer, mapped when the submission has run
        // rows asking for their kept distribution bring back the kept areas too
        let kept = rows.iter().any(|&s| {
            self.host[s]
                .as_ref()
                .is_some_and(|h| h.params.kept.is_some())
        });
        let stride = RES_WORDS + if kept { KEPT_WORDS } else { 0 };
        let bytes = ((b + b * stride) * 4) as u64;
        let k = match self
            .ring
            .iter()
            .position(|r| r.step.is_none() && r.buf.size() >= bytes)
        {
            Some(k) => k,
            None => {
                let buf = make_buffer(
                    self.ctx.device(),
                    "decoda head readback",
                    ((self.slots + self.slots * stride) * 4) as u64,
                    wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                );
                self.ring.push(Readback {
                    buf,
                    ready: Arc::new(AtomicBool::new(false)),
                    step: None,
                });
                self.ring.len() - 1
            }
        };
        let r = &mut self.ring[k];
        encoder.copy_buffer_to_buffer(&self.tokens, 0, &r.buf, 0, (b * 4) as u64);
        encoder.copy_buffer_to_buffer(
            &self.results,
            0,
            &r.buf,
            (b * 4) as u64,
            (b * stride * 4) as u64,
        );
        r.ready.store(false, Ordering::Release);
        let ready = Arc::clone(&r.ready);
        encoder.map_buffer_on_submit(&r.buf, wgpu::MapMode::Read, 0..bytes, move |res| {
            if res.is_ok() {
                ready.store(true, Ordering::Release);
            }
        });
        r.step = Some((id, rows.to_vec(), kept));
        self.next_step += 1;
        Ok(id)
    }

    /// The results of the steps whose submissions have finished, oldest first, stopping
    /// at the first that has not (without waiting).
    pub fn poll(&mut self) -> Result<Vec<StepResults>> {
        self.ctx
            .device()
            .poll(wgpu::PollType::Poll)
            .map_err(|e| Error::Device(format!("polling the device: {e}")))?;
        self.collect()
    }

    /// Waits for every submitted step, then returns their results as [`WgpuHead::poll`].
    pub fn wait(&mut self) -> Result<Vec<StepResults>> {
        self.ctx
            .device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
        // The device is idle, but a readback's callback may still be running on another
        // thread that polls the same device (a sampler shared with this head): give such
        // callbacks a moment to land (a mapping that failed never does).
        let start = std::time::Instant::now();
        while self
            .ring
            .iter()
            .any(|r| r.step.is_some() && !r.ready.load(Ordering::Acquire))
            && start.elapsed() < std::time::Duration::from_secs(2)
        {
            std::thread::yield_now();
            self.ctx
                .device()
                .poll(wgpu::PollType::Poll)
                .map_err(|e| Error::Device(format!("polling the device: {e}")))?;
        }
        self.collect()
    }

    fn collect(&mut self) -> Result<Vec<StepResults>> {
        let mut out = Vec::new();
        while let Some(k) = (0..self.ring.len())
            .filter(|&k| self.ring[k].step.is_some())
            .min_by_key(|&k| self.ring[k].step.as_ref().map(|s| s.0))
        {
            if !self.ring[k].ready.load(Ordering::Acquire) {
                break;
            }
            let (id, rows, kept) = self.ring[k].step.take().expect("checked");
            let b = rows.len();
            let stride = RES_WORDS + if kept { KEPT_WORDS } else { 0 };
            let words: Vec<u32> = {
                let slice = self.ring[k].buf.slice(0..((b + b * stride) * 4) as u64);
                let view = slice
                    .get_mapped_range()
                    .map_err(|e| Error::Device(format!("reading a step's results: {e}")))?;
                bytemuck::cast_slice::<u8, u32>(&view).to_vec()
            };
            self.ring[k].buf.unmap();
            self.ring[k].ready.store(false, Ordering::Release);
            out.push(StepResults {
                id,
                rows: self.parse(&words, &rows),
            });
        }
        Ok(out)
    }

    fn parse(&self, words: &[u32], rows: &[usize]) -> Vec<SlotStep> {
        let b = rows.len();
        let (tokens, res) = words.split_at(b);
        rows.iter()
            .enumerate()
            .map(|(r, &slot)| {
                let w = &res[r * RES_WORDS..(r + 1) * RES_WORDS];
                let logprobs = self.host[slot]
                    .as_ref()
                    .and_then(|h| h.params.logprobs)
                    .map(|_| parse_logprobs(&w[2..2 + LP_WORDS]));
                let kept = self.host[slot].as_ref().and_then(|h| h.params.kept);
                let result = match row_status(w[0], w[1]) {
                    None => checked(tokens[r], self.vocab, logprobs).map(|mut s| {
                        s.kept = kept.map(|_| {
                            parse_kept(&res[b * RES_WORDS + r * KEPT_WORDS..][..KEPT_WORDS])
                        });
                        s
                    }),
                    Some(e) => Err(e),
                };
                // the second word: the slot's finish (after this step, or from before)
                let finished = match (w[0], w[1]) {
                    (STATUS_OK | STATUS_FINISHED, 1) => Some(FinishReason::Stop),
                    (STATUS_OK | STATUS_FINISHED, 2) => Some(FinishReason::Length),
                    _ => None,
                };
                SlotStep {
                    slot,
                    result,
                    finished,
                }
            })
            .collect()
    }

    fn bufs_list_words(&self) -> usize {
        (self.bufs.lists.buf.size() / 4) as usize
    }

    /// Runs a join or leave kernel for `slot` right away (its own submission).
    fn run_op(&mut self, slot: usize, pipe_join: bool, extra_lists: &[u32]) -> Result<()> {
        let v = self.vocab;
        self.grow_lists(self.slots * SLOT_LIST_WORDS + extra_lists.len());
        if !extra_lists.is_empty() {
            self.ctx.queue().write_buffer(
                &self.bufs.lists.buf,
                (self.slots * SLOT_LIST_WORDS * 4) as u64,
                bytemuck::cast_slice(extra_lists),
            );
        }
        let call = CallU {
            rows: 1,
            vocab: v as u32,
            bm_words: v.div_ceil(32) as u32,
            cap: CAP as u32,
            splits: 1,
            chunk: 4,
            draw_lanes: 1,
            ..Default::default()
        };
        self.ctx
            .queue()
            .write_buffer(&self.op_call, 0, bytemuck::bytes_of(&call));
        self.ctx
            .queue()
            .write_buffer(&self.op_rmap, 0, bytemuck::bytes_of(&(slot as u32)));
        let gen = self.bufs.generation;
        if !matches!(&self.op_bind, Some((g, _)) if *g == gen) {
            let all = [
                &self.op_call,
                // (no logits: any read-only buffer)
                &self.op_rmap,
                &self.bufs.sparams.buf,
                &self.bufs.sstate.buf,
                &self.op_rmap,
                &self.bufs.pen.buf,
                &self.bufs.lists.buf,
                &self.bufs.work.buf,
                &self.bufs.ctr.buf,
                &self.tokens,
                &self.results,
                &self.kernels.no_mask,
            ];
            let group = step_group(self.ctx.device(), &self.kernels, "decoda head op", all);
            self.op_bind = Some((gen, group));
        }
        let group = &self.op_bind.as_ref().expect("set above").1;
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_bind_group(0, group, &[]);
            if pipe_join {
                pass.set_pipeline(self.kernels.pipe(Entry::Join));
                pass.dispatch_workgroups(1, 1, 1);
            } else {
                pass.set_pipeline(self.kernels.pipe(Entry::Wipe));
                let groups = kernels::pen_words(v).div_ceil(WG);
                let (x, y) = if groups <= MAX_GRID {
                    (groups, 1)
                } else {
                    (MAX_GRID, groups.div_ceil(MAX_GRID))
                };
                pass.dispatch_workgroups(x as u32, y as u32, 1);
            }
        }
        self.ctx.queue().submit([enc.finish()]);
        Ok(())
    }

    /// Writes slot `slot`'s parameters and lists (bias, stop ids); `hist` points its
    /// history at the join area.
    fn write_slot(&mut self, slot: usize, h: &HostSlot, hist: (u32, u32)) -> Result<()> {
        let mut lists = Vec::new();
        let touch = h.params.repetition_penalty != 1.0
            || h.params.frequency_penalty != 0.0
            || h.params.presence_penalty != 0.0
            || !h.params.logit_bias.is_empty()
            || h.params.dry_on();
        let mut sp = slot_params(&h.params, h.seed, self.vocab, touch, slot, &mut lists)?;
        let base = slot * SLOT_LIST_WORDS;
        sp.bias_off = base as u32;
        sp.stop_off = (base + 2 * MAX_SLOT_BIAS) as u32;
        sp.stop_len = h.stop.len() as u32;
        let max = h.max_tokens.unwrap_or(u64::MAX);
        sp.max_lo = max as u32;
        sp.max_hi = (max >> 32) as u32;
        sp.hist_off = hist.0;
        sp.hist_len = hist.1;
        lists.resize(2 * MAX_SLOT_BIAS, 0);
        lists.extend_from_slice(&h.stop);
        if h.params.dry_on() {
            lists.resize(2 * MAX_SLOT_BIAS + MAX_SLOT_STOP, 0);
            let excess = DRY_CAP.saturating_sub(h.params.dry_allowed_length as usize);
            let mut d = dry_lists(&h.params, excess, &mut lists)?;
            d.tab_off += base as u32;
            d.brk_off += base as u32;
            sp.set_dry(d);
        }
        self.ctx.queue().write_buffer(
            &self.bufs.sparams.buf,
            (slot * std::mem::size_of::<SlotU>()) as u64,
            bytemuck::bytes_of(&sp),
        );
        self.ctx.queue().write_buffer(
            &self.bufs.lists.buf,
            (base * 4) as u64,
            bytemuck::cast_slice(&lists),
        );
        Ok(())
    }
}

impl Head for WgpuHead {
    fn name(&self) -> String {
        format!("wgpu:{}", self.ctx.adapter_name())
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn join(&mut self, slot: usize, request: SlotRequest) -> Result<u64> {
        let joined: Vec<bool> = self.host.iter().map(Option::is_some).collect();
        let seed = head::join_door(slot, &joined, &request, self.vocab)?;
        let had = request.prompt.len() + request.output.len();
        let history_most = request.history_most();
        // what the device's slots cannot hold (beyond the door every head shares)
        crate::params::on_device_only(&request.params, slot, history_most)?;
        self.write_slot_mask(slot, request.allowed.as_deref());
        let h = HostSlot {
            params: request.params,
            stop: request.stop,
            max_tokens: request.max_tokens,
            seed,
            history_most,
        };
        let mut hist = Vec::new();
        let (_, n) = push_history(&mut hist, &request.prompt, &request.output)?;
        let join_off = (self.slots * SLOT_LIST_WORDS) as u32;
        self.grow_lists(self.slots * SLOT_LIST_WORDS + hist.len());
        self.write_slot(slot, &h, (join_off, n))?;
        let mut state = [
            request.step as u32,
            (request.step >> 32) as u32,
            0u32,
            0,
            0,
            0,
            0,
            0,
        ];
        state[SS_HIST] = had as u32;
        self.write_ring(slot, &request.prompt, &request.output);
        self.ctx.queue().write_buffer(
            &self.bufs.sstate.buf,
            (slot * SLOT_STATE_WORDS * 4) as u64,
            bytemuck::cast_slice(&state),
        );
        self.run_op(slot, true, &hist)?;
        self.build_for(&h.params);
        self.host[slot] = Some(h);
        Ok(seed)
    }

    fn leave(&mut self, slot: usize) -> Result<()> {
        head::check_slot(slot, self.slots)?;
        if self.host[slot].is_none() {
            return Ok(());
        }
        self.run_op(slot, false, &[])?;
        self.host[slot] = None;
        Ok(())
    }

    fn set_params(&mut self, slot: usize, params: SamplingParams) -> Result<()> {
        let stops = self
            .host
            .get(slot)
            .and_then(Option::as_ref)
            .map(|h| h.stop.len());
        head::set_params_door(slot, self.slots, stops, &params, self.vocab)?;
        let mut h = self.host[slot].clone().expect("checked by the door");
        // what the device's slots cannot hold (beyond the door every head shares)
        crate::params::on_device_only(&params, slot, h.history_most)?;
        let old_bias: BTreeMap<u32, f32> = h.params.logit_bias.clone();
        h.params = params;
        self.write_slot(slot, &h, (0, 0))?;
        self.build_for(&h.params);
        if old_bias != h.params.logit_bias {
            // the bias bitmap follows the new bias list: clear the old bits, set the new
            self.rebuild_bias_bits(slot, &old_bias, &h.params.logit_bias)?;
        }
        self.host[slot] = Some(h);
        Ok(())
    }

    fn step(&mut self, logits: &Logits<'_>, rows: &[usize]) -> Result<Vec<SlotStep>> {
        self.step_masked(logits, rows, &[])
    }

    /// Every position in one submission: the logits go up once (position by position),
    /// the drafted tokens into the lists' scratch area, and each position is a step of
    /// the rows that have it, recorded back to back. On the device a slot whose draw at
    /// a position is not its drafted token (or that fails or finishes there) halts, so
    /// the later positions leave it as it is (`M_VERIFY`, `M_HALTS`); the results are
    /// read back once, and the host keeps each row's positions up to its stop, as
    /// [`head::verify_by_steps`] does step by step.
    fn verify(
        &mut self,
        logits: &Logits<'_>,
        rows: &[usize],
        drafts: &[Vec<u32>],
    ) -> Result<Vec<SlotVerify>> {
        let start = head::verify_door(self.vocab, logits, rows, drafts)?;
        let mut v = Verifying::new(rows, drafts);
        if rows.is_empty() {
            // (as `verify_by_steps`: nothing to verify, nothing moves)
            return Ok(v.out);
        }
        let positions: Vec<Vec<usize>> = (0..=v.most()).map(|i| v.rows_at(i)).collect();
        // the logits position by position (a position's rows back to back) and the
        // drafted tokens the same way (NO_TOKEN at a row's last position)
        let row_bytes = logits.vocab() * logits.dtype().size();
        let all = logits_bytes(logits);
        let mut bytes = Vec::with_capacity(all.len());
        let mut words = Vec::with_capacity(logits.rows());
        for (i, idx) in positions.iter().enumerate() {
            for &r in idx {
                let at = (start[r] + i) * row_bytes;
                bytes.extend_from_slice(&all[at..at + row_bytes]);
                words.push(drafts[r].get(i).copied().unwrap_or(NO_TOKEN));
            }
        }
        let buf = self.upload_host(bytes);
        let base = self.slots * SLOT_LIST_WORDS;
        self.grow_lists(base + words.len());
        self.ctx.queue().write_buffer(
            &self.bufs.lists.buf,
            (base * 4) as u64,
            bytemuck::cast_slice(&words),
        );
        let first = self.next_step;
        let ctx = self.ctx.clone();
        let mut refused = false;
        let submitted = ctx.submit_checked(|enc| {
            let mut done = 0;
            for (i, idx) in positions.iter().enumerate() {
                let view = DeviceLogits {
                    buffer: &buf,
                    dtype: logits.dtype(),
                    rows: idx.len(),
                    vocab: logits.vocab(),
                    row_stride: logits.vocab(),
                    offset: done * logits.vocab(),
                };
                self.verifying = Some(((base + done) as u32, i > 0));
                let slots: Vec<usize> = idx.iter().map(|&r| rows[r]).collect();
                let recorded = self.record_step_with(enc, &view, None, &slots, Stamping::None);
                self.verifying = None;
                refused = recorded.is_err();
                recorded?;
                done += idx.len();
            }
            Ok(())
        });
        if refused {
            // a position was refused and nothing was submitted: the readbacks the
            // recorded positions took are free again, and the next step writes its call
            // block anew
            for r in &mut self.ring {
                if r.step.as_ref().is_some_and(|s| s.0 >= first) {
                    r.step = None;
                }
            }
            self.current = None;
            self.next_step = first;
        }
        submitted?;
        let mut results: BTreeMap<StepId, Vec<SlotStep>> = self
            .wait()?
            .into_iter()
            .filter(|s| s.id >= first)
            .map(|s| (s.id, s.rows))
            .collect();
        for (i, idx) in positions.iter().enumerate() {
            let steps = results.remove(&(first + i as StepId)).ok_or_else(|| {
                Error::Device("a verify position's results never came back".into())
            })?;
            // the rows still going take this position's results; the others halted
            // before it (their rows report a finished slot, which is not theirs)
            let going = v.going_at(i);
            let (keep, steps): (Vec<usize>, Vec<SlotStep>) = idx
                .iter()
                .zip(steps)
                .filter(|(r, _)| going.contains(r))
                .map(|(&r, st)| (r, st))
                .unzip();
            v.take(i, &keep, steps);
        }
        Ok(v.out)
    }

    /// Host masks are uploaded with the logits and applied on the device
    /// ([`WgpuHead::record_step_masked`]); a row without one allows every token.
    fn step_masked(
        &mut self,
        logits: &Logits<'_>,
        rows: &[usize],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<SlotStep>> {
        let joined: Vec<bool> = self.host.iter().map(Option::is_some).collect();
        head::step_door(
            rows,
            &joined,
            logits.rows(),
            logits.vocab(),
            self.vocab,
            masks,
        )?;
        let w = logits.vocab().div_ceil(32);
        let masked = masks.iter().any(Option::is_some);
        if masked {
            let words: Vec<u32> = masks
                .iter()
                .flat_map(|m| m.map_or_else(|| vec![u32::MAX; w], <[u32]>::to_vec))
                .collect();
            self.mask_upload
                .ensure(self.ctx.device(), (words.len() as u64 * 4).max(4));
            self.ctx
                .queue()
                .write_buffer(&self.mask_upload.buf, 0, bytemuck::cast_slice(&words));
        }
        // host logits: uploaded into the head's buffer, then a device step
        let buf = self.upload_host(logits_bytes(logits).to_vec());
        let view = DeviceLogits::packed(&buf, logits);
        let mask_buf = self.mask_upload.buf.clone();
        let mask_view = masked.then_some(DeviceMasks {
            buffer: &mask_buf,
            offset: 0,
            row_stride: w,
        });
        let ctx = self.ctx.clone();
        let id = ctx.submit_checked(|enc| {
            self.record_step_with(enc, &view, mask_view.as_ref(), rows, Stamping::None)
        })?;
        let done = self.wait()?;
        done.into_iter()
            .find(|s| s.id == id)
            .map(|s| s.rows)
            .ok_or_else(|| Error::Device("the step's results never came back".into()))
    }
}

impl WgpuHead {
    /// Builds the pipelines a step of a slot with these parameters runs (its plan alone;
    /// a step's plan is its rows' largest, so every step finds its pipelines built).
    fn build_for(&self, params: &SamplingParams) {
        let needs = RowNeeds::of(row_flags(params, self.vocab), params.temperature);
        self.kernels.build_for(Plan::of([needs], false, false));
    }

    /// Writes the last `DRY_CAP` tokens of a joining slot's history into its DRY ring
    /// (token `i` of the history at `i % DRY_CAP`), which `finish` extends.
    fn write_ring(&mut self, slot: usize, prompt: &[u32], output: &[u32]) {
        let len = prompt.len() + output.len();
        let mut ring = vec![0u32; DRY_CAP];
        for (i, &t) in prompt
            .iter()
            .chain(output)
            .enumerate()
            .skip(len.saturating_sub(DRY_CAP))
        {
            ring[i % DRY_CAP] = t;
        }
        let at = (slot * kernels::pen_words(self.vocab) + kernels::dry_ring_offset(self.vocab)) * 4;
        self.ctx
            .queue()
            .write_buffer(&self.bufs.pen.buf, at as u64, bytemuck::cast_slice(&ring));
    }

    /// Host bytes (logits) into the head's upload buffer, padded to whole words.
    fn upload_host(&mut self, mut bytes: Vec<u8>) -> wgpu::Buffer {
        let size = (bytes.len() as u64).next_multiple_of(4).max(4);
        bytes.resize(size as usize, 0);
        self.upload.ensure(self.ctx.device(), size);
        let buf = self.upload.buf.clone();
        self.ctx.queue().write_buffer(&buf, 0, &bytes);
        buf
    }

    /// Makes the lists buffer hold `words` words, keeping what the slots' regions hold.
    fn grow_lists(&mut self, words: usize) {
        let bytes = (words.max(1) * 4) as u64;
        let old = self.bufs.lists.buf.clone();
        if old.size() >= bytes {
            return;
        }
        self.bufs.lists.ensure(self.ctx.device(), bytes);
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(&old, 0, &self.bufs.lists.buf, 0, old.size());
        self.ctx.queue().submit([enc.finish()]);
        self.bufs.generation += 1;
    }

    /// Clears the bias bits of `old` and sets those of `new` for `slot` (a join of an
    /// empty history with the new bias list after wiping the old bias words).
    fn rebuild_bias_bits(
        &mut self,
        slot: usize,
        old: &BTreeMap<u32, f32>,
        new: &BTreeMap<u32, f32>,
    ) -> Result<()> {
        let bm = self.vocab.div_ceil(32);
        let base = (slot * kernels::pen_words(self.vocab) + bm) * 4;
        for &t in old.keys() {
            self.ctx.queue().write_buffer(
                &self.bufs.pen.buf,
                (base + (t as usize >> 5) * 4) as u64,
                &[0u8; 4],
            );
        }
        if !new.is_empty() {
            // the join kernel with an empty history sets the new bias bits
            self.run_op(slot, true, &[])?;
        }
        Ok(())
    }
}

fn logits_bytes<'a>(logits: &Logits<'a>) -> &'a [u8] {
    use crate::logits::LogitsData;
    use half::slice::HalfFloatSliceExt;
    match logits.data() {
        LogitsData::F32(d) => bytemuck::cast_slice(d),
        LogitsData::F16(d) => bytemuck::cast_slice(d.reinterpret_cast()),
        LogitsData::Bf16(d) => bytemuck::cast_slice(d.reinterpret_cast()),
    }
}
