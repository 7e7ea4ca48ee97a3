//! Stage 3a, DRY (llama.cpp's "don't repeat yourself" sampler): the penalties a
//! row's history earns, the repeat-length limit its sequence breakers set, and the
//! penalty of a repeat by its excess length (computed on the host for the device too).

/// Stage 3a, DRY, as the sorted list of `(token, penalty)` it subtracts: llama.cpp's DRY
/// sampler (docs/CONTRACT.md) over the last `dry_penalty_last_n` tokens of the row's
/// history (prompt, then output). Empty when DRY is off or finds no repeat to extend.
///
/// Repeat lengths come from the Z-algorithm run backwards over the window (linear in its
/// length), clamped by the last sequence breaker; the reference computes them by their
/// definition instead.
pub fn dry_penalties(
    p: &crate::params::SamplingParams,
    prompt: &[u32],
    output: &[u32],
) -> Vec<(u32, f32)> {
    if !p.dry_on() {
        return Vec::new();
    }
    let len = prompt.len() + output.len();
    let n = p.dry_window(len);
    let allowed = p.dry_allowed_length as usize;
    if n <= allowed {
        return Vec::new();
    }
    // rat(i): the i-th token from the end of the history (0 = the last one)
    let rat = |i: usize| {
        let at = len - 1 - i;
        if at < prompt.len() {
            prompt[at]
        } else {
            output[at - prompt.len()]
        }
    };
    let rep_limit = dry_repeat_limit(p, n, &rat);
    if rep_limit < allowed {
        return Vec::new();
    }
    // z[k]: how many tokens before distance k match the last ones (the suffix ending
    // k tokens back that equals a suffix of the history), clamped to the limit
    let mut z = vec![0usize; n];
    let (mut lt, mut rt) = (0usize, 0usize);
    for k in 1..n {
        if k > rt {
            let mut m = 0;
            while m + k < n && rat(m) == rat(m + k) {
                m += 1;
            }
            z[k] = m.min(rep_limit);
            if m > 0 {
                lt = k;
                rt = k + m - 1;
            }
        } else {
            let pair = k - lt;
            let right = rt - k + 1;
            if z[pair] < right {
                z[k] = z[pair].min(rep_limit);
            } else {
                let mut i = rt + 1;
                while i < n && rat(i) == rat(i - k) {
                    i += 1;
                }
                z[k] = (i - k).min(rep_limit);
                lt = k;
                rt = i - 1;
            }
        }
    }
    // the token after each repeat would extend it: its longest such repeat
    let mut longest: Vec<(u32, usize)> = (1..n)
        .filter(|&k| z[k] >= allowed)
        .map(|k| (rat(k - 1), z[k]))
        .collect();
    longest.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    longest.dedup_by_key(|e| e.0);
    longest
        .into_iter()
        .filter(|&(t, _)| {
            !p.dry_sequence_breakers
                .iter()
                .any(|b| b.len() == 1 && b[0] == t)
        })
        .map(|(t, m)| (t, dry_penalty(p, m - allowed)))
        .collect()
}

/// DRY's limit on a repeat's length: the distance from the end of the window's last
/// sequence breaker (the longest breaker ending there), or the window's length.
pub(crate) fn dry_repeat_limit(
    p: &crate::params::SamplingParams,
    n: usize,
    rat: &impl Fn(usize) -> u32,
) -> usize {
    for i in 0..n {
        let head = rat(i);
        let mut longest: Option<usize> = None;
        for b in &p.dry_sequence_breakers {
            let tail = b.len() - 1;
            if b[0] != head || tail > i || longest.is_some_and(|l| tail <= l) {
                continue;
            }
            if (0..tail).all(|o| b[1 + o] == rat(i - o - 1)) {
                longest = Some(tail);
            }
        }
        if let Some(l) = longest {
            return i - l;
        }
    }
    n
}

/// The largest exponent DRY's penalty takes, `floor(88.7228391 / ln(base))` when
/// `base > 1.000001` (and that is at least 1); `None`: no cap.
pub fn dry_max_exponent(p: &crate::params::SamplingParams) -> Option<u64> {
    if p.dry_base > 1.000_001 {
        let max_exp = (88.722_839_1_f64 / f64::from(p.dry_base).ln()) as u64;
        (max_exp > 0).then_some(max_exp)
    } else {
        None
    }
}

/// DRY's penalty for a repeat `excess` tokens past the allowed length:
/// `multiplier * base^e` with `e = min(excess, floor(88.7228391 / ln(base)))` (no clamp
/// when `base <= 1.000001`), the power by repeated squaring in f64, rounded once to f32.
pub fn dry_penalty(p: &crate::params::SamplingParams, excess: usize) -> f32 {
    let base = f64::from(p.dry_base);
    let mut e = excess as u64;
    if let Some(max_exp) = dry_max_exponent(p) {
        e = e.min(max_exp);
    }
    let (mut acc, mut sq) = (1.0f64, base);
    while e > 0 {
        if e & 1 == 1 {
            acc *= sq;
        }
        sq *= sq;
        e >>= 1;
    }
    (f64::from(p.dry_multiplier) * acc) as f32
}
