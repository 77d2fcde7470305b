//! The history file: SIGKILL during saves (the harness shared with the
//! settings: [`crate::atomic::kill_test`]), bad input refused, an unreadable
//! file kept aside.

use super::*;
use crate::atomic::kill_test;
use serde_json::{json, Value};

/// Conversation `i` as the writer saves it; the first is padded to
/// ~256 KiB so a write takes a while and kills land inside writes.
fn conversation(i: u64) -> Value {
    let padding = if i == 0 { 256 << 10 } else { 40 };
    json!({
        "id": format!("c{i}"),
        "title": "x".repeat(padding),
        "turns": [{ "role": "user", "segments": [{ "text": format!("question {i}"), "fromDraft": false }] }],
        "updated": i,
    })
}

/// How many conversations the saved array holds, checking each is what
/// the writer wrote.
fn saved_number(path: &Path) -> Result<Option<u64>, String> {
    if !path.exists() {
        return Ok(None);
    }
    let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
    let all: Vec<Value> = serde_json::from_str(&text).map_err(|e| format!("{e}: {text:.80}"))?;
    for (i, c) in (0..).zip(&all) {
        if *c != conversation(i) {
            return Err(format!("conversation {i} is not what was written"));
        }
    }
    Ok(Some(all.len() as u64))
}

#[test]
#[ignore = "the writer child of killed_history_saves_leave_a_readable_file"]
fn writer_child() {
    let Some(path) = kill_test::child_path() else {
        return;
    };
    let mut all: Vec<Value> = serde_json::from_str(&load(&path).unwrap()).unwrap();
    loop {
        all.push(conversation(all.len() as u64));
        save(&path, &serde_json::to_string(&all).unwrap()).unwrap();
    }
}

#[test]
fn killed_history_saves_leave_a_readable_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    kill_test::kill_writers("history::tests::writer_child", &path, 20, saved_number);
}

#[test]
fn missing_then_saved_then_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join(FILE_NAME);
    assert_eq!(load(&path).unwrap(), "[]");
    let text = r#"[{"id":"c1","turns":[]}]"#;
    save(&path, text).unwrap();
    assert_eq!(load(&path).unwrap(), text);
}

#[test]
fn only_json_arrays_under_the_cap_are_saved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    save(&path, "[1]").unwrap();
    for bad in ["{}", "[1", "", "null", "[1] [2]"] {
        let error = save(&path, bad).unwrap_err();
        assert!(error.contains("not a JSON array"), "{bad:?}: {error}");
    }
    let huge = format!("[\"{}\"]", "x".repeat(MAX_BYTES));
    let error = save(&path, &huge).unwrap_err();
    assert!(error.contains("over the 64 MiB limit"), "{error}");
    assert!(!error.contains('\n'), "{error}");
    assert_eq!(load(&path).unwrap(), "[1]");
}

#[test]
fn an_unreadable_file_is_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    fs::write(&path, "[{\"id\": \"c1\", \"tur").unwrap();
    assert_eq!(load(&path).unwrap(), "[]");
    assert!(!path.exists());
    let aside: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(aside[0].starts_with("conversations.json.bad-"), "{aside:?}");
    assert_eq!(
        fs::read_to_string(dir.path().join(&aside[0])).unwrap(),
        "[{\"id\": \"c1\", \"tur"
    );
    fs::write(&path, [0xff, 0xfe, b'[']).unwrap();
    assert_eq!(load(&path).unwrap(), "[]");
    let count = fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(count, 2, "the second bad file is kept too");
}
