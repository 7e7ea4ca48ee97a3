//! `decoda.distributed.sample`'s native half: one shard's side of a vocabulary-sharded
//! call (`decoda::shard`), its summaries as JSON for the Python side to exchange over
//! the group's collectives, each merge computed the same on every rank.

use decoda::shard::{self, Decision, Plan, Round1, Round2, ShardRows};
use decoda::Request;
use numpy::{PyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn value_err(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// What a rank sends in round 1: its span of ids and its rows' summaries.
struct First {
    offset: usize,
    width: usize,
    rows: Vec<Round1>,
}

impl First {
    fn to_json(&self) -> PyResult<String> {
        let rows = serde_json::to_value(&self.rows).map_err(value_err)?;
        Ok(
            serde_json::json!({"offset": self.offset, "width": self.width, "rows": rows})
                .to_string(),
        )
    }

    fn parse(text: &str) -> PyResult<Self> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(value_err)?;
        let num = |k: &str| {
            v[k].as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| PyValueError::new_err(format!("round 1: no {k}")))
        };
        Ok(Self {
            offset: num("offset")?,
            width: num("width")?,
            rows: serde_json::from_value(v["rows"].clone()).map_err(value_err)?,
        })
    }
}

/// One rank's shard of a sharded call, stepped through the rounds.
#[pyclass(module = "decoda._native")]
pub struct ShardCall {
    logits: Vec<f32>,
    width: usize,
    offset: usize,
    vocab: usize,
    reqs: Vec<Request>,
    r1: Vec<Vec<Round1>>,
    plans: Vec<Plan>,
    decisions: Vec<Decision>,
}

impl ShardCall {
    fn rows(&self) -> ShardRows<'_> {
        ShardRows {
            logits: &self.logits,
            width: self.width,
            offset: self.offset,
        }
    }
}

#[pymethods]
impl ShardCall {
    /// `logits`: this shard's `[B, Vs]` float32 columns (ids `offset .. offset + Vs`);
    /// `requests`: the B requests' JSON (as `Sampler.sample` takes, ids global).
    #[new]
    fn new(
        logits: PyReadonlyArray2<'_, f32>,
        requests: &str,
        offset: usize,
        vocab: usize,
    ) -> PyResult<Self> {
        let reqs: Vec<Request> = serde_json::from_str(requests)
            .map_err(|e| PyValueError::new_err(format!("requests: {e}")))?;
        let shape = logits.shape();
        let (rows, width) = (shape[0], shape[1]);
        if rows != reqs.len() {
            return Err(PyValueError::new_err(format!(
                "{} requests for {rows} rows of logits: give one request per row",
                reqs.len()
            )));
        }
        let logits = logits.as_slice().map_or_else(
            |_| logits.as_array().iter().copied().collect(),
            <[f32]>::to_vec,
        );
        Ok(Self {
            logits,
            width,
            offset,
            vocab,
            reqs,
            r1: Vec::new(),
            plans: Vec::new(),
            decisions: Vec::new(),
        })
    }

    /// This rank's round 1 (JSON).
    fn round1(&self, py: Python<'_>) -> PyResult<String> {
        let rows = py
            .allow_threads(|| shard::round1(&self.rows(), self.vocab, &self.reqs))
            .map_err(value_err)?;
        First {
            offset: self.offset,
            width: self.width,
            rows,
        }
        .to_json()
    }

    /// Merges every rank's round 1 (in rank order; the shards must cover the vocabulary
    /// once) and returns this rank's round 2 (JSON).
    fn round2(&mut self, py: Python<'_>, gathered: Vec<String>) -> PyResult<String> {
        let firsts: Vec<First> = gathered
            .iter()
            .map(|g| First::parse(g))
            .collect::<PyResult<_>>()?;
        let mut spans: Vec<(usize, usize, usize)> = firsts
            .iter()
            .enumerate()
            .map(|(rank, f)| (f.offset, f.width, rank))
            .collect();
        spans.sort_unstable();
        let mut at = 0;
        for &(o, w, rank) in &spans {
            if o > at {
                return Err(PyValueError::new_err(format!(
                    "ids {at} .. {o} are in no rank's shard (rank {rank}'s starts at {o}): \
                     every id of 0 .. {} must be in one",
                    self.vocab
                )));
            }
            if o < at {
                return Err(PyValueError::new_err(format!(
                    "ids {o} .. {at} are in two shards (rank {rank}'s starts at {o})"
                )));
            }
            at = o + w;
        }
        if at != self.vocab {
            return Err(PyValueError::new_err(format!(
                "the shards cover 0 .. {at} of a vocabulary of {}",
                self.vocab
            )));
        }
        self.r1 = firsts.into_iter().map(|f| f.rows).collect();
        let plans = shard::plan(&self.r1, self.vocab, &self.reqs).map_err(value_err)?;
        let r2 = py
            .allow_threads(|| shard::round2(&self.rows(), self.vocab, &self.reqs, &plans))
            .map_err(value_err)?;
        self.plans = plans;
        serde_json::to_string(&r2).map_err(value_err)
    }

    /// Merges every rank's round 2; returns this rank's round 3 (JSON), or `None` when
    /// no row asked for log-probabilities (then no round 3 runs).
    fn round3(&mut self, py: Python<'_>, gathered: Vec<String>) -> PyResult<Option<String>> {
        let r2: Vec<Vec<Round2>> = gathered
            .iter()
            .map(|g| serde_json::from_str(g).map_err(value_err))
            .collect::<PyResult<_>>()?;
        self.decisions = shard::decide(&r2, &self.plans, &self.reqs);
        if self.reqs.iter().all(|q| q.params.logprobs.is_none()) {
            return Ok(None);
        }
        let r3 = py
            .allow_threads(|| {
                shard::round3(
                    &self.rows(),
                    self.vocab,
                    &self.reqs,
                    &self.plans,
                    &self.decisions,
                )
            })
            .map_err(value_err)?;
        serde_json::to_string(&r3).map(Some).map_err(value_err)
    }

    /// Merges every rank's round 3 (empty without one): the tokens (int64, -1 for a
    /// failed row) and the per-row extras' JSON, as `Sampler.sample` returns them.
    fn finish<'py>(
        &self,
        py: Python<'py>,
        gathered: Vec<String>,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Option<String>)> {
        let mut r3: Vec<Vec<u64>> = gathered
            .iter()
            .map(|g| serde_json::from_str(g).map_err(value_err))
            .collect::<PyResult<_>>()?;
        if r3.is_empty() {
            r3.push(vec![0; self.reqs.len()]);
        }
        let results = shard::finish(&self.r1, &r3, &self.plans, &self.decisions, &self.reqs);
        let tokens: Vec<i64> = results
            .iter()
            .map(|r| r.as_ref().map_or(-1, |s| i64::from(s.token)))
            .collect();
        Ok((PyArray1::from_vec(py, tokens), crate::extras(&results)))
    }
}
