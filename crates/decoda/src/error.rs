//! The library's error types: whole-call errors ([`Error`]) and per-row errors ([`RowError`]).

use serde::Serialize;

/// A whole-call error: nothing was sampled. Raised before any work is done.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A sampling parameter is outside its range.
    #[error("row {row}: invalid {field} = {value}: expected {expected}")]
    InvalidParameter {
        /// Row of the batch (0-based).
        row: usize,
        /// Name of the field, as in the contract (`top_p`, `logit_bias`, ...).
        field: &'static str,
        /// The offending value, printed.
        value: String,
        /// What the field accepts.
        expected: &'static str,
    },
    /// A token id in the row's history or logit bias is not below the vocabulary size.
    #[error(
        "row {row}: {field} holds token id {id}, which is not below the vocabulary size {vocab}"
    )]
    TokenOutOfRange {
        /// Row of the batch (0-based).
        row: usize,
        /// `prompt`, `output` or `logit_bias`.
        field: &'static str,
        /// The offending id.
        id: u64,
        /// Vocabulary size V.
        vocab: usize,
    },
    /// Shapes of the call's inputs do not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// No device (GPU adapter, driver) is available for a device backend; callers may
    /// fall back to the CPU.
    #[error("no device: {0}")]
    NoDevice(String),
    /// A device backend failed (shader build, submission, mapping).
    #[error("device error: {0}")]
    Device(String),
    /// An MoE layer setting or input value is outside its range.
    #[error("moe: invalid {field} = {value}: expected {expected}")]
    InvalidMoe {
        /// Name of the setting or input (`sort_cutoff`, `top_k`, `expert_weights`, ...).
        field: &'static str,
        /// The offending value, printed (with its position when it is an element).
        value: String,
        /// What the field accepts.
        expected: &'static str,
    },
    /// An expert id in `expert_indices` (or `idx`) is not below the number of experts.
    #[error("moe: token {token}, slot {slot}: expert id {expert} is not below the number of experts {experts}")]
    ExpertOutOfRange {
        /// Token (row of `expert_indices`), or the gathered row for `idx`.
        token: usize,
        /// Slot within the token's k choices (0 for `idx`).
        slot: usize,
        /// The offending id.
        expert: u32,
        /// Number of experts E.
        experts: usize,
    },
    /// A model checkpoint or its config cannot be used (the message names the file, the
    /// field or tensor, and what was expected).
    #[error("model: {0}")]
    Model(String),
    /// `idx` was declared sorted but decreases somewhere.
    #[error("moe: idx was declared sorted but idx[{position}] = {next} follows {previous}")]
    NotSorted {
        /// Position of the first element smaller than its predecessor.
        position: usize,
        /// `idx[position - 1]`.
        previous: u32,
        /// `idx[position]`.
        next: u32,
    },
}

/// Result type of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error of one row of a batch: the other rows are unaffected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "kind")]
pub enum RowError {
    /// The row holds NaN or `+inf` logits (or a bias or penalty overflowed to `+inf`).
    #[error("{count} logits are NaN or +inf")]
    NonFiniteLogits {
        /// How many values are non-finite.
        count: u64,
    },
    /// Every logit is `-inf` after bias and penalties: there is nothing to draw.
    #[error("every logit is -inf after bias and penalties")]
    NoCandidate,
    /// The kept set was not empty, yet the backend found no winning token: a defect of
    /// the backend (please report it), reported for its row instead of a wrong token.
    #[error("no token won the draw although the kept set is not empty (a backend defect)")]
    NoWinner,
    /// A sampling head's step for a slot that had already finished (a stop token or
    /// `max_tokens`): no token was drawn.
    #[error("the slot had already finished (stop token or max_tokens)")]
    Finished,
}

impl RowError {
    /// The error's kind, as printed by the CLI (`NonFiniteLogits`, `NoCandidate`,
    /// `NoWinner`).
    pub fn kind(&self) -> &'static str {
        match self {
            RowError::NonFiniteLogits { .. } => "NonFiniteLogits",
            RowError::NoCandidate => "NoCandidate",
            RowError::NoWinner => "NoWinner",
            RowError::Finished => "Finished",
        }
    }
}
