//! Python bindings of decoda: the sampler over numpy arrays (`decoda.Sampler`). The
//! Python package (`python/decoda`) wraps this native module, `decoda._native`.
//!
//! The logits are read in place (a C-contiguous float32 or float16 array is viewed, not
//! copied), the interpreter's lock is released while sampling, and the parameters come
//! as the JSON objects the CLI's `--params` takes, so every field has one name
//! everywhere.

use decoda::{Backend, CpuSampler, Logits, Request, RowResult};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A sampler on one device: the CPU, or a GPU through wgpu.
#[pyclass(module = "decoda._native", frozen)]
struct Sampler {
    backend: Box<dyn Backend>,
}

/// Where a sampler, head or model runs: `cpu`, `wgpu` (any adapter, software ones
/// included) or `auto` (a hardware GPU, else the CPU).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Device {
    Cpu,
    Wgpu,
    Auto,
}

impl Device {
    pub(crate) fn parse(device: &str) -> PyResult<Self> {
        match device {
            "cpu" => Ok(Self::Cpu),
            "wgpu" => Ok(Self::Wgpu),
            "auto" => Ok(Self::Auto),
            other => Err(PyValueError::new_err(format!(
                "device must be \"cpu\", \"wgpu\" or \"auto\", not {other:?}"
            ))),
        }
    }

    /// The GPU to run on, or `None` for the CPU (`auto` without a hardware GPU).
    pub(crate) fn gpu(self) -> decoda::Result<Option<decoda::wgpu::WgpuSampler>> {
        Ok(match self {
            Self::Cpu => None,
            Self::Wgpu => Some(decoda::wgpu::WgpuSampler::new()?),
            Self::Auto => decoda::wgpu::WgpuSampler::hardware().ok(),
        })
    }
}

fn runtime_err(e: decoda::Error) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// The sampler for `device`; `threads` sizes the CPU's pool.
fn open(device: &str, threads: Option<usize>) -> PyResult<Box<dyn Backend>> {
    if let Some(s) = Device::parse(device)?.gpu().map_err(runtime_err)? {
        return Ok(Box::new(s));
    }
    Ok(match threads {
        None | Some(0) => Box::new(CpuSampler::new()),
        Some(n) => Box::new(CpuSampler::with_threads(n).map_err(value_err)?),
    })
}

/// Per row: `null`, or an object with the row's `error` (`kind`, `message`),
/// `logprobs` and `kept` when it has them.
fn extras(results: &[RowResult]) -> Option<String> {
    let any = results.iter().any(|r| match r {
        Err(_) => true,
        Ok(s) => s.logprobs.is_some() || s.kept.is_some(),
    });
    if !any {
        return None;
    }
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|r| match r {
            Err(e) => serde_json::json!({"error": {"kind": e.kind(), "message": e.to_string()}}),
            Ok(s) if s.logprobs.is_none() && s.kept.is_none() => serde_json::Value::Null,
            Ok(s) => serde_json::json!({"logprobs": s.logprobs, "kept": s.kept}),
        })
        .collect();
    Some(serde_json::Value::Array(rows).to_string())
}

#[pymethods]
impl Sampler {
    #[new]
    #[pyo3(signature = (device = "auto", threads = None))]
    fn new(device: &str, threads: Option<usize>) -> PyResult<Self> {
        Ok(Self {
            backend: open(device, threads)?,
        })
    }

    /// The backend's name (`cpu`, `wgpu:<adapter>`).
    #[getter]
    fn device(&self) -> String {
        self.backend.name()
    }

    /// Samples `logits` (a 2-D C-contiguous float32 or float16 array, one row per
    /// request) with `requests`, a JSON array of request objects (the keys of the CLI's
    /// `--params`). Returns the tokens (int64, -1 for a failed row) and, when a row
    /// failed or asked for log-probabilities or its kept distribution, a JSON array of
    /// per-row extras. A whole-call problem raises `ValueError` with decoda's message.
    fn sample<'py>(
        &self,
        py: Python<'py>,
        logits: &Bound<'py, PyAny>,
        requests: &str,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Option<String>)> {
        let reqs: Vec<Request> = serde_json::from_str(requests)
            .map_err(|e| PyValueError::new_err(format!("requests: {e}")))?;
        let backend = &self.backend;
        let results = with_logits(py, logits, |l| backend.sample(l, &reqs))?;
        let tokens: Vec<i64> = results
            .iter()
            .map(|r| r.as_ref().map_or(-1, |s| i64::from(s.token)))
            .collect();
        Ok((PyArray1::from_vec(py, tokens), extras(&results)))
    }

    /// Verifies drafted tokens (speculative decoding, coupled: docs/CONTRACT.md):
    /// `logits` (2-D, `B (K + 1)` rows: each row's K + 1 positions in turn), `requests`
    /// (B request objects, as `sample` takes) and `drafts` (B lists of K ids). Returns per
    /// row the accepted count, the emitted tokens, and a JSON array of per-row extras
    /// (`error`, and `logprobs` per emitted token when asked).
    #[allow(clippy::type_complexity)]
    fn verify(
        &self,
        py: Python<'_>,
        logits: &Bound<'_, PyAny>,
        requests: &str,
        drafts: Vec<Vec<u32>>,
    ) -> PyResult<(Vec<usize>, Vec<Vec<u32>>, String)> {
        let reqs = drafted_requests(requests, &drafts)?;
        let rows: Vec<decoda::DraftRow> = reqs
            .into_iter()
            .zip(drafts)
            .map(|(q, d)| decoda::DraftRow::new(q, d))
            .collect();
        let backend = &self.backend;
        let out = with_logits(py, logits, |l| {
            decoda::verify_coupled(backend.as_ref(), l, &rows)
        })?;
        Ok(verified(&out, true))
    }

    /// Rejection verification (docs/CONTRACT.md) of drafts made elsewhere: `logits` and
    /// `requests` as `verify`; `draft_logits` (float32, `Σ K` rows, one per drafted
    /// token) with `draft_params` (a JSON array of B parameter objects), or neither for
    /// one-hot drafts. Returns what `verify` returns (tokens only, no log-probabilities).
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (logits, requests, drafts, draft_logits = None, draft_params = None))]
    fn verify_rejection(
        &self,
        py: Python<'_>,
        logits: &Bound<'_, PyAny>,
        requests: &str,
        drafts: Vec<Vec<u32>>,
        draft_logits: Option<PyReadonlyArray2<'_, f32>>,
        draft_params: Option<&str>,
    ) -> PyResult<(Vec<usize>, Vec<Vec<u32>>, String)> {
        let reqs = drafted_requests(requests, &drafts)?;
        let params: Option<Vec<decoda::SamplingParams>> = match draft_params {
            None => None,
            Some(j) => Some(
                serde_json::from_str(j)
                    .map_err(|e| PyValueError::new_err(format!("draft_params: {e}")))?,
            ),
        };
        if params.as_ref().is_some_and(|p| p.len() != reqs.len())
            || params.is_some() != draft_logits.is_some()
        {
            return Err(PyValueError::new_err(
                "draft_params: one mapping a row, given with draft_logits (or neither)",
            ));
        }
        let dl: Option<(Vec<f32>, usize, usize)> = match &draft_logits {
            None => None,
            Some(a) => Some((
                a.as_slice()
                    .map_err(|_| PyValueError::new_err("draft_logits must be C-contiguous"))?
                    .to_vec(),
                a.shape()[0],
                a.shape()[1],
            )),
        };
        let rows: Vec<decoda::RejectRow> = reqs
            .into_iter()
            .zip(drafts)
            .enumerate()
            .map(|(r, (q, d))| decoda::RejectRow {
                request: q,
                draft: d,
                draft_params: params.as_ref().map(|p| p[r].clone()),
            })
            .collect();
        let out = with_logits(py, logits, |l| {
            let d = match &dl {
                None => None,
                Some((x, n, v)) => Some(Logits::f32(x, *n, *v)?),
            };
            decoda::verify_rejection(l, &rows, d.as_ref())
        })?;
        Ok(verified(&out, false))
    }

    /// For benchmarks: microseconds of `iters` Rust calls on these logits and requests
    /// (parsed once, the lock released), so the Python layer's cost over a Rust call can
    /// be measured on the same rows (`scripts/python/bench_python.py`).
    fn _time_rust(
        &self,
        py: Python<'_>,
        logits: &Bound<'_, PyAny>,
        requests: &str,
        iters: usize,
    ) -> PyResult<Vec<f64>> {
        let reqs: Vec<Request> = serde_json::from_str(requests)
            .map_err(|e| PyValueError::new_err(format!("requests: {e}")))?;
        let backend = &self.backend;
        with_logits(py, logits, |l| {
            let mut times = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = std::time::Instant::now();
                let out = backend.sample(l, &reqs)?;
                std::hint::black_box(out);
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            Ok(times)
        })
    }
}

/// The requests of a verification (a JSON array, as `sample` takes), one a row of
/// drafted tokens.
fn drafted_requests(requests: &str, drafts: &[Vec<u32>]) -> PyResult<Vec<Request>> {
    let reqs: Vec<Request> = serde_json::from_str(requests)
        .map_err(|e| PyValueError::new_err(format!("requests: {e}")))?;
    if drafts.len() != reqs.len() {
        return Err(PyValueError::new_err(format!(
            "drafts: {} rows of drafted tokens for {} requests",
            drafts.len(),
            reqs.len()
        )));
    }
    Ok(reqs)
}

/// A verification's rows for Python: the accepted counts, the emitted tokens, and a JSON
/// array of per-row extras (`error`; `logprobs` per emitted token with `logprobs`, else
/// `null`).
fn verified(out: &[decoda::Verified], logprobs: bool) -> (Vec<usize>, Vec<Vec<u32>>, String) {
    let extras: Vec<serde_json::Value> = out
        .iter()
        .map(|v| {
            let lp = if logprobs {
                serde_json::json!(v.samples.iter().map(|s| &s.logprobs).collect::<Vec<_>>())
            } else {
                serde_json::Value::Null
            };
            serde_json::json!({
                "error": v.error.as_ref().map(|e| serde_json::json!({"kind": e.kind(), "message": e.to_string()})),
                "logprobs": lp,
            })
        })
        .collect();
    (
        out.iter().map(|v| v.accepted).collect(),
        out.iter().map(decoda::Verified::tokens).collect(),
        serde_json::Value::Array(extras).to_string(),
    )
}

/// Reads a 2-D float32 or float16 array in place and runs `f` on it as logits, with the
/// interpreter's lock released.
fn with_logits<'py, T: Send>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    f: impl FnOnce(&Logits<'_>) -> decoda::Result<T> + Send,
) -> PyResult<T> {
    let contiguous =
        || PyValueError::new_err("logits must be C-contiguous (use np.ascontiguousarray)");
    if let Ok(a) = logits.downcast::<numpy::PyArray2<f32>>() {
        let ro: PyReadonlyArray2<f32> = a.readonly();
        let (b, v) = (ro.shape()[0], ro.shape()[1]);
        let data = ro.as_slice().map_err(|_| contiguous())?;
        py.allow_threads(|| Logits::f32(data, b, v).and_then(|l| f(&l)))
    } else if let Ok(a) = logits.downcast::<numpy::PyArray2<half::f16>>() {
        let ro: PyReadonlyArray2<half::f16> = a.readonly();
        let (b, v) = (ro.shape()[0], ro.shape()[1]);
        let data = ro.as_slice().map_err(|_| contiguous())?;
        py.allow_threads(|| Logits::f16(data, b, v).and_then(|l| f(&l)))
    } else if let Ok(a) = logits.downcast::<numpy::PyArray2<u16>>() {
        // bfloat16 values as their bits (numpy has no bfloat16)
        let ro: PyReadonlyArray2<u16> = a.readonly();
        let (b, v) = (ro.shape()[0], ro.shape()[1]);
        let bits = ro.as_slice().map_err(|_| contiguous())?;
        // SAFETY: bf16 is a transparent wrapper of u16: the same size, alignment and
        // every bit pattern valid; the slice covers exactly the array's memory.
        let data: &[half::bf16] =
            unsafe { std::slice::from_raw_parts(bits.as_ptr().cast(), bits.len()) };
        py.allow_threads(|| Logits::bf16(data, b, v).and_then(|l| f(&l)))
    } else {
        return Err(PyTypeError::new_err(
            "logits must be a 2-D numpy array of float32, float16 or bfloat16 bits (uint16)",
        ));
    }
    .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A sampling head: slots of decode state (parameters, seed, step, history, stop ids,
/// `max_tokens`, a fixed token mask), stepped together; on the CPU or a GPU.
#[pyclass(module = "decoda._native", frozen)]
struct Head {
    inner: std::sync::Mutex<Box<dyn decoda::head::Head + Send>>,
}

impl Head {
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, Box<dyn decoda::head::Head + Send>>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the head is poisoned by an earlier panic"))
    }
}

/// A step's tokens, finishes and extras (see [`Head::step`]).
type StepOut<'py> = (
    Bound<'py, PyArray1<i64>>,
    Vec<Option<String>>,
    Option<String>,
);

fn value_err(e: decoda::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

#[pymethods]
impl Head {
    #[new]
    #[pyo3(signature = (slots, vocab, device = "auto"))]
    fn new(slots: usize, vocab: usize, device: &str) -> PyResult<Self> {
        let inner: Box<dyn decoda::head::Head + Send> = match Device::parse(device)?
            .gpu()
            .map_err(runtime_err)?
        {
            Some(s) => Box::new(decoda::wgpu::WgpuHead::new(&s, slots, vocab).map_err(value_err)?),
            None => Box::new(decoda::CpuHead::new(slots, vocab).map_err(value_err)?),
        };
        Ok(Self {
            inner: std::sync::Mutex::new(inner),
        })
    }

    /// The head's name (`cpu`, `wgpu:<adapter>`).
    #[getter]
    fn device(&self) -> PyResult<String> {
        Ok(self.lock()?.name())
    }

    /// Slots and vocabulary size.
    #[getter]
    fn shape(&self) -> PyResult<(usize, usize)> {
        let h = self.lock()?;
        Ok((h.slots(), h.vocab()))
    }

    /// Puts a sequence in a free slot: `request` is a JSON request object (parameters,
    /// `seed`, `step`, `prompt`, `output`, `allowed`); returns its seed.
    #[pyo3(signature = (slot, request, max_tokens = None, stop = None))]
    fn join(
        &self,
        slot: usize,
        request: &str,
        max_tokens: Option<u64>,
        stop: Option<Vec<u32>>,
    ) -> PyResult<u64> {
        let r: Request = serde_json::from_str(request)
            .map_err(|e| PyValueError::new_err(format!("request: {e}")))?;
        let seeded = serde_json::from_str::<serde_json::Value>(request)
            .ok()
            .is_some_and(|v| v.get("seed").is_some());
        let sr = decoda::head::SlotRequest {
            params: r.params,
            seed: seeded.then_some(r.state.seed),
            step: r.state.step,
            prompt: r.state.prompt,
            output: r.state.output,
            max_tokens,
            stop: stop.unwrap_or_default(),
            allowed: r.allowed,
        };
        self.lock()?.join(slot, sr).map_err(value_err)
    }

    /// Frees a slot.
    fn leave(&self, slot: usize) -> PyResult<()> {
        self.lock()?.leave(slot).map_err(value_err)
    }

    /// Replaces a joined slot's sampling parameters (a JSON object); its state stays.
    fn set_params(&self, slot: usize, params: &str) -> PyResult<()> {
        let p: decoda::SamplingParams = serde_json::from_str(params)
            .map_err(|e| PyValueError::new_err(format!("params: {e}")))?;
        self.lock()?.set_params(slot, p).map_err(value_err)
    }

    /// One step: row `r` of `logits` for slot `rows[r]`, with `masks` (a 2-D uint32
    /// array, one row of words per logits row) when given. Returns the tokens (int64,
    /// -1 for no token), each row's finish (`"stop"`, `"length"` or `None`) and the
    /// per-row extras as JSON (or `None`).
    #[pyo3(signature = (logits, rows, masks = None))]
    fn step<'py>(
        &self,
        py: Python<'py>,
        logits: &Bound<'py, PyAny>,
        rows: Vec<usize>,
        masks: Option<numpy::PyReadonlyArray2<'py, u32>>,
    ) -> PyResult<StepOut<'py>> {
        let mut head = self.lock()?;
        let words: Option<(Vec<u32>, usize)> = match &masks {
            None => None,
            Some(m) => Some((
                m.as_slice()
                    .map_err(|_| PyValueError::new_err("masks must be C-contiguous"))?
                    .to_vec(),
                m.shape()[1],
            )),
        };
        let head = &mut **head;
        let steps = with_logits(py, logits, move |l| match &words {
            None => head.step(l, &rows),
            Some((w, width)) => {
                let per: Vec<Option<&[u32]>> = w.chunks(*width).map(Some).collect();
                head.step_masked(l, &rows, &per)
            }
        })?;
        let results: Vec<RowResult> = steps.iter().map(|s| s.result.clone()).collect();
        let tokens: Vec<i64> = results
            .iter()
            .map(|r| r.as_ref().map_or(-1, |s| i64::from(s.token)))
            .collect();
        let finished = steps
            .iter()
            .map(|s| {
                s.finished.map(|f| match f {
                    decoda::head::FinishReason::Stop => "stop".to_string(),
                    decoda::head::FinishReason::Length => "length".to_string(),
                })
            })
            .collect();
        Ok((PyArray1::from_vec(py, tokens), finished, extras(&results)))
    }

    /// The verify step (speculative decoding): slot `rows[r]` drafted `drafts[r]`;
    /// `logits` (2-D) holds each row's K + 1 positions in turn. Returns per row the
    /// accepted count, the emitted tokens, the finish, and a JSON array of per-row extras
    /// (`error`, and `logprobs` per emitted token).
    #[allow(clippy::type_complexity)]
    fn verify(
        &self,
        py: Python<'_>,
        logits: &Bound<'_, PyAny>,
        rows: Vec<usize>,
        drafts: Vec<Vec<u32>>,
    ) -> PyResult<(Vec<usize>, Vec<Vec<u32>>, Vec<Option<String>>, String)> {
        let mut head = self.lock()?;
        let head = &mut **head;
        let out = with_logits(py, logits, move |l| head.verify(l, &rows, &drafts))?;
        let finished = out
            .iter()
            .map(|v| {
                v.finished.map(|f| match f {
                    decoda::head::FinishReason::Stop => "stop".to_string(),
                    decoda::head::FinishReason::Length => "length".to_string(),
                })
            })
            .collect();
        let extras: Vec<serde_json::Value> = out
            .iter()
            .map(|v| {
                let err = v.results.iter().find_map(|r| r.as_ref().err());
                serde_json::json!({
                    "error": err.map(|e| serde_json::json!({"kind": e.kind(), "message": e.to_string()})),
                    "logprobs": v.results.iter().filter_map(|r| r.as_ref().ok()).map(|s| &s.logprobs).collect::<Vec<_>>(),
                })
            })
            .collect();
        Ok((
            out.iter().map(|v| v.accepted).collect(),
            out.iter().map(|v| v.tokens()).collect(),
            finished,
            serde_json::Value::Array(extras).to_string(),
        ))
    }
}

/// The keys a request object may hold (sampling parameters, the sequence's state and
/// its token mask): the library's lists.
fn request_keys() -> Vec<&'static str> {
    decoda::params::PARAM_KEYS
        .iter()
        .chain(decoda::params::STATE_KEYS)
        .copied()
        .collect()
}

/// A fresh seed from the operating system's entropy.
#[pyfunction]
fn entropy_seed() -> PyResult<u64> {
    decoda::SequenceState::from_entropy()
        .map(|s| s.seed)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

mod generate;
mod shard;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Sampler>()?;
    m.add_class::<shard::ShardCall>()?;
    m.add_class::<Head>()?;
    m.add_class::<generate::Model>()?;
    m.add_class::<generate::Generation>()?;
    m.add_function(wrap_pyfunction!(entropy_seed, m)?)?;
    m.add("REQUEST_KEYS", request_keys())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
