//! What a row returns: a token with its log-probabilities and kept distribution, or
//! the row's error.

use serde::Serialize;

use crate::error::RowError;

/// One of the most likely tokens, with its log-probability.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TopLogprob {
    /// Token id.
    pub token: u32,
    /// Natural log-probability.
    pub logprob: f32,
}

/// The log-probabilities reported for a drawn token (the contract's log-probabilities).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprobs {
    /// The chosen token's log-probability.
    pub logprob: f32,
    /// The chosen token's rank, 1 = most likely (ties: smaller id first).
    pub rank: u32,
    /// The `n` most likely tokens, most likely first (ties: smaller id first). Tokens with
    /// probability 0 (`-inf`) are not listed, so there may be fewer than `n`.
    pub top: Vec<TopLogprob>,
}

/// A token of the kept distribution and its probability after the whole pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KeptToken {
    /// Token id.
    pub id: u32,
    /// Its probability over the kept set (`softmax(y)` over S; 1 for a greedy row's token).
    pub p: f32,
}

/// The kept set S a token was drawn from ([`crate::SamplingParams::kept`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kept {
    /// How many tokens S holds (tokens of probability 0 included).
    pub size: u32,
    /// Its `n` most likely tokens, most likely first (ties: smaller id first).
    pub top: Vec<KeptToken>,
}

/// A drawn token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The token id, always `< V`.
    pub token: u32,
    /// Log-probabilities, when the row asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<TokenLogprobs>,
    /// The kept distribution, when the row asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<Kept>,
}

impl Sample {
    /// A token without log-probabilities or kept distribution.
    pub fn token(token: u32, logprobs: Option<TokenLogprobs>) -> Self {
        Self {
            token,
            logprobs,
            kept: None,
        }
    }
}

/// The result of one row: a token, or that row's error.
pub type RowResult = std::result::Result<Sample, RowError>;
