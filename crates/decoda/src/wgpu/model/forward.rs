//! The device model as speculative decoding's [`Forward`]: several positions of several
//! slots in one call (the prompt's path: tokens and the row map written from the host),
//! logits for every position read back, and positions dropped by moving a slot's
//! position back. The products sum a row the same way however many rows a call holds,
//! tiled or row by row, and the MoE layer's branches give the same bits, so every
//! position's logits are those a one-position decode step gives
//! (`wgpu_positions_per_call_do_not_change_the_logits`).

use crate::error::{Error, Result};
use crate::model::speculate::{check_segments, Forward};

use super::super::buffers::make_buffer;
use super::super::profile::Passes;
use super::engine::read_f32;
use super::plan::{PlanKey, Tokens};
use super::{WgpuModel, ROW_LAST};

impl WgpuModel {
    /// Makes the logits buffer hold at least `rows` rows (new plans bind the new one).
    fn logits_for(&mut self, rows: usize) -> Result<()> {
        if rows <= self.logits_rows {
            return Ok(());
        }
        let v = self.model.config().vocab_size;
        let bytes = rows * v * 4;
        let limit = self.ctx.device().limits().max_storage_buffer_binding_size as usize;
        if bytes > limit {
            return Err(Error::Model(format!(
                "{rows} rows of logits need {bytes} bytes; this adapter binds at most {limit}"
            )));
        }
        self.logits = make_buffer(
            self.ctx.device(),
            "decoda model logits",
            bytes.next_multiple_of(16) as u64,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        );
        self.logits_rows = rows;
        // every plan bound the old buffer
        self.plans.clear();
        Ok(())
    }

    /// Most rows one call of [`Forward::extend`] runs: the call's row limit, and the
    /// logits rows one binding holds.
    fn extend_rows(&self) -> usize {
        let v = self.model.config().vocab_size;
        let limit = self.ctx.device().limits().max_storage_buffer_binding_size as usize;
        self.max_rows.min(limit / (v * 4)).max(1)
    }

    /// One call of `rows` (slot, token), in order, each slot's rows consecutive
    /// positions from its current one; returns their logits.
    fn extend_call(&mut self, rows: &[(usize, u32)]) -> Result<Vec<f32>> {
        let n = rows.len();
        let mut map = Vec::with_capacity(4 * n);
        let mut seen = vec![0u32; self.slots];
        for (r, &(slot, _)) in rows.iter().enumerate() {
            let last = rows[r + 1..].iter().all(|&(s, _)| s != slot);
            map.extend([
                slot as u32,
                seen[slot],
                r as u32,
                if last { ROW_LAST } else { 0 },
            ]);
            seen[slot] += 1;
        }
        let tokens: Vec<u32> = rows.iter().map(|r| r.1).collect();
        self.logits_for(n)?;
        let q = self.ctx.queue();
        q.write_buffer(&self.prompt_tokens, 0, bytemuck::cast_slice(&tokens));
        q.write_buffer(
            &self.ctl,
            (self.map_off_prompt() * 4) as u64,
            bytemuck::cast_slice(&map),
        );
        let key = PlanKey {
            rows: n,
            map_off: self.map_off_prompt(),
            tokens: Tokens::Prompt,
            out: Some((0, 0, n)),
        };
        self.call_positions.clear();
        let mut at = self.positions.clone();
        for &(slot, _) in rows {
            self.call_positions.push(at[slot]);
            at[slot] += 1;
        }
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&Default::default());
        self.record(&mut Passes::new(&mut enc, None), key)?;
        self.ctx.queue().submit([enc.finish()]);
        self.positions = at;
        read_f32(&self.ctx, &self.logits, n * self.model.config().vocab_size)
    }
}

impl Forward for WgpuModel {
    fn name(&self) -> String {
        format!("wgpu:{}", self.ctx.adapter())
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn max_positions(&self) -> Option<usize> {
        Some(self.max_pos)
    }

    fn prefill(&mut self, slot: usize, prompt: &[u32]) -> Result<Vec<f32>> {
        crate::head::check_slot(slot, self.slots)?;
        if prompt.is_empty() {
            return Err(Error::Model(format!("slot {slot}: the prompt is empty")));
        }
        self.reset(slot);
        WgpuModel::prefill(self, slot, prompt, 0)?;
        read_f32(&self.ctx, &self.logits, self.model.config().vocab_size)
    }

    fn extend(&mut self, segments: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        let v = self.model.config().vocab_size;
        check_segments(segments, self.slots, v)?;
        let mut rows = Vec::new();
        for &(slot, toks) in segments {
            if self.positions[slot] + toks.len() > self.max_pos {
                return Err(Error::Model(format!(
                    "slot {slot}: {} tokens exceed the {} positions the cache holds",
                    self.positions[slot] + toks.len(),
                    self.max_pos
                )));
            }
            rows.extend(toks.iter().map(|&t| (slot, t)));
        }
        let mut out = Vec::with_capacity(rows.len() * v);
        for chunk in rows.chunks(self.extend_rows()) {
            out.extend(self.extend_call(chunk)?);
        }
        Ok(out)
    }

    fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        crate::head::check_slot(slot, self.slots)?;
        if len > self.positions[slot] {
            return Err(Error::Model(format!(
                "slot {slot}: cannot keep {len} positions of {}",
                self.positions[slot]
            )));
        }
        self.positions[slot] = len;
        self.ctx
            .queue()
            .write_buffer(&self.ctl, (slot * 4) as u64, &(len as u32).to_le_bytes());
        Ok(())
    }

    fn positions(&self, slot: usize) -> usize {
        self.positions.get(slot).copied().unwrap_or(0)
    }

    fn fork(&mut self, from: usize, to: usize) -> Result<bool> {
        crate::head::check_slot(from, self.slots)?;
        crate::head::check_slot(to, self.slots)?;
        if from != to {
            // the logits rows are the host's (read back); row 0 onto itself is a no-op copy
            WgpuModel::fork(self, from, to, 0, 0)?;
        }
        Ok(true)
    }
}
