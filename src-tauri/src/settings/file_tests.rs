//! The settings file under SIGKILL (the harness: [`crate::atomic::kill_test`]),
//! its round trip and an unreadable file.

use super::*;
use crate::atomic::kill_test;

/// Settings carrying `n`, padded to ~256 KiB so a write takes a while and
/// kills land inside writes.
fn numbered(n: u64) -> Settings {
    Settings {
        api_key: format!("k{n}"),
        target: "/models/".repeat(32 << 10),
        ..Settings::default()
    }
}

/// The saved number, checking the rest is what the writer wrote.
fn saved_number(path: &Path) -> Result<Option<u64>, String> {
    let Some(settings) = read(path)? else {
        return Ok(None);
    };
    let n = settings.api_key[1..]
        .parse()
        .map_err(|e| format!("api_key {:?}: {e}", settings.api_key))?;
    if settings != numbered(n) {
        return Err(format!("settings {n} are not what was written"));
    }
    Ok(Some(n))
}

#[test]
#[ignore = "the writer child of killed_writers_leave_a_readable_file"]
fn writer_child() {
    let Some(path) = kill_test::child_path() else {
        return;
    };
    let start = saved_number(&path).unwrap().map_or(0, |n| n + 1);
    for n in start.. {
        write(&path, &numbered(n)).unwrap();
    }
}

#[test]
fn killed_writers_leave_a_readable_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("settings.json");
    kill_test::kill_writers(
        "settings::file::tests::writer_child",
        &path,
        20,
        saved_number,
    );
}

#[test]
fn missing_and_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/settings.json");
    assert_eq!(read(&path), Ok(None));
    let settings = Settings {
        port: 9000,
        ..Settings::default()
    };
    write(&path, &settings).unwrap();
    assert_eq!(read(&path), Ok(Some(settings)));
    std::fs::write(&path, "{\"settings\": {\"port\": ").unwrap();
    assert!(read(&path).unwrap_err().contains("settings.json"));
}
