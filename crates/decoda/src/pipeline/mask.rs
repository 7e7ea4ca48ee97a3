//! Stage 0, the token mask ([`Request::allowed`]): a disallowed token's logit is
//! `-inf`. Backends apply it where they read the logits (the CPU on its copy of the row,
//! the device in its kernels); these are its plain semantics.

use crate::params::Request;

impl Request {
    /// A row of logits with the disallowed tokens at `-inf` (a copy), or the row itself
    /// without a mask.
    pub fn mask_row<'x>(&self, x: &'x [f32]) -> std::borrow::Cow<'x, [f32]> {
        match self.allowed {
            None => std::borrow::Cow::Borrowed(x),
            Some(_) => (0..x.len())
                .map(|i| {
                    if self.allows(i) {
                        x[i]
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect(),
        }
    }

    /// Whether token `i` is allowed by the row's mask (always, without one).
    pub fn allows(&self, i: usize) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|m| m[i / 32] >> (i % 32) & 1 == 1)
    }
}
