//! The model and a sampling head on one device: [`WgpuEngine`], the generation loop's
//! engine, and the comparison that copies the logits to the host instead.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::head::{Head, SlotRequest, SlotStep};
use crate::logits::{DType, Logits};
use crate::model::generate::Engine;
use crate::model::ops::ModelWeights;
use crate::moe::Dispatch;

use super::super::buffers::make_buffer;
use super::super::device::WgpuDevice;
use super::super::head::WgpuHead;
use super::super::profile::{Passes, Profiler};
use super::super::views::DeviceLogits;
use super::{Tokens, WgpuModel};
use crate::profile::StepProfile;

/// The model and a sampling head on one device: the generation loop's [`Engine`].
pub struct WgpuEngine {
    model: WgpuModel,
    head: WgpuHead,
    /// `--host-sampling`: the logits go to the host each step and a host head samples them.
    host: Option<HostSampling>,
    pending: Vec<Vec<SlotStep>>,
    /// The submissions of the decode steps in flight, oldest first.
    in_flight: std::collections::VecDeque<wgpu::SubmissionIndex>,
    /// Compute dispatches of the last decode step (the head's and the forward's).
    last_dispatches: usize,
    /// Profiling: the step's timestamps and plans, and the steps profiled so far.
    profiler: Option<Profiler>,
    profile: StepProfile,
}

struct HostSampling {
    head: Box<dyn Head + Send>,
    read: wgpu::Buffer,
}

impl std::fmt::Debug for WgpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuEngine")
            .field("model", &self.model)
            .finish()
    }
}

impl WgpuEngine {
    /// `model` on a device (a [`WgpuDevice`], or a [`WgpuSampler`](super::super::WgpuSampler) on one) with
    /// `slots` slots of `positions` positions each.
    /// With `host_head` (for example `decoda::CpuHead::new(slots, vocab)`), each step
    /// copies the logits to the host and that head samples them there (the comparison the
    /// benchmarks make); it needs `slots` slots of the model's vocabulary.
    pub fn new(
        on: &impl AsRef<WgpuDevice>,
        model: Arc<dyn ModelWeights>,
        slots: usize,
        positions: usize,
        host_head: Option<Box<dyn Head + Send>>,
    ) -> Result<Self> {
        let v = model.config().vocab_size;
        let mut m = WgpuModel::new(on, model, slots, positions)?;
        let head = WgpuHead::new(on, slots, v)?;
        m.head_tokens = Some(head.tokens().clone());
        let host = match host_head {
            Some(head) => {
                if head.slots() < slots || head.vocab() != v {
                    return Err(Error::Shape(format!(
                        "a host head of {} slots of {} tokens for {slots} slots of {v}",
                        head.slots(),
                        head.vocab()
                    )));
                }
                Some(HostSampling {
                    head,
                    read: make_buffer(
                        m.ctx.device(),
                        "decoda logits readback",
                        (slots * v * 4) as u64,
                        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    ),
                })
            }
            None => None,
        };
        Ok(Self {
            model: m,
            head,
            host,
            pending: Vec::new(),
            in_flight: std::collections::VecDeque::new(),
            last_dispatches: 0,
            profiler: None,
            profile: StepProfile::default(),
        })
    }

    /// The model (its logits buffer, for tests).
    pub fn model(&self) -> &WgpuModel {
        &self.model
    }

    /// Bytes the engine has written from the host for decode steps (the row map when
    /// the batch changes); joins and prefills are not counted.
    pub fn decode_bytes_written(&self) -> u64 {
        self.head.host_bytes_written()
    }
}

impl WgpuEngine {
    /// Submits a step; when profiling, with its timestamps resolved, and waits for it
    /// to read them (a profiled step runs alone).
    fn submit_profiled(&mut self, mut enc: wgpu::CommandEncoder) -> Result<wgpu::SubmissionIndex> {
        let ctx = self.model.ctx.clone();
        match self.profiler.as_mut() {
            None => Ok(ctx.queue().submit([enc.finish()])),
            Some(p) => {
                p.resolve(&mut enc);
                let index = ctx.queue().submit([enc.finish()]);
                let step = p.finish(&ctx)?;
                self.profile.push_step(step);
                Ok(index)
            }
        }
    }
}

/// The first `n` floats of `buf`, copied to a readback buffer and read back.
pub(super) fn read_f32(ctx: &WgpuDevice, buf: &wgpu::Buffer, n: usize) -> Result<Vec<f32>> {
    let bytes = (n * 4) as u64;
    let read = make_buffer(
        ctx.device(),
        "decoda read",
        bytes.max(4),
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    );
    let mut enc = ctx.device().create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buf, 0, &read, 0, bytes);
    ctx.queue().submit([enc.finish()]);
    ctx.read_back(&read, bytes)
}

impl Engine for WgpuEngine {
    fn name(&self) -> String {
        format!("wgpu:{}", self.model.ctx.adapter())
    }

    fn vocab(&self) -> usize {
        self.model.model.config().vocab_size
    }

    fn max_positions(&self) -> Option<usize> {
        self.model.model.config().max_position_embeddings
    }

    fn slots(&self) -> usize {
        self.model.slots
    }

    fn start(
        &mut self,
        slot: usize,
        request: SlotRequest,
        prompt: &[u32],
        logits_row: usize,
    ) -> Result<Vec<Dispatch>> {
        if slot >= self.model.slots || logits_row >= self.model.slots {
            return Err(Error::Model(format!(
                "slot {slot}, logits row {logits_row}: the engine has {} slots",
                self.model.slots
            )));
        }
        if prompt.is_empty() {
            return Err(Error::Model(format!("slot {slot}: the prompt is empty")));
        }
        match &mut self.host {
            Some(h) => {
                h.head.join(slot, request)?;
            }
            None => {
                self.head.join(slot, request)?;
            }
        }
        self.model.reset(slot);
        let b = self.model.prefill(slot, prompt, logits_row)?;
        self.model
            .ctx
            .device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
        Ok(b)
    }

    fn fork(
        &mut self,
        from: usize,
        from_row: usize,
        slot: usize,
        request: SlotRequest,
        logits_row: usize,
    ) -> Result<bool> {
        let n = self.model.slots;
        if from >= n || slot >= n || from_row >= n || logits_row >= n {
            return Err(Error::Model(format!(
                "fork {from} -> {slot} (logits rows {from_row} -> {logits_row}): the engine has {n} slots"
            )));
        }
        match &mut self.host {
            Some(h) => {
                h.head.join(slot, request)?;
            }
            None => {
                self.head.join(slot, request)?;
            }
        }
        self.model.fork(from, slot, from_row, logits_row)?;
        Ok(true)
    }

    fn step(&mut self, sample: &[usize], forward: &[usize]) -> Result<Vec<Dispatch>> {
        let v = self.vocab();
        if let Some(h) = &self.host {
            self.last_dispatches = 0;
            // the comparison: logits to the host, sampled there, tokens back
            let (read, words) = (h.read.clone(), sample.len() * v);
            let mut enc = self
                .model
                .ctx
                .device()
                .create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&self.model.logits, 0, &read, 0, (words * 4) as u64);
            self.model.ctx.queue().submit([enc.finish()]);
            let logits: Vec<f32> = self.model.ctx.read_back(&read, (words * 4) as u64)?;
            let Some(h) = self.host.as_mut() else {
                return Err(Error::Model("host sampling without its head".into()));
            };
            let rows = h
                .head
                .step(&Logits::f32(&logits, sample.len(), v)?, sample)?;
            let mut toks = vec![0u32; sample.len()];
            for (r, row) in rows.iter().enumerate() {
                toks[r] = row.result.as_ref().map_or(0, |s| s.token);
            }
            self.pending.push(rows);
            if forward.is_empty() {
                return Ok(Vec::new());
            }
            self.model.ctx.queue().write_buffer(
                &self.model.host_tokens,
                0,
                bytemuck::cast_slice(&toks),
            );
            let map: Vec<(usize, usize)> = forward
                .iter()
                .map(|s| (*s, sample.iter().position(|x| x == s).unwrap_or(0)))
                .collect();
            let mut enc = self
                .model
                .ctx
                .device()
                .create_command_encoder(&Default::default());
            let mut passes = Passes::new(&mut enc, self.profiler.as_mut());
            let b = self.model.record_decode(&mut passes, &map, Tokens::Host)?;
            drop(passes);
            // the model's dispatches (the host samples: none of the head's)
            self.last_dispatches = self.model.last_dispatches;
            self.submit_profiled(enc)?;
            return Ok(b);
        }
        let mut enc = self
            .model
            .ctx
            .device()
            .create_command_encoder(&Default::default());
        let view = DeviceLogits {
            buffer: &self.model.logits,
            dtype: DType::F32,
            rows: sample.len(),
            vocab: v,
            row_stride: v,
            offset: 0,
        };
        match self.profiler.as_mut() {
            Some(p) => self.head.record_step_profiled(&mut enc, &view, sample, p)?,
            None => self.head.record_step(&mut enc, &view, sample)?,
        };
        self.last_dispatches = self.head.step_dispatches();
        let mut b = Vec::new();
        if !forward.is_empty() {
            let map: Vec<(usize, usize)> = forward
                .iter()
                .map(|s| (*s, sample.iter().position(|x| x == s).unwrap_or(0)))
                .collect();
            let mut passes = Passes::new(&mut enc, self.profiler.as_mut());
            b = self.model.record_decode(&mut passes, &map, Tokens::Head)?;
            drop(passes);
            self.last_dispatches += self.model.last_dispatches;
        }
        let index = self.submit_profiled(enc)?;
        self.in_flight.push_back(index);
        Ok(b)
    }

    fn set_profile(&mut self, on: bool) -> bool {
        self.profiler = on.then(|| Profiler::new(&self.model.ctx));
        true
    }

    fn profile(&self) -> StepProfile {
        self.profile.clone()
    }

    fn poll(&mut self) -> Result<Vec<Vec<SlotStep>>> {
        let mut out = std::mem::take(&mut self.pending);
        if self.host.is_none() {
            let done = self.head.poll()?;
            // the head returns steps oldest first: theirs are the oldest submissions
            self.in_flight.drain(..done.len().min(self.in_flight.len()));
            out.extend(done.into_iter().map(|s| s.rows));
        }
        Ok(out)
    }

    fn wait(&mut self) -> Result<Vec<Vec<SlotStep>>> {
        let mut out = std::mem::take(&mut self.pending);
        if self.host.is_none() {
            out.extend(self.head.wait()?.into_iter().map(|s| s.rows));
        }
        self.in_flight.clear();
        Ok(out)
    }

    fn wait_oldest(&mut self) -> Result<Vec<Vec<SlotStep>>> {
        let oldest = match self.in_flight.front() {
            Some(i) if self.host.is_none() => i.clone(),
            _ => return self.wait(),
        };
        self.model
            .ctx
            .device()
            .poll(wgpu::PollType::Wait {
                submission_index: Some(oldest),
                timeout: None,
            })
            .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
        // the oldest step's results, and any later ones already in
        self.poll()
    }

    fn step_dispatches(&self) -> Option<usize> {
        Some(self.last_dispatches)
    }

    fn leave(&mut self, slot: usize) -> Result<()> {
        match &mut self.host {
            Some(h) => h.head.leave(slot),
            None => self.head.leave(slot),
        }
    }

    fn read_logits(&mut self, rows: usize) -> Result<Vec<f32>> {
        if rows > self.model.slots {
            return Err(Error::Model(format!(
                "{rows} rows of logits asked; the engine has {} slots",
                self.model.slots
            )));
        }
        let v = self.model.model.config().vocab_size;
        read_f32(&self.model.ctx, &self.model.logits, rows * v)
    }

    fn ahead(&self) -> usize {
        if self.host.is_some() {
            1
        } else {
            3
        }
    }
}
