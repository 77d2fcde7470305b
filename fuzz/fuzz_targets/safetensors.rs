//! The safetensors header check and the shard index: any bytes give a
//! checked header or a one-line error. A header we accept must describe
//! tensors that lie inside the file, and MLX must then load it (or refuse
//! it with an error) without crashing: our check stands in front of MLX.
//! The same bytes are also tried as a `model.safetensors.index.json`.
#![no_main]

use flashbar_models::checkpoint::{read_header_from, shard_names};
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A file of this process only, rewritten for each accepted input.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("flashbar-fuzz-{}.safetensors", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.safetensors");
    match read_header_from(path, Cursor::new(data), data.len() as u64) {
        Ok(tensors) => {
            let header_len = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
            let data_len = data.len() - 8 - header_len;
            for (name, info) in &tensors {
                assert_eq!(name, &info.stored_name);
                let elements: usize = info.shape.iter().product();
                assert!(elements <= data_len, "{name}: {elements} > {data_len}");
            }
            if !tensors.is_empty() {
                let file = scratch();
                std::fs::write(file, data).unwrap();
                if let Ok(arrays) = mlx_rs::Array::load_safetensors(file) {
                    for array in arrays.values() {
                        let _ = array.eval();
                    }
                }
            }
        }
        Err(error) => assert!(!error.to_string().contains('\n'), "{error}"),
    }
    if let Ok(text) = std::str::from_utf8(data) {
        match shard_names(text) {
            Ok(names) => {
                for name in names {
                    let joined = Path::new("/model").join(&name);
                    assert_eq!(joined.parent(), Some(Path::new("/model")), "{name:?}");
                }
            }
            Err(reason) => assert!(!reason.contains('\n'), "{reason}"),
        }
    }
});
