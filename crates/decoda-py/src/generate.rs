//! `decoda.load(...)` and `Model.generate(...)`: a Qwen3-MoE checkpoint's decode loop
//! (the library's `generate_checked`) on a thread of its own, its tokens streamed to a
//! Python iterator as they are drawn.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};

use decoda::cpu::CpuModel;
use decoda::head::SlotRequest;
use decoda::model::{
    generate_checked, generate_speculative, CheckedSequences, Engine, Forward, Qwen3Moe, Sequence,
    DEFAULT_SORT_CUTOFF,
};
use decoda::wgpu::WgpuModel;
use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyValueError};
use pyo3::prelude::*;

/// A loaded checkpoint (config.json, safetensors, and tokenizer.json when present).
#[pyclass(module = "decoda._native", frozen)]
pub struct Model {
    model: Arc<Qwen3Moe>,
    tokenizer: Option<Arc<tokenizers::Tokenizer>>,
    device: crate::Device,
    dir: PathBuf,
}

enum Event {
    Token(usize, u32),
    Done(String),
    Failed(String),
}

/// The tokens of a generation as they are drawn: `(sequence, token id)` pairs; then
/// `report` holds the run's outputs and timings (JSON).
#[pyclass(module = "decoda._native")]
pub struct Generation {
    rx: Mutex<Receiver<Event>>,
    report: Option<String>,
}

#[pymethods]
impl Generation {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<(usize, u32)> {
        if self.report.is_some() {
            return Err(PyStopIteration::new_err(()));
        }
        let rx = &self.rx;
        let event = py.allow_threads(|| rx.lock().ok().and_then(|r| r.recv().ok()));
        match event {
            Some(Event::Token(seq, id)) => Ok((seq, id)),
            Some(Event::Done(report)) => {
                self.report = Some(report);
                Err(PyStopIteration::new_err(()))
            }
            Some(Event::Failed(msg)) => Err(PyRuntimeError::new_err(msg)),
            None => Err(PyRuntimeError::new_err("the generation thread ended early")),
        }
    }

    /// The run's report as JSON once the iterator is exhausted (else `None`).
    #[getter]
    fn report(&self) -> Option<String> {
        self.report.clone()
    }
}

/// The engine for `device`: the CPU, or the model and head on a GPU (sampling on the
/// host when a sequence uses a stage the device head does not run yet).
fn engine(
    device: crate::Device,
    model: Arc<Qwen3Moe>,
    slots: usize,
    positions: usize,
    host_head: bool,
) -> decoda::Result<Box<dyn Engine + Send>> {
    Ok(match device.gpu()? {
        None => Box::new(decoda::CpuEngine::new(model, slots)?),
        Some(s) => {
            let v = model.config.vocab_size;
            let host: Option<Box<dyn decoda::head::Head + Send>> = if host_head {
                Some(Box::new(decoda::CpuHead::new(slots, v)?))
            } else {
                None
            };
            Box::new(decoda::wgpu::WgpuEngine::new(
                &s, model, slots, positions, host,
            )?)
        }
    })
}

/// The target's and the draft's models for speculative decoding on `device` (their
/// logits sampled on the host).
fn forwards(
    device: crate::Device,
    model: Arc<Qwen3Moe>,
    draft: Arc<Qwen3Moe>,
    slots: usize,
    positions: usize,
) -> decoda::Result<(Box<dyn Forward + Send>, Box<dyn Forward + Send>)> {
    Ok(match device.gpu()? {
        None => (
            Box::new(CpuModel::new(model, slots)?),
            Box::new(CpuModel::new(draft, slots)?),
        ),
        Some(s) => (
            Box::new(WgpuModel::new(&s, model, slots, positions)?),
            Box::new(WgpuModel::new(&s, draft, slots, positions)?),
        ),
    })
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (model_dir, device = "auto", sort_cutoff = DEFAULT_SORT_CUTOFF))]
    fn new(py: Python<'_>, model_dir: PathBuf, device: &str, sort_cutoff: usize) -> PyResult<Self> {
        let device = crate::Device::parse(device)?;
        let dir = model_dir.clone();
        let model = py
            .allow_threads(|| Qwen3Moe::load(&dir, sort_cutoff))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let tok_path = model_dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() {
            Some(Arc::new(
                tokenizers::Tokenizer::from_file(&tok_path)
                    .map_err(|e| PyValueError::new_err(format!("{}: {e}", tok_path.display())))?,
            ))
        } else {
            None
        };
        Ok(Self {
            model: Arc::new(model),
            tokenizer,
            device,
            dir: model_dir,
        })
    }

    /// The model's vocabulary size.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    /// Token ids of `text` (needs tokenizer.json).
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        let t = self.tokenizer.as_ref().ok_or_else(|| {
            PyValueError::new_err(format!(
                "no tokenizer: {} is missing; give token ids",
                self.dir.join("tokenizer.json").display()
            ))
        })?;
        t.encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The text of `ids` (needs tokenizer.json).
    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        let t = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("no tokenizer.json in the model directory"))?;
        t.decode(&ids, false)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Starts a generation: `sequences` is a JSON array of `{"prompt_ids", "request",
    /// "max_tokens", "stop"}` (`request`: parameters, `seed`, `allowed`); a sequence
    /// ends at a stop id, at `max_tokens`, or when its text contains one of
    /// `stop_strings`. Returns the iterator of its tokens.
    #[pyo3(signature = (sequences, stop_strings, draft = None, speculate = 4))]
    fn generate(
        &self,
        sequences: &str,
        stop_strings: Vec<String>,
        draft: Option<PyRef<'_, Model>>,
        speculate: usize,
    ) -> PyResult<Generation> {
        let items: Vec<serde_json::Value> = serde_json::from_str(sequences)
            .map_err(|e| PyValueError::new_err(format!("sequences: {e}")))?;
        let mut seqs = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let bad = |what: &str| PyValueError::new_err(format!("sequence {i}: {what}"));
            let prompt: Vec<u32> = serde_json::from_value(item["prompt_ids"].clone())
                .map_err(|e| bad(&format!("prompt_ids: {e}")))?;
            let r: decoda::Request = serde_json::from_value(item["request"].clone())
                .map_err(|e| bad(&format!("request: {e}")))?;
            let max_tokens = item["max_tokens"]
                .as_u64()
                .ok_or_else(|| bad("max_tokens"))?;
            let stop: Vec<u32> = serde_json::from_value(item["stop"].clone()).unwrap_or_default();
            let mut request = SlotRequest::new(r.params)
                .seed(r.state.seed)
                .max_tokens(max_tokens)
                .stop(stop);
            request.allowed = r.allowed;
            seqs.push(Sequence { prompt, request });
        }
        // the door every binding shares, before the thread starts
        let cfg = &self.model.config;
        let slots = seqs.len();
        let checked = CheckedSequences::new(
            std::borrow::Cow::Owned(seqs),
            cfg.vocab_size,
            slots,
            cfg.max_position_embeddings,
        )
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let seqs = checked.sequences();
        if !stop_strings.is_empty() && self.tokenizer.is_none() {
            return Err(PyValueError::new_err("stop strings need tokenizer.json"));
        }
        let drafter = match &draft {
            None => None,
            Some(d) => {
                if d.model.config.vocab_size != cfg.vocab_size {
                    return Err(PyValueError::new_err(format!(
                        "draft: vocab_size {}; the model's is {} (a draft must share the \
                         vocabulary)",
                        d.model.config.vocab_size, cfg.vocab_size
                    )));
                }
                if speculate == 0 {
                    return Err(PyValueError::new_err(
                        "speculate = 0: expected at least 1 drafted token a round",
                    ));
                }
                Some(d.model.clone())
            }
        };
        let host_head = seqs.iter().any(|s| s.beyond_device().is_some());
        let positions = seqs
            .iter()
            .map(|s| s.prompt.len() + s.request.max_tokens.unwrap_or(0) as usize)
            .max()
            .unwrap_or(1);
        let (tx, rx) = channel();
        let (model, device, tok) = (self.model.clone(), self.device, self.tokenizer.clone());
        std::thread::spawn(move || {
            let run = || -> decoda::Result<String> {
                let mut stop = |i: usize, ids: &[u32]| -> bool {
                    if let Some(&t) = ids.last() {
                        let _ = tx.send(Event::Token(i, t));
                    }
                    match &tok {
                        Some(t) if !stop_strings.is_empty() => {
                            t.decode(ids, false).is_ok_and(|text| {
                                stop_strings.iter().any(|s| text.contains(s.as_str()))
                            })
                        }
                        _ => false,
                    }
                };
                let json = |e: serde_json::Error| decoda::Error::Model(e.to_string());
                let v = match drafter {
                    None => {
                        let mut eng = engine(device, model, slots, positions, host_head)?;
                        let r = generate_checked(eng.as_mut(), &checked, &mut |_| {}, &mut stop)?;
                        let mut v = serde_json::to_value(&r).map_err(json)?;
                        v["device"] = serde_json::json!(eng.name());
                        v
                    }
                    Some(d) => {
                        let (mut target, mut drafter) =
                            forwards(device, model, d, slots, positions)?;
                        let mut head = decoda::CpuHead::new(slots, target.vocab())?;
                        let r = generate_speculative(
                            target.as_mut(),
                            &mut head,
                            drafter.as_mut(),
                            &decoda::CpuSampler::new(),
                            speculate,
                            &checked,
                            &mut |_| {},
                            &mut stop,
                        )?;
                        let mut v = serde_json::to_value(&r).map_err(json)?;
                        v["acceptance"] = serde_json::json!(r.acceptance());
                        v["speculate"] = serde_json::json!(speculate);
                        v["device"] = serde_json::json!(target.name());
                        v
                    }
                };
                Ok(v.to_string())
            };
            let event = match run() {
                Ok(r) => Event::Done(r),
                Err(e) => Event::Failed(e.to_string()),
            };
            let _ = tx.send(event);
        });
        Ok(Generation {
            rx: Mutex::new(rx),
            report: None,
        })
    }
}
