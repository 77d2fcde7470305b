//! The safetensors files of a checkpoint: headers read and checked before any
//! tensor is allocated, names normalized across HF and MLX layouts.
//!
//! Weights live in `model.safetensors`, or in the shards a
//! `model.safetensors.index.json` names. Tensors of the multi-token-prediction
//! head (any name with `mtp.`) and of vision towers (`vision_tower*`,
//! `model.visual*`) are skipped, as mlx-lm's sanitize drops them, and
//! counted in [`Checkpoint::skipped`] so `flashbar doctor` can say so
//! (docs/checkpoints.md).

use crate::error::{ModelError, Result};
use mlx_rs::Array;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What a safetensors header says about one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The name as stored in the file.
    pub stored_name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub file: PathBuf,
}

impl TensorInfo {
    /// Bytes of its data (checked against the file by [`read_header`]).
    pub fn bytes(&self) -> u64 {
        let element = dtype_bytes(&self.dtype).unwrap_or(0) as u64;
        self.shape
            .iter()
            .fold(element, |acc, &d| acc.saturating_mul(d as u64))
    }
}

/// All tensors of a checkpoint, by normalized name.
#[derive(Debug)]
pub struct Checkpoint {
    pub tensors: BTreeMap<String, TensorInfo>,
    /// What the files hold besides the text model, not loaded.
    pub skipped: Skipped,
}

/// A part of a checkpoint the text model does not use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkippedPart {
    /// The vision encoder: `vision_tower.*` (mlx-vlm conversions) or
    /// `model.visual.*` (HF checkpoints).
    Vision,
    /// The multi-token-prediction head (`mtp.*`, HF checkpoints).
    Mtp,
}

/// How many tensors, and bytes, of one skipped part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    pub tensors: usize,
    pub bytes: u64,
}

/// The tensors skipped while opening a checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub vision: Count,
    pub mtp: Count,
}

impl Skipped {
    fn add(&mut self, part: SkippedPart, bytes: u64) {
        let count = match part {
            SkippedPart::Vision => &mut self.vision,
            SkippedPart::Mtp => &mut self.mtp,
        };
        count.tensors += 1;
        count.bytes += bytes;
    }

    /// One line for `flashbar doctor`, or None when nothing was skipped.
    pub fn note(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.vision, "vision-tower"),
            (self.mtp, "multi-token-prediction (MTP)"),
        ]
        .iter()
        .filter(|(count, _)| count.tensors > 0)
        .map(|(count, what)| {
            format!(
                "{} {what} tensors ({:.2} GB)",
                count.tensors,
                count.bytes as f64 / 1e9
            )
        })
        .collect();
        if parts.is_empty() {
            return None;
        }
        Some(format!(
            "skipped {}: the text model does not use them (as mlx-lm's sanitize drops them)",
            parts.join(" and ")
        ))
    }
}

/// Which skipped part a stored tensor (or quantized module) name belongs
/// to, by mlx-lm's rules for Qwen3.5: a `vision_tower` or `model.visual`
/// prefix, or `mtp.` anywhere in the name.
pub fn skipped_part(name: &str) -> Option<SkippedPart> {
    if name.starts_with("vision_tower") || name.starts_with("model.visual") {
        Some(SkippedPart::Vision)
    } else if name.contains("mtp.") {
        Some(SkippedPart::Mtp)
    } else {
        None
    }
}

/// Largest header we accept; real ones are a few MB at most.
const MAX_HEADER_BYTES: u64 = 100 << 20;

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        let mut tensors = BTreeMap::new();
        let mut skipped = Skipped::default();
        for file in weight_files(dir)? {
            for (stored_name, info) in read_header(&file)? {
                if let Some(part) = skipped_part(&stored_name) {
                    skipped.add(part, info.bytes());
                    continue;
                }
                let name = normalize_name(&stored_name);
                if tensors.insert(name.clone(), info).is_some() {
                    return Err(ModelError::UnexpectedTensor(format!(
                        "{name:?} (stored twice)"
                    )));
                }
            }
        }
        Ok(Checkpoint { tensors, skipped })
    }

    /// Loads every tensor and reads its bytes now. MLX would read them
    /// lazily, at the first request; then a folder truncated or replaced
    /// under a running engine failed that request, and every later one, with
    /// "Unable to read from file" (docs/reliability.md, "A model folder
    /// changed under a running engine"). Read here, a change after loading
    /// cannot reach the engine, and one during loading fails the load.
    pub fn load(&self) -> Result<HashMap<String, Array>> {
        let files: BTreeSet<&PathBuf> = self.tensors.values().map(|t| &t.file).collect();
        let mut by_stored_name = HashMap::new();
        for file in files {
            let arrays = Array::load_safetensors(file)?;
            mlx_rs::transforms::eval(arrays.values()).map_err(|e| ModelError::Safetensors {
                path: file.clone(),
                // mlx-c appends its source location to the message.
                reason: format!(
                    "cannot read its tensors (changed while loading?): {}",
                    e.what().split(" at /").next().unwrap_or_default()
                ),
            })?;
            flashbar_mlx::memory::read_on_gpu(arrays.values());
            by_stored_name.extend(arrays);
        }
        let mut out = HashMap::with_capacity(self.tensors.len());
        for (name, info) in &self.tensors {
            let array = by_stored_name
                .remove(&info.stored_name)
                .ok_or_else(|| ModelError::MissingTensor(info.stored_name.clone()))?;
            out.insert(name.clone(), array);
        }
        Ok(out)
    }
}

/// HF (`model.language_model.*`) and MLX (`language_model.model.*`) names
/// become `model.*` and `lm_head.*`.
pub fn normalize_name(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else if let Some(rest) = name.strip_prefix("language_model.") {
        rest.to_owned()
    } else {
        name.to_owned()
    }
}

fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|error| ModelError::Io {
            path: index.clone(),
            error,
        })?;
        let shards = shard_names(&text).map_err(|reason| ModelError::Config {
            path: index.clone(),
            reason,
        })?;
        return Ok(shards.into_iter().map(|file| dir.join(file)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        Ok(vec![single])
    } else {
        Err(ModelError::NoWeights {
            dir: dir.to_owned(),
        })
    }
}

/// The shard files a `model.safetensors.index.json` names, each once, in
/// order; a name that could leave the model folder is refused.
pub fn shard_names(index_json: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value = serde_json::from_str(index_json).map_err(|e| e.to_string())?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no `weight_map` object")?;
    let mut files = BTreeSet::new();
    for file in map.values() {
        let file = file
            .as_str()
            .ok_or("weight_map values must be file names")?;
        if file == "." {
            return Err("shard name \".\" names the model folder, not a file".to_owned());
        }
        if file.is_empty()
            || file.contains(['/', '\\', '\0'])
            || file.contains("..")
            || Path::new(file).is_absolute()
        {
            return Err(format!("shard name {file:?} leaves the model folder"));
        }
        files.insert(file.to_owned());
    }
    Ok(files.into_iter().collect())
}

/// Reads and checks one file's header: every tensor's bytes must lie inside
/// the file and match its dtype and shape, so a truncated download is caught
/// here instead of inside MLX.
pub fn read_header(path: &Path) -> Result<BTreeMap<String, TensorInfo>> {
    let io = |error| ModelError::Io {
        path: path.to_owned(),
        error,
    };
    let file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    read_header_from(path, file, file_len)
}

/// [`read_header`] over any reader holding a file of `file_len` bytes
/// (`path` only names it in errors).
pub fn read_header_from(
    path: &Path,
    mut file: impl Read,
    file_len: u64,
) -> Result<BTreeMap<String, TensorInfo>> {
    let bad = |reason: String| ModelError::Safetensors {
        path: path.to_owned(),
        reason,
    };
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|_| bad("shorter than its 8-byte header length".into()))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES || header_len > file_len.saturating_sub(8) {
        return Err(bad(format!("header length {header_len} exceeds the file")));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header)
        .map_err(|e| bad(format!("cannot read header: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let entries = value
        .as_object()
        .ok_or_else(|| bad("header is not a JSON object".into()))?;
    let data_len = file_len - 8 - header_len;

    let mut tensors = BTreeMap::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let dtype = entry["dtype"]
            .as_str()
            .ok_or_else(|| bad(format!("{name:?}: no dtype")))?
            .to_owned();
        let shape = entry["shape"]
            .as_array()
            .ok_or_else(|| bad(format!("{name:?}: no shape")))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(format!("{name:?}: shape is not a list of sizes")))?;
        let offsets = entry["data_offsets"]
            .as_array()
            .and_then(|o| Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?)))
            .ok_or_else(|| bad(format!("{name:?}: no data_offsets")))?;
        let element_bytes =
            dtype_bytes(&dtype).ok_or_else(|| bad(format!("{name:?}: unknown dtype {dtype:?}")))?;
        let expected = shape
            .iter()
            .try_fold(element_bytes as u64, |acc, &d| acc.checked_mul(d as u64))
            .ok_or_else(|| bad(format!("{name:?}: shape overflows")))?;
        let (start, end) = offsets;
        if end < start || end - start != expected {
            return Err(bad(format!(
                "{name:?}: {} bytes for shape {shape:?}",
                end.wrapping_sub(start)
            )));
        }
        if end > data_len {
            return Err(bad(format!(
                "{name:?} ends at byte {end} but the file holds {data_len} (truncated?)"
            )));
        }
        tensors.insert(
            name.clone(),
            TensorInfo {
                stored_name: name.clone(),
                dtype,
                shape,
                file: path.to_owned(),
            },
        );
    }
    Ok(tensors)
}

fn dtype_bytes(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::{read_header_from, shard_names};
    use std::io::Cursor;
    use std::path::Path;

    #[test]
    fn header_errors_stay_on_one_line_whatever_the_tensor_names() {
        // From the CI fuzz smoke: a JSON-escaped newline in a tensor name
        // broke the one-line error.
        let header = br#"{"lm\nhead": {"dtype": "F\n32", "shape": [4], "data_offsets": [0, 16]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header);
        file.extend_from_slice(&[0, 0]);
        for len in [file.len(), file.len() + 14] {
            let mut bytes = file.clone();
            bytes.resize(len, 0);
            let error = read_header_from(Path::new("x"), Cursor::new(&bytes), len as u64)
                .unwrap_err()
                .to_string();
            assert!(!error.contains('\n'), "{error}");
            assert!(error.contains(r#""lm\nhead""#), "{error}");
        }
    }

    #[test]
    fn shard_names_are_files_inside_the_model_folder() {
        let index = r#"{"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors"}}"#;
        assert_eq!(shard_names(index).unwrap(), vec!["model-1.safetensors"]);
        // "." came from the fuzzer: joined to the folder, it names the folder.
        for bad in [".", "..", "", "../x", "a/b", "/abs"] {
            let index = serde_json::json!({"weight_map": {"w": bad}}).to_string();
            assert!(shard_names(&index).is_err(), "{bad:?} was accepted");
        }
    }
}
