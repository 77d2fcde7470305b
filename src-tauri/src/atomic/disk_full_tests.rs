//! The state files on a disk that is really full: a tmpfs this test mounts
//! (as root, as CI runs; skipped with the reason where mounting is refused),
//! filled by another writer. A save then fails with an error that says the
//! disk is full and how much the save needs, the old file stays whole, no
//! temp file is left holding space, and once space is freed the next save
//! lands (docs/reliability.md, "Disk full").

use crate::settings::{file as settings_file, Settings};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(bytes: u64) -> Result<Tmpfs, String> {
        if !cfg!(target_os = "linux") {
            return Err("tmpfs mounts are Linux's".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes}"),
                "flashbar-test",
            ])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs was refused (needs root / CAP_SYS_ADMIN): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Takes every byte left, as another program filling the disk would.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0x5au8; 4096];
        while file.write(&block).is_ok_and(|n| n > 0) {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

macro_rules! tmpfs_or_skip {
    ($bytes:expr) => {
        match Tmpfs::mount($bytes) {
            Ok(fs) => fs,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        }
    };
}

fn no_temp_files(dir: &Path) {
    let temps: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(temps.is_empty(), "temp files left: {temps:?}");
}

/// Settings padded to about `bytes` (the padding is the target's path).
fn settings_of(bytes: usize, key: &str) -> Settings {
    Settings {
        api_key: key.into(),
        target: "m".repeat(bytes),
        ..Settings::default()
    }
}

#[test]
fn a_full_disk_keeps_the_old_settings_and_says_how_much_room_a_save_needs() {
    let disk = tmpfs_or_skip!(256 << 10);
    let path = disk.path().join("settings.json");
    let old = settings_of(1000, "old");
    settings_file::write(&path, &old).unwrap();
    let filler = disk.fill();

    let new = settings_of(64 << 10, "new");
    let error = settings_file::write(&path, &new).unwrap_err();
    eprintln!("{error}");
    assert!(!error.contains('\n'), "{error}");
    assert!(error.contains("the disk is full"), "{error}");
    assert!(error.contains("the previous version is kept"), "{error}");
    let needed: usize = error
        .split("saving needs ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {error}"));
    assert!(needed > 64 << 10, "{error}");
    assert_eq!(settings_file::read(&path).unwrap(), Some(old));
    no_temp_files(disk.path());

    std::fs::remove_file(filler).unwrap();
    settings_file::write(&path, &new).unwrap();
    assert_eq!(settings_file::read(&path).unwrap(), Some(new));
    no_temp_files(disk.path());
}

#[test]
fn a_full_disk_keeps_the_old_history() {
    let disk = tmpfs_or_skip!(256 << 10);
    let path = disk.path().join("conversations.json");
    let old = r#"[{"title":"old"}]"#;
    crate::history::save(&path, old).unwrap();
    let filler = disk.fill();

    let new = format!(r#"[{{"title":"{}"}}]"#, "n".repeat(64 << 10));
    let error = crate::history::save(&path, &new).unwrap_err();
    eprintln!("{error}");
    assert!(!error.contains('\n'), "{error}");
    assert!(error.contains("the disk is full"), "{error}");
    assert_eq!(crate::history::load(&path).unwrap(), old);
    no_temp_files(disk.path());

    std::fs::remove_file(filler).unwrap();
    crate::history::save(&path, &new).unwrap();
    assert_eq!(crate::history::load(&path).unwrap(), new);
}
