//! The contract's semantics that every backend shares (docs/CONTRACT.md: inputs,
//! pipeline, errors, log-probabilities), one file per stage in the contract's order:
//!
//! | file | what it holds |
//! |---|---|
//! | `door.rs` | call validation ([`validate_call`]) and the validated [`Row`] |
//! | `mask.rs` | stage 0, the token mask |
//! | `penalties.rs` | stages 1-3: bias, repetition, frequency/presence as a sparse list ([`Touch`], [`sparse_mods`]) |
//! | `dry.rs` | stage 3a, DRY |
//! | `temperature.rs` | stages 4-5: greedy rows, the temperature and its selection bound |
//! | `top_n_sigma.rs` | stage 5a, top-n-σ |
//! | `top_k.rs` | stage 6, top-k |
//! | `typical.rs` | stage 6a, typical-p |
//! | `weights.rs` | the weights and probabilities the filters below share |
//! | `top_p.rs` | stage 7, top-p |
//! | `min_p.rs` | stage 8, min-p |
//! | `xtc.rs` | stage 8a, XTC |
//! | `draw.rs` | stage 10, the Gumbel draw |
//! | `logprobs.rs` | log-probabilities, raw and processed |
//! | `kept.rs` | the kept distribution |
//! | `result.rs` | a row's result ([`Sample`], [`RowResult`]) |
//!
//! Each stage's file holds the helpers the backends share and the stage as the
//! reference applies it (an `apply` over a keep mask, which [`crate::ReferenceSampler`]
//! runs in order). Backends differ only in how they find the kept set and draw from it;
//! every value that decides a token is computed by the functions here or by
//! [`crate::philox`].

pub mod door;
pub mod draw;
pub mod dry;
pub mod kept;
pub mod logprobs;
pub mod mask;
pub mod min_p;
pub mod penalties;
pub mod result;
pub mod temperature;
pub mod top_k;
pub mod top_n_sigma;
pub mod top_p;
pub mod typical;
pub mod weights;
pub mod xtc;

pub use door::{count_non_finite, validate_call, Row};
#[cfg(feature = "wgpu")]
pub(crate) use door::{reads_in_order, validated_rows};
pub use dry::{dry_max_exponent, dry_penalties, dry_penalty};
pub use kept::kept_of;
pub use logprobs::{assemble_logprobs, log_sum_exp, logprob, rank_of, rank_order};
pub use min_p::min_p_threshold;
pub use penalties::{sparse_mods, touches_into, Touch};
pub use result::{Kept, KeptToken, RowResult, Sample, TokenLogprobs, TopLogprob};
pub use temperature::{is_greedy, z_lower_bound};
pub use top_n_sigma::top_n_sigma_threshold;
pub use top_p::{top_p_cut, TopPWalk};
pub use typical::{
    entropy, entropy_of, typical_cut, typical_score, typical_score_of, typical_walk,
};
pub use weights::{prob, prob64, weight};
pub use xtc::{xtc_coin, xtc_cut, xtc_fires};
