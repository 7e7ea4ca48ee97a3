//! Reading a checkpoint: `config.json` and `*.safetensors` (one file, or shards listed
//! in `model.safetensors.index.json`), memory-mapped, through the `safetensors` crate,
//! which checks every header (its length, the offsets, that each shape fits its bytes)
//! before a tensor is read. Tensors are found by name in Hugging Face's layout
//! (`mlp.experts.E.gate_proj.weight`) or MLX's (`mlp.switch_mlp.gate_proj.weight`, and
//! affine-quantized linears with `scales` and `biases`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::moe::{Affine, ExpertWeights};

/// The tensors of a checkpoint's files, by name.
pub struct Checkpoint {
    dir: PathBuf,
    maps: Vec<memmap2::Mmap>,
    /// name -> (file, dtype, shape, byte range in the file)
    index: HashMap<String, (usize, Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("files", &self.maps.len())
            .field("tensors", &self.index.len())
            .finish()
    }
}

fn merr(msg: String) -> Error {
    Error::Model(msg)
}

/// A tensor's values as f32 (f32, f16 and bf16 tensors; widened exactly).
fn to_f32(dtype: Dtype, bytes: &[u8], name: &str) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(merr(format!(
                "tensor {name} is {other:?}; expected F32, F16 or BF16"
            )))
        }
    })
}

impl Checkpoint {
    /// Opens the safetensors files of `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let shown = dir.display();
        let index_file = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_file.exists() {
            let text = std::fs::read_to_string(&index_file)
                .map_err(|e| merr(format!("cannot read {}: {e}", index_file.display())))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| merr(format!("{}: not JSON: {e}", index_file.display())))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| merr(format!("{}: no weight_map object", index_file.display())))?;
            let mut names: Vec<String> = map
                .values()
                .map(|f| {
                    f.as_str().map(str::to_string).ok_or_else(|| {
                        merr(format!(
                            "{}: a weight_map entry is not a file name",
                            index_file.display()
                        ))
                    })
                })
                .collect::<Result<_>>()?;
            names.sort();
            names.dedup();
            for n in &names {
                if n.contains('/') || n.contains('\\') || n.starts_with('.') {
                    return Err(merr(format!(
                        "{}: shard name {n:?} is not a file in the directory",
                        index_file.display()
                    )));
                }
            }
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| merr(format!("cannot read the directory {shown}: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(merr(format!("{shown} holds no .safetensors file")));
        }
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for (fi, path) in files.iter().enumerate() {
            let file = std::fs::File::open(path)
                .map_err(|e| merr(format!("cannot open {}: {e}", path.display())))?;
            // SAFETY: the map is read-only and lives as long as the checkpoint; decoda
            // never writes through it. (Another process truncating the file while it is
            // mapped is outside what a reader can guard against.)
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| merr(format!("cannot map {}: {e}", path.display())))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| {
                merr(format!(
                    "{}: not a valid safetensors file: {e}",
                    path.display()
                ))
            })?;
            let base = map.as_ptr() as usize;
            for (name, view) in st.tensors() {
                let data = view.data();
                let start = data.as_ptr() as usize - base;
                index.insert(
                    name,
                    (
                        fi,
                        view.dtype(),
                        view.shape().to_vec(),
                        start..start + data.len(),
                    ),
                );
            }
            maps.push(map);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            maps,
            index,
        })
    }

    /// Whether the checkpoint holds `name`.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The dtype, shape and bytes of `name`.
    pub fn raw(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let (f, dt, shape, range) = self.index.get(name).ok_or_else(|| {
            merr(format!(
                "tensor {name} is missing from {}",
                self.dir.display()
            ))
        })?;
        Ok((*dt, shape, &self.maps[*f][range.clone()]))
    }

    fn expect_shape(&self, name: &str, want: &[usize]) -> Result<(Dtype, &[u8])> {
        let (dt, shape, bytes) = self.raw(name)?;
        if shape != want {
            return Err(merr(format!(
                "tensor {name} has shape {shape:?}; the config needs {want:?}"
            )));
        }
        Ok((dt, bytes))
    }

    /// A vector of `n` values (norm weights), as f32.
    pub fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let (dt, bytes) = self.expect_shape(name, &[n])?;
        to_f32(dt, bytes, name)
    }

    /// A linear layer `prefix.weight [out, in]` (f32, f16, bf16, or MLX affine with
    /// `prefix.scales` and `prefix.biases`) as one-expert weights `[1, out, in]`.
    pub fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<ExpertWeights> {
        self.stacked(&[prefix.to_string()], &[], out, inp)
    }

    /// Experts `[E, out, in]`: MLX's stacked `prefix.weight [E, out, in]` (or affine
    /// `[E, out, in * bits / 32]` with scales and biases), or Hugging Face's per-expert
    /// tensors `each[e].weight [out, in]`.
    pub fn experts(
        &self,
        stacked: &str,
        each: &[String],
        out: usize,
        inp: usize,
    ) -> Result<ExpertWeights> {
        if self.has(&format!("{stacked}.weight")) {
            return self.stacked(&[stacked.to_string()], &[each.len()], out, inp);
        }
        self.stacked(each, &[], out, inp)
    }

    /// `prefixes` stacked (HF) or one prefix with a leading `lead` axis (MLX).
    fn stacked(
        &self,
        prefixes: &[String],
        lead: &[usize],
        out: usize,
        inp: usize,
    ) -> Result<ExpertWeights> {
        let experts = lead.first().copied().unwrap_or(prefixes.len());
        let wname = format!("{}.weight", prefixes[0]);
        let sname = format!("{}.scales", prefixes[0]);
        if self.has(&sname) {
            // affine: infer bits and group from the shapes, check them against the config
            let (_, wshape, _) = self.raw(&wname)?;
            let (_, sshape, _) = self.raw(&sname)?;
            let (wc, sc) = (*wshape.last().unwrap_or(&0), *sshape.last().unwrap_or(&0));
            if wc == 0 || sc == 0 || !(32 * wc).is_multiple_of(inp) || !inp.is_multiple_of(sc) {
                return Err(merr(format!(
                    "tensor {wname} has shape {wshape:?} and {sname} {sshape:?}: no 4- or 8-bit \
                     packing of {inp} inputs fits them"
                )));
            }
            let q = Affine::new((32 * wc / inp) as u32, inp / sc)
                .map_err(|e| merr(format!("tensor {wname}: {e}")))?;
            let mut packed = Vec::new();
            let mut scales = Vec::new();
            let mut biases = Vec::new();
            for p in prefixes {
                let dims = |last: usize| -> Vec<usize> {
                    let mut d = lead.to_vec();
                    d.extend([out, last]);
                    d
                };
                let (dt, bytes) = self.expect_shape(&format!("{p}.weight"), &dims(wc))?;
                if dt != Dtype::U32 {
                    return Err(merr(format!(
                        "tensor {p}.weight is {dt:?}; packed weights are U32"
                    )));
                }
                packed.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
                let (dt, bytes) = self.expect_shape(&format!("{p}.scales"), &dims(sc))?;
                scales.extend(to_f32(dt, bytes, &format!("{p}.scales"))?);
                let (dt, bytes) = self.expect_shape(&format!("{p}.biases"), &dims(sc))?;
                biases.extend(to_f32(dt, bytes, &format!("{p}.biases"))?);
            }
            return ExpertWeights::from_affine(q, packed, scales, biases, experts, out, inp)
                .map_err(|e| merr(format!("{wname}: {e}")));
        }
        let mut dims = lead.to_vec();
        dims.extend([out, inp]);
        let (dt0, _) = self.expect_shape(&wname, &dims)?;
        let build = |dt: Dtype| -> Result<ExpertWeights> {
            let mut all16: Vec<u16> = Vec::new();
            let mut all32: Vec<f32> = Vec::new();
            for p in prefixes {
                let name = format!("{p}.weight");
                let (d, bytes) = self.expect_shape(&name, &dims)?;
                if d != dt {
                    return Err(merr(format!("tensor {name} is {d:?}; {wname} is {dt:?}")));
                }
                match dt {
                    Dtype::F32 => all32.extend(to_f32(dt, bytes, &name)?),
                    Dtype::F16 | Dtype::BF16 => all16.extend(
                        bytes
                            .chunks_exact(2)
                            .map(|c| u16::from_le_bytes([c[0], c[1]])),
                    ),
                    other => {
                        return Err(merr(format!(
                            "tensor {name} is {other:?}; expected F32, F16 or BF16"
                        )))
                    }
                }
            }
            match dt {
                Dtype::F32 => ExpertWeights::from_f32(all32, experts, out, inp),
                Dtype::F16 => ExpertWeights::from_f16(
                    all16.into_iter().map(f16::from_bits).collect(),
                    experts,
                    out,
                    inp,
                ),
                _ => ExpertWeights::from_bf16(
                    all16.into_iter().map(bf16::from_bits).collect(),
                    experts,
                    out,
                    inp,
                ),
            }
        };
        build(dt0)
    }
}
