//! Data shared between the launcher and the WGSL kernels: the uniform and storage
//! structs (mirrored by `struct Call` and `struct SlotP` in `step/common.wgsl`),
//! the row flags, the sizes of the per-row scratch areas, and the workgroup memory the
//! kernels declare. The tests at the bottom read the shaders with naga and check every
//! one of these against what the WGSL says.

/// Invocations per workgroup of the row kernels (`@workgroup_size(256)`).
pub(crate) const WG: usize = 256;
/// Radix histogram words per row of the full-row path (`HW` in the shader).
pub(crate) const HIST_WORDS: usize = 6144;
/// The first words of `ctr` (`IND_WORDS`), before the rows' counters and histograms:
/// the indirect grids of a lean call's tail, `lp`'s (`splits`, the rows on the full-row
/// path, one) then `finish`'s (those rows, one, one), two words unused; copied to the
/// grid buffer before the tail (`Kernels::record_step`).
pub(crate) const IND_ARGS: usize = 8;
/// State words per row (`ST`).
pub(crate) const STATE_WORDS: usize = 72;
/// Partial-result words per (row, split) (`PW`).
pub(crate) const PART_WORDS: usize = 64;
/// Log-probability words per row (`LPW`).
pub(crate) const LP_WORDS: usize = 44;
/// Result words per row: status, a status word, then the log-probabilities (`RESW`).
pub(crate) const RES_WORDS: usize = 46;
/// Most tokens a kept distribution lists ([`crate::params::MAX_KEPT`], `KEPTN`).
pub(crate) const KEPT_TOKENS: usize = crate::params::MAX_KEPT as usize;
/// Kept-distribution words per row (`KEPTW`): the set's size, the tokens listed, then
/// `KEPT_TOKENS` (id, probability bits) pairs.
pub(crate) const KEPT_WORDS: usize = 2 + 2 * KEPT_TOKENS;
/// The state word saying how a row was drawn (`S_PATH`).
pub(crate) const S_PATH: usize = 10;
/// `S_PATH` of a row drawn over the whole row (`P_FULL`): its candidate list did not
/// settle it.
pub(crate) const P_FULL: u32 = 1;
/// The state words the probe leaves a row (`S_KAPPA`, `S_GTHR`, `S_R`, `S_NEED`, `S_M0`,
/// `S_SD_R`, `S_SD_E`): what the scan keeps and sums.
pub(crate) const PROBE_WORDS: [(&str, usize); 7] = [
    ("S_KAPPA", 5),
    ("S_GTHR", 6),
    ("S_R", 7),
    ("S_NEED", 8),
    ("S_M0", 30),
    ("S_SD_R", 40),
    ("S_SD_E", 41),
];
/// The state word saying whether a top-n-σ row's sums were made after settle, by the
/// full-row path's first phase (`S_SD_WALK`: 1), the scan's being out of range.
pub(crate) const S_SD_WALK: usize = 42;
/// Slot-state words per slot (`SSW`): step (2), tokens generated (2), finished, history
/// length (`SS_HIST`), halted in the current verify (`SS_HALT`).
pub(crate) const SLOT_STATE_WORDS: usize = 8;
/// The slot-state word holding the history's length (a head's DRY ring).
pub(crate) const SS_HIST: usize = 5;
/// The slot-state word saying the slot stopped inside the head's current verify (its
/// draw differed from its drafted token, it failed or it finished): the verify's later
/// positions do not step it. (The host never reads it: the layout test checks it.)
#[cfg(test)]
pub(crate) const SS_HALT: usize = 6;
/// Tokens of a DRY window the kernels hold (`DRY_CAP`): a head slot's ring, a row's
/// repeat lengths and penalised tokens.
pub(crate) const DRY_CAP: usize = crate::params::MAX_DEVICE_DRY_WINDOW;
/// Candidates a row's list holds (a power of two).
pub(crate) const CAP: usize = 4096;
/// Most workgroups a row is cut into (the per-row kernels reduce at most `WG` partials).
pub(crate) const MAX_SPLITS: usize = 256;
/// Largest workgroup count of one dispatch dimension (WebGPU's default limit).
pub(crate) const MAX_GRID: usize = 65535;
/// Most logits one workgroup of a row kernel reads: 4096 per invocation. A loop that
/// runs longer is cut short by some drivers (Mesa's lavapipe stops a loop silently after
/// about 32,768 iterations), so rows are split to stay below this.
pub(crate) const MAX_CHUNK: usize = WG * 4096;
/// Workgroup memory the largest entry point declares, in bytes (checked against the
/// shaders by a test; the device must offer at least this much).
pub(crate) const WORKGROUP_BYTES: u32 = 11492;
/// Invocations per workgroup of `draw_many`; a draw is shared by 1 to 256 of them.
pub(crate) const DRAW_WG: usize = 256;
/// Groups of four tokens one invocation of `draw_many` handles at most before the draw
/// is shared by more invocations.
pub(crate) const DRAW_GROUPS_PER_LANE: usize = 64;

pub(crate) const F_TOUCH: u32 = 1;
pub(crate) const F_LOGPROBS: u32 = 2;
pub(crate) const F_PROCESSED: u32 = 4;
pub(crate) const F_TOP_P: u32 = 8;
pub(crate) const F_TOP_K: u32 = 16;
pub(crate) const F_MIN_P: u32 = 32;
/// Stage 3a (DRY): the probe computes the slot's penalised tokens (`step/dry.wgsl`).
pub(crate) const F_DRY: u32 = 64;
/// Stage 5a (top-n-σ): the row takes the full-row path, which computes its threshold
/// first (`step/sigma.wgsl`).
pub(crate) const F_TOP_N_SIGMA: u32 = 128;
/// Stage 8a (XTC) is on: settle draws its coin at the slot's step; when it fires the
/// row is filtered (list or full-row path) and its top choices removed.
pub(crate) const F_XTC: u32 = 256;
/// Stage 6a (typical-p): its band after top-k, on the candidate list when the list
/// holds it, else on the full-row path (`step/typical.wgsl`).
pub(crate) const F_TYPICAL: u32 = 512;
/// The kept distribution is asked for: written to the row's kept area of the results
/// (`Call.kept_base`); an unfiltered row takes the full-row path (`step/kept.wgsl`).
pub(crate) const F_KEPT: u32 = 1024;

/// `Call.mode`: advance the slot state in `finish` (a head's step).
pub(crate) const M_HEAD: u32 = 1;
/// `Call.mode`: per-call rows scatter their history in `probe` and clear it in `finish`.
pub(crate) const M_SCATTER: u32 = 2;
/// `Call.mode`: no probe ran (no row of the call has filters); `scan` reads no row state.
pub(crate) const M_LIGHT: u32 = 4;
/// `Call.mode`: the lean plan ([`super::kernels::Plan::Lean`]): `settle_finish` (or
/// `draw_finish`) leaves rows on the full-row path to `lp` and `finish`, and `finish`
/// every other row alone.
pub(crate) const M_LEAN: u32 = 32;
/// `Call.mode`: a token mask is bound (`masks`, `Call.mask_base`, `Call.mask_stride`):
/// a token whose bit is clear reads as `-inf`.
pub(crate) const M_MASK: u32 = 8;
/// `Call.mode` (with `M_MASK`): masks are indexed by the row's slot (`rmap[row]`), a
/// head's fixed per-slot masks, instead of by the row.
pub(crate) const M_SLOT_MASK: u32 = 16;
/// `Call.mode`: a head's verify position: `finish` halts the slot of a row whose result
/// is not its drafted token (`Call.verify`), has failed or has finished.
pub(crate) const M_VERIFY: u32 = 64;
/// `Call.mode` (with `M_VERIFY`): a position after the first: a halted slot does not
/// step (its row reports a finished slot, which the verify drops).
pub(crate) const M_HALTS: u32 = 128;

/// Status codes the kernels write per row (first result word).
pub(crate) const STATUS_OK: u32 = 0;
pub(crate) const STATUS_NON_FINITE: u32 = 1;
pub(crate) const STATUS_NO_CANDIDATE: u32 = 2;
/// The kept set was not empty, yet no token won: a defect, reported as a row error.
pub(crate) const STATUS_NO_WINNER: u32 = 3;
/// The row's slot had already finished (a head's step).
pub(crate) const STATUS_FINISHED: u32 = 4;
/// Token written where a draw found no winner (`draw_many`).
pub(crate) const NO_TOKEN: u32 = 0xffff_ffff;

/// The call's uniform block (`struct Call`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CallU {
    pub rows: u32,
    pub vocab: u32,
    pub stride: u32,
    pub dtype: u32,
    pub base: u32,
    pub splits: u32,
    pub chunk: u32,
    pub bm_words: u32,
    pub cap: u32,
    pub mode: u32,
    pub draws: u32,
    /// Invocations sharing one draw in `draw_many` (a power of two, 1 to 256).
    pub draw_lanes: u32,
    pub part_base: u32,
    pub cand_base: u32,
    /// Always 0: read by `fp`, which the compiler cannot fold away.
    pub zero: u32,
    /// Word offset of row 0's mask in `masks` (with `M_MASK`).
    pub mask_base: u32,
    /// Words between rows' masks.
    pub mask_stride: u32,
    /// Word offset in the results of row 0's kept area (rows with `F_KEPT`), rows
    /// `KEPT_WORDS` apart.
    pub kept_base: u32,
    pub sample_chunk: u32,
    /// A head's verify position (`M_VERIFY`): word offset in `lists` of row 0's drafted
    /// token (`NO_TOKEN` at a row's last position).
    pub verify: u32,
}

/// One slot's parameters (`struct SlotP`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct SlotU {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub ln_min_p: f32,
    pub rep: f32,
    pub freq: f32,
    pub pres: f32,
    pub flags: u32,
    pub seed_lo: u32,
    pub seed_hi: u32,
    pub n_lp: u32,
    pub bias_off: u32,
    pub bias_len: u32,
    pub stop_off: u32,
    pub stop_len: u32,
    pub hist_off: u32,
    pub hist_len: u32,
    pub max_lo: u32,
    pub max_hi: u32,
    pub pen_slot: u32,
    pub dry_allowed: u32,
    /// DRY's window (`u32::MAX`: the whole history).
    pub dry_n: u32,
    pub dry_tab_off: u32,
    pub dry_tab_len: u32,
    pub dry_brk_off: u32,
    pub dry_brk_len: u32,
    /// Stage 5a's `n` (with `F_TOP_N_SIGMA`).
    pub top_n_sigma: f32,
    /// Stage 8a's probability (with `F_XTC`).
    pub xtc_p: f32,
    /// Stage 8a's threshold (with `F_XTC`).
    pub xtc_thr: f32,
    /// Stage 6a's `p` (with `F_TYPICAL`).
    pub typical_p: f32,
    /// Tokens the kept distribution lists (with `F_KEPT`).
    pub n_kept: u32,
}

/// Storage buffers one kernel binds.
pub(crate) const STORAGE_BUFFERS: u32 = 11;

#[cfg(test)]
mod tests {
    //! The layouts above against the WGSL, through naga's reflection of the module.
    use super::*;

    fn module(subgroups: bool) -> (naga::Module, naga::valid::ModuleInfo) {
        let src = super::super::shaders::shader_source(subgroups);
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("WGSL parse error:\n{}", e.emit_to_string(&src)));
        let caps = if subgroups {
            naga::valid::Capabilities::SUBGROUP
        } else {
            naga::valid::Capabilities::empty()
        };
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("validation error:\n{}", e.emit_to_string(&src)));
        (module, info)
    }

    /// (member name, byte offset, byte size) of a WGSL struct.
    fn wgsl_struct(m: &naga::Module, name: &str) -> (Vec<(String, u32, u32)>, u32) {
        let gctx = m.to_ctx();
        for (_, ty) in m.types.iter() {
            if ty.name.as_deref() != Some(name) {
                continue;
            }
            if let naga::TypeInner::Struct { members, span } = &ty.inner {
                let v = members
                    .iter()
                    .map(|mb| {
                        (
                            mb.name.clone().unwrap_or_default(),
                            mb.offset,
                            m.types[mb.ty].inner.size(gctx),
                        )
                    })
                    .collect();
                return (v, *span);
            }
        }
        panic!("no struct {name} in the shader");
    }

    fn check(m: &naga::Module, wgsl: &str, rust_size: usize, rust: &[(&str, usize, usize)]) {
        let (members, span) = wgsl_struct(m, wgsl);
        assert_eq!(span as usize, rust_size, "{wgsl}: size");
        assert_eq!(members.len(), rust.len(), "{wgsl}: member count");
        for ((name, off, size), (rname, roff, rsize)) in members.iter().zip(rust) {
            assert_eq!(name, rname, "{wgsl}: member order");
            assert_eq!(*off as usize, *roff, "{wgsl}.{name}: offset");
            assert_eq!(*size as usize, *rsize, "{wgsl}.{name}: size");
        }
    }

    macro_rules! fields {
        ($t:ty; $($f:ident),*) => {
            [$((stringify!($f), std::mem::offset_of!($t, $f), {
                let v = <$t>::default();
                std::mem::size_of_val(&v.$f)
            })),*]
        };
    }

    #[test]
    fn rust_structs_match_the_wgsl() {
        for sg in [false, true] {
            let (m, _) = module(sg);
            check(
                &m,
                "Call",
                std::mem::size_of::<CallU>(),
                &fields!(CallU; rows, vocab, stride, dtype, base, splits, chunk, bm_words,
                    cap, mode, draws, draw_lanes, part_base, cand_base, zero, mask_base,
                    mask_stride, kept_base, sample_chunk, verify),
            );
            check(
                &m,
                "SlotP",
                std::mem::size_of::<SlotU>(),
                &fields!(SlotU; temperature, top_k, top_p, ln_min_p, rep, freq, pres, flags,
                    seed_lo, seed_hi, n_lp, bias_off, bias_len, stop_off, stop_len, hist_off,
                    hist_len, max_lo, max_hi, pen_slot, dry_allowed, dry_n, dry_tab_off,
                    dry_tab_len, dry_brk_off, dry_brk_len, top_n_sigma, xtc_p,
                    xtc_thr, typical_p, n_kept),
            );
        }
    }

    fn parse(src: &str) -> naga::Module {
        let module = naga::front::wgsl::parse_str(src)
            .unwrap_or_else(|e| panic!("WGSL parse error:\n{}", e.emit_to_string(src)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("validation error:\n{}", e.emit_to_string(src)));
        module
    }

    /// The model's and the MoE kernels' parameter blocks against their WGSL.
    #[test]
    fn model_and_moe_params_match_the_wgsl() {
        use super::super::model::{model_shader_source, ModelOp};
        use super::super::moe::{moe_shader_source, MoeParams};
        let m = parse(&model_shader_source());
        check(
            &m,
            "Op",
            std::mem::size_of::<ModelOp>(),
            &fields!(ModelOp; rows, kind, in_w, out_w, dtype, bits, group, row_words, w_off,
                s_off, b_off, aux_off, src_w, dst_w, src_row0, dst_row0, groups, eps, heads,
                kv_heads, head_dim, max_pos, map_off, inplace, zero, out_off, scale, pad2),
        );
        assert_eq!(
            constant(&m, "ROW_LAST"),
            u64::from(super::super::model::ROW_LAST)
        );
        assert!(
            std::mem::size_of::<ModelOp>() as u64 <= super::super::model::OP_STRIDE,
            "a dispatch's parameters fit its block"
        );
        let m = parse(&moe_shader_source());
        check(
            &m,
            "Params",
            std::mem::size_of::<MoeParams>(),
            &fields!(MoeParams; tokens, top_k, experts, hidden, inter, sorted, router,
                separate, dtype, bits, group, zero, gate_w, gate_s, gate_b, up_w, up_s, up_b,
                down_w, down_s, down_b, w_idx_in, w_wt, w_order, w_idx, w_inv, w_off, w_act,
                w_out, e_lo, e_hi, accumulate, w_tb, w_tiles),
        );
    }

    /// The sharded-sampling summaries' call block and row parameters against their WGSL.
    #[test]
    fn shard_params_match_the_wgsl() {
        use super::super::shard::{shard_shader_source, ShardCallU, ShardRowU};
        {
            let src = shard_shader_source(false);
            let m = parse(&src);
            check(
                &m,
                "ShardCall",
                std::mem::size_of::<ShardCallU>(),
                &fields!(ShardCallU; rows, width, offset, stride, base, chunks, zero, dtype),
            );
            check(
                &m,
                "RowP",
                std::mem::size_of::<ShardRowU>(),
                &fields!(ShardRowU; flags, t, seed_lo, seed_hi, step_lo, step_hi, touch_off,
                    touch_len, mask_off, rep, freq, pres, kind, token, floor, vmax, thr_z,
                    thr_x, gz_off, gx_off),
            );
        }
    }

    fn constant(m: &naga::Module, name: &str) -> u64 {
        for (_, c) in m.constants.iter() {
            if c.name.as_deref() == Some(name) {
                if let naga::Expression::Literal(l) = m.global_expressions[c.init] {
                    return match l {
                        naga::Literal::U32(v) => u64::from(v),
                        naga::Literal::I32(v) => v as u64,
                        naga::Literal::AbstractInt(v) => v as u64,
                        other => panic!("{name}: {other:?}"),
                    };
                }
            }
        }
        panic!("no constant {name} in the shader");
    }

    #[test]
    fn constants_match_the_wgsl() {
        let (m, _) = module(false);
        for (name, v) in [
            ("WG", WG as u64),
            ("HW", HIST_WORDS as u64),
            ("IND_WORDS", IND_ARGS as u64),
            ("ST", STATE_WORDS as u64),
            ("S_PATH", S_PATH as u64),
            ("P_FULL", u64::from(P_FULL)),
            ("S_SD_WALK", S_SD_WALK as u64),
            ("S_KAPPA", PROBE_WORDS[0].1 as u64),
            ("S_GTHR", PROBE_WORDS[1].1 as u64),
            ("S_R", PROBE_WORDS[2].1 as u64),
            ("S_NEED", PROBE_WORDS[3].1 as u64),
            ("S_M0", PROBE_WORDS[4].1 as u64),
            ("S_SD_R", PROBE_WORDS[5].1 as u64),
            ("S_SD_E", PROBE_WORDS[6].1 as u64),
            ("PW", PART_WORDS as u64),
            ("LPW", LP_WORDS as u64),
            ("RESW", RES_WORDS as u64),
            ("SSW", SLOT_STATE_WORDS as u64),
            ("SS_HIST", SS_HIST as u64),
            ("SS_HALT", SS_HALT as u64),
            ("DRY_CAP", DRY_CAP as u64),
            ("F_DRY", u64::from(F_DRY)),
            ("F_TOP_N_SIGMA", u64::from(F_TOP_N_SIGMA)),
            ("F_XTC", u64::from(F_XTC)),
            ("F_TYPICAL", u64::from(F_TYPICAL)),
            ("F_KEPT", u64::from(F_KEPT)),
            ("KEPTN", KEPT_TOKENS as u64),
            ("KEPTW", KEPT_WORDS as u64),
            ("DRAW_WG", DRAW_WG as u64),
            ("F_TOUCH", u64::from(F_TOUCH)),
            ("F_LOGPROBS", u64::from(F_LOGPROBS)),
            ("F_PROCESSED", u64::from(F_PROCESSED)),
            ("F_TOP_P", u64::from(F_TOP_P)),
            ("F_TOP_K", u64::from(F_TOP_K)),
            ("F_MIN_P", u64::from(F_MIN_P)),
            ("M_HEAD", u64::from(M_HEAD)),
            ("M_SCATTER", u64::from(M_SCATTER)),
            ("M_LIGHT", u64::from(M_LIGHT)),
            ("M_LEAN", u64::from(M_LEAN)),
            ("M_MASK", u64::from(M_MASK)),
            ("M_SLOT_MASK", u64::from(M_SLOT_MASK)),
            ("M_VERIFY", u64::from(M_VERIFY)),
            ("M_HALTS", u64::from(M_HALTS)),
            ("OUT_NON_FINITE", u64::from(STATUS_NON_FINITE)),
            ("OUT_NO_CANDIDATE", u64::from(STATUS_NO_CANDIDATE)),
            ("OUT_NO_WINNER", u64::from(STATUS_NO_WINNER)),
            ("OUT_FINISHED", u64::from(STATUS_FINISHED)),
            ("NO_TOKEN", u64::from(NO_TOKEN)),
        ] {
            assert_eq!(constant(&m, name), v, "constant {name}");
        }
    }

    /// Bytes of workgroup memory each entry point uses (every `var<workgroup>` it or a
    /// function it calls touches).
    fn workgroup_bytes(m: &naga::Module, info: &naga::valid::ModuleInfo) -> Vec<(String, u32)> {
        let gctx = m.to_ctx();
        m.entry_points
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let ei = info.get_entry_point(i);
                let bytes = m
                    .global_variables
                    .iter()
                    .filter(|(h, g)| g.space == naga::AddressSpace::WorkGroup && !ei[*h].is_empty())
                    .map(|(_, g)| m.types[g.ty].inner.size(gctx))
                    .sum();
                (ep.name.clone(), bytes)
            })
            .collect()
    }

    #[test]
    fn workgroup_memory_is_what_the_launcher_checks() {
        let mut largest = 0;
        for sg in [false, true] {
            let (m, info) = module(sg);
            for (name, bytes) in workgroup_bytes(&m, &info) {
                assert!(
                    bytes <= 16384,
                    "{name} uses {bytes} bytes of workgroup memory; WebGPU guarantees 16384"
                );
                largest = largest.max(bytes);
            }
        }
        assert_eq!(
            largest, WORKGROUP_BYTES,
            "WORKGROUP_BYTES must be the largest entry point's use"
        );
    }

    /// The matrix products' and the MoE layer's modules (every weight format, both input
    /// loads, with and without subgroups) fit every entry point in the 16,384 bytes of
    /// workgroup memory WebGPU guarantees (the tiles' staged codes share it with their
    /// partial sums).
    #[test]
    fn products_fit_webgpu_workgroup_memory() {
        use super::super::shaders::WEIGHT_FORMATS;
        let mut checked = 0;
        for (name, dtype, bits, group) in WEIGHT_FORMATS {
            for (sg, x4) in [(false, false), (false, true), (true, true)] {
                for src in [
                    super::super::model::mv_shader_source_with(dtype, bits, group, sg, x4),
                    super::super::moe::moe_shader_source_with(dtype, bits, group, sg, x4),
                ] {
                    let m = naga::front::wgsl::parse_str(&src).expect("parses");
                    let caps = if sg {
                        naga::valid::Capabilities::SUBGROUP
                    } else {
                        naga::valid::Capabilities::empty()
                    };
                    let info =
                        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                            .validate(&m)
                            .expect("validates");
                    for (entry, bytes) in workgroup_bytes(&m, &info) {
                        assert!(
                            bytes <= 16384,
                            "{name} {entry} uses {bytes} bytes of workgroup memory"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100, "{checked} entry points");
    }

    #[test]
    fn both_variants_have_the_same_entry_points() {
        let names = |sg| {
            let (m, _) = module(sg);
            m.entry_points
                .iter()
                .map(|e| (e.name.clone(), e.workgroup_size))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(false), names(true));
        let (m, _) = module(true);
        let uses_subgroups = |ep: &naga::EntryPoint| {
            ep.function.arguments.iter().any(|a| {
                matches!(
                    &m.types[a.ty].inner,
                    naga::TypeInner::Struct { members, .. } if members.iter().any(|mb| matches!(
                        mb.binding,
                        Some(naga::Binding::BuiltIn(naga::BuiltIn::SubgroupInvocationId))
                    ))
                )
            })
        };
        for ep in &m.entry_points {
            if ep.workgroup_size[0] == WG as u32 {
                assert!(
                    uses_subgroups(ep),
                    "{}: the subgroup variant does not pass subgroup builtins",
                    ep.name
                );
            }
        }
    }
}
