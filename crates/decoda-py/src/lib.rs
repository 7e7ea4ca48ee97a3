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

/// The device's name for a sampler request: `cpu`, `wgpu` (any adapter, software ones
/// included) or `auto` (a hardware GPU, else the CPU).
fn open(device: &str, threads: Option<usize>) -> PyResult<Box<dyn Backend>> {
    let cpu = || -> PyResult<Box<dyn Backend>> {
        Ok(match threads {
            None | Some(0) => Box::new(CpuSampler::new()),
            Some(n) => Box::new(
                CpuSampler::with_threads(n).map_err(|e| PyValueError::new_err(e.to_string()))?,
            ),
        })
    };
    match device {
        "cpu" => cpu(),
        "wgpu" => decoda::wgpu::WgpuSampler::new()
            .map(|s| Box::new(s) as Box<dyn Backend>)
            .map_err(|e| PyRuntimeError::new_err(e.to_string())),
        "auto" => match decoda::wgpu::WgpuSampler::hardware() {
            Ok(s) => Ok(Box::new(s)),
            Err(_) => cpu(),
        },
        other => Err(PyValueError::new_err(format!(
            "device must be \"cpu\", \"wgpu\" or \"auto\", not {other:?}"
        ))),
    }
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
        let results = if let Ok(a) = logits.downcast::<numpy::PyArray2<f32>>() {
            let ro: PyReadonlyArray2<f32> = a.readonly();
            let (b, v) = (ro.shape()[0], ro.shape()[1]);
            let data = ro.as_slice().map_err(|_| {
                PyValueError::new_err("logits must be C-contiguous (use np.ascontiguousarray)")
            })?;
            py.allow_threads(|| {
                Logits::f32(data, b, v).and_then(|l| self.backend.sample(&l, &reqs))
            })
        } else if let Ok(a) = logits.downcast::<numpy::PyArray2<half::f16>>() {
            let ro: PyReadonlyArray2<half::f16> = a.readonly();
            let (b, v) = (ro.shape()[0], ro.shape()[1]);
            let data = ro.as_slice().map_err(|_| {
                PyValueError::new_err("logits must be C-contiguous (use np.ascontiguousarray)")
            })?;
            py.allow_threads(|| {
                Logits::f16(data, b, v).and_then(|l| self.backend.sample(&l, &reqs))
            })
        } else {
            return Err(PyTypeError::new_err(
                "logits must be a 2-D numpy array of float32 or float16",
            ));
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let tokens: Vec<i64> = results
            .iter()
            .map(|r| r.as_ref().map_or(-1, |s| i64::from(s.token)))
            .collect();
        Ok((PyArray1::from_vec(py, tokens), extras(&results)))
    }
}

/// The keys a request object may hold (sampling parameters, the sequence's state and
/// its token mask).
fn request_keys() -> Vec<&'static str> {
    vec![
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "logprobs_mode",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "top_n_sigma",
        "typical_p",
        "xtc_probability",
        "xtc_threshold",
        "kept",
        "seed",
        "step",
        "prompt",
        "output",
        "allowed",
    ]
}

/// A fresh seed from the operating system's entropy.
#[pyfunction]
fn entropy_seed() -> PyResult<u64> {
    decoda::SequenceState::from_entropy()
        .map(|s| s.seed)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Sampler>()?;
    m.add_function(wrap_pyfunction!(entropy_seed, m)?)?;
    m.add("REQUEST_KEYS", request_keys())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
