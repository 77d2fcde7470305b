//! The two CUDA compile caches' shared file handling (docs/gpu.md, "The
//! kernel cache"): where a cache lives, and writing an entry whole.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The folder a cache variable (`FLASHBAR_KERNEL_CACHE`,
/// `FLASHBAR_NVRTC_CACHE`) names: none when empty, `0` or `off`;
/// `$XDG_CACHE_HOME/flashbar/<default>` (or `~/.cache/flashbar/<default>`)
/// for `1` or `on`; else the value itself. Unset, it reads as `1` where the
/// cache is on by default (`on_when_unset`), else as `0`.
pub(crate) fn folder(var: &str, default: &str, on_when_unset: bool) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    folder_from(
        std::env::var_os(var).as_deref(),
        base,
        default,
        on_when_unset,
    )
}

fn folder_from(
    value: Option<&OsStr>,
    base: Option<PathBuf>,
    default: &str,
    on_when_unset: bool,
) -> Option<PathBuf> {
    let value = value.or_else(|| on_when_unset.then_some(OsStr::new("1")));
    match value?.to_str() {
        Some("" | "0" | "off") => None,
        Some("1" | "on") => base.map(|b| b.join("flashbar").join(default)),
        _ => value.map(PathBuf::from),
    }
}

/// Writes `bytes` to `file` through a temporary file and a rename, so a
/// reader never sees half an entry. A folder we cannot write only costs the
/// next process a compile.
pub(crate) fn write_whole(file: &Path, bytes: &[u8]) {
    let Some(dir) = file.parent() else { return };
    let temp = file.with_extension(format!("{}.tmp", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&temp, bytes))
        .and_then(|_| std::fs::rename(&temp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_variable_names_no_folder_the_default_or_its_own() {
        let base = || Some(PathBuf::from("/c"));
        let of = |v: Option<&str>| folder_from(v.map(OsStr::new), base(), "k", false);
        assert_eq!(of(None), None);
        let on = |v: Option<&str>| folder_from(v.map(OsStr::new), base(), "k", true);
        assert_eq!(
            on(None),
            Some(PathBuf::from("/c/flashbar/k")),
            "on by default"
        );
        assert_eq!(on(Some("0")), None, "turned off");
        assert_eq!(on(Some("/x")), Some(PathBuf::from("/x")));
        for off in ["", "0", "off"] {
            assert_eq!(of(Some(off)), None, "{off}");
        }
        assert_eq!(of(Some("1")), Some(PathBuf::from("/c/flashbar/k")));
        assert_eq!(of(Some("on")), Some(PathBuf::from("/c/flashbar/k")));
        assert_eq!(of(Some("/x/y")), Some(PathBuf::from("/x/y")));
        assert_eq!(
            folder_from(Some(OsStr::new("1")), None, "k", false),
            None,
            "no home, no cache"
        );
    }

    #[test]
    fn an_entry_is_written_whole_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a/b/entry.bin");
        write_whole(&file, b"first");
        write_whole(&file, b"second");
        assert_eq!(std::fs::read(&file).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(file.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
    }
}
