//! Per-thread scratch buffers, reused across rows and calls.

use std::cell::RefCell;

use super::general;
use super::select::Skip;

/// Per-thread buffers, reused across rows and calls.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) conv: Vec<f32>,
    pub(super) z: Vec<f32>,
    pub(super) y: Vec<f32>,
    pub(super) cands: Vec<(u32, f32)>,
    pub(super) tmp: Vec<(u32, f32)>,
    pub(super) tmp2: Vec<(u32, f32)>,
    pub(super) q: Vec<f32>,
    pub(super) walk: Vec<f32>,
    pub(super) words: Vec<u32>,
    pub(super) ids: Vec<u32>,
    pub(super) buckets: Vec<u16>,
    pub(super) skip: Skip,
    pub(super) general: general::Bufs,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

pub(super) fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}
