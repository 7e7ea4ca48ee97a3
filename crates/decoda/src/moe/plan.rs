//! The description of one dispatch, shared by every backend: which branch, and for each
//! gathered row its expert, its token and its place.

use serde::Serialize;

use crate::error::{Error, Result};

use super::{stable_argsort, Dispatch};

/// How one call lays out its `N * k` (token, expert) pairs for the grouped matmul.
///
/// Sorted: the rows are the pairs in the stable order of their expert ids (a counting
/// sort), so each expert's rows are contiguous (`offsets[e] .. offsets[e + 1]`); unsorted:
/// the rows are the pairs in token order. Either way row `j` multiplies the activation of
/// token `token[j]` by expert `idx[j]`, and pair `p = n * k + s` (token `n`, slot `s`)
/// finds its result in row `inv_order[p]`. A backend computes exactly this plan (the
/// device builds it on the device; a test compares it with [`DispatchPlan::new`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DispatchPlan {
    /// The branch.
    pub dispatch: Dispatch,
    /// Experts per token k.
    pub top_k: usize,
    /// `idx [N*k]`: the expert of each row (non-decreasing when sorted).
    pub idx: Vec<u32>,
    /// `order [N*k]`: the pair of each row (`n * k + s`; the identity when unsorted).
    pub order: Vec<u32>,
    /// `inv_order [N*k]`: the row of each pair (the inverse of `order`).
    pub inv_order: Vec<u32>,
    /// Sorted: `offsets [E + 1]`, expert `e`'s rows are `offsets[e] .. offsets[e + 1]`.
    /// Unsorted: empty.
    pub offsets: Vec<u32>,
}

impl DispatchPlan {
    /// The plan of `expert_indices [N, k]` (ids below `experts`) for `dispatch`.
    pub fn new(
        expert_indices: &[u32],
        top_k: usize,
        experts: usize,
        dispatch: Dispatch,
    ) -> Result<Self> {
        if top_k == 0 || !expert_indices.len().is_multiple_of(top_k) {
            return Err(Error::Shape(format!(
                "expert_indices holds {} values, not a multiple of k = {top_k}",
                expert_indices.len()
            )));
        }
        let rows = expert_indices.len();
        if rows > u32::MAX as usize {
            return Err(Error::Shape(format!(
                "{rows} gathered rows: more than 2^32 - 1"
            )));
        }
        match dispatch {
            Dispatch::Sorted => {
                let order = stable_argsort(expert_indices, experts)?;
                let idx: Vec<u32> = order.iter().map(|&p| expert_indices[p as usize]).collect();
                let mut inv_order = vec![0u32; rows];
                for (j, &p) in order.iter().enumerate() {
                    inv_order[p as usize] = j as u32;
                }
                let mut offsets = vec![0u32; experts + 1];
                for &e in expert_indices {
                    offsets[e as usize + 1] += 1;
                }
                for e in 0..experts {
                    offsets[e + 1] += offsets[e];
                }
                Ok(Self {
                    dispatch,
                    top_k,
                    idx,
                    order,
                    inv_order,
                    offsets,
                })
            }
            Dispatch::Unsorted => {
                super::check_ids(expert_indices, top_k, experts)?;
                let ident: Vec<u32> = (0..rows as u32).collect();
                Ok(Self {
                    dispatch,
                    top_k,
                    idx: expert_indices.to_vec(),
                    order: ident.clone(),
                    inv_order: ident,
                    offsets: Vec::new(),
                })
            }
        }
    }

    /// Number of rows (`N * k`).
    pub fn rows(&self) -> usize {
        self.idx.len()
    }

    /// The token of row `j`.
    pub fn token(&self, j: usize) -> usize {
        self.order[j] as usize / self.top_k
    }
}
