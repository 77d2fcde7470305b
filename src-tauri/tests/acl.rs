//! What the webview may do, checked from the sources: every command the
//! invoke handler registers is granted in `capabilities/default.json` (or
//! listed below as deliberately not granted), every grant is a registered
//! command the UI really invokes, no other permission than listening to
//! events is granted, and the Content-Security-Policy loads nothing from
//! outside the app. A new command registered without a grant fails here
//! (and, at run time, Tauri refuses it to the webview: build.rs makes the
//! app manifest from the same handler).

#[path = "../commands.rs"]
mod commands;

use std::collections::BTreeSet;
use std::path::Path;

/// Registered but not for the webview, with the reason.
const NOT_GRANTED: &[(&str, &str)] = &[("backend_info", "read by Rust tests, not by the UI")];

/// Tauri permissions the UI needs besides its commands.
const CORE_GRANTS: &[&str] = &["core:event:allow-listen", "core:event:allow-unlisten"];

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn granted() -> Vec<String> {
    let capability: serde_json::Value =
        serde_json::from_str(&read("capabilities/default.json")).unwrap();
    assert_eq!(capability["windows"], serde_json::json!(["main"]));
    assert!(
        capability.get("remote").is_none(),
        "no remote URL may call commands"
    );
    capability["permissions"]
        .as_array()
        .expect("permissions is a list")
        .iter()
        .map(|p| p.as_str().expect("plain permission names").to_owned())
        .collect()
}

/// Command names in `invoke<...>("name"` calls of the UI's sources.
fn invoked_by_ui(dir: &Path, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            invoked_by_ui(&path, found);
        } else if path.extension().is_some_and(|e| e == "ts") {
            let text = std::fs::read_to_string(&path).unwrap();
            for call in text.split("invoke<").skip(1) {
                if let Some(name) = call.split('"').nth(1) {
                    found.insert(name.to_owned());
                }
            }
        }
    }
}

#[test]
fn every_registered_command_is_granted_on_purpose_and_only_those_the_ui_uses() {
    let registered = commands::registered(&read("src/lib.rs")).unwrap();
    assert!(
        registered.contains(&"chat_send".to_owned()),
        "{registered:?}"
    );
    let granted = granted();
    let mut ui = BTreeSet::new();
    invoked_by_ui(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/src"),
        &mut ui,
    );
    let not_granted: BTreeSet<_> = NOT_GRANTED.iter().map(|(name, _)| *name).collect();

    let mut problems = Vec::new();
    for name in &registered {
        let permission = format!("allow-{}", name.replace('_', "-"));
        let is_granted = granted.contains(&permission);
        if !is_granted && !not_granted.contains(name.as_str()) {
            problems.push(format!(
                "{name} is registered but not granted: add \"{permission}\" to \
                 src-tauri/capabilities/default.json (or to NOT_GRANTED in tests/acl.rs)"
            ));
        }
        if is_granted && !ui.contains(name) {
            problems.push(format!("{name} is granted but the UI never invokes it"));
        }
    }
    for name in &ui {
        if !registered.contains(name) {
            problems.push(format!("the UI invokes {name}, which is not registered"));
        }
    }
    for permission in &granted {
        let command = permission
            .strip_prefix("allow-")
            .map(|c| c.replace('-', "_"));
        let known = CORE_GRANTS.contains(&permission.as_str())
            || command.is_some_and(|c| registered.contains(&c));
        if !known {
            problems.push(format!(
                "{permission} is granted but is no command of the app"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The directives of the configured CSP.
fn csp() -> Vec<(String, Vec<String>)> {
    let config: serde_json::Value = serde_json::from_str(&read("tauri.conf.json")).unwrap();
    let security = &config["app"]["security"];
    for loosening in [
        "dangerousDisableAssetCspModification",
        "devCsp",
        "headers",
        "assetProtocol",
    ] {
        assert!(security.get(loosening).is_none(), "{loosening} is set");
    }
    assert!(config["app"]
        .get("withGlobalTauri")
        .is_none_or(|v| v == false));
    let policy = security["csp"].as_str().expect("a CSP string");
    policy
        .split(';')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let mut words = d.split_whitespace().map(str::to_owned);
            (words.next().unwrap(), words.collect())
        })
        .collect()
}

#[test]
fn the_csp_allows_no_remote_content() {
    let directives = csp();
    let get = |name: &str| {
        directives
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(get("default-src"), ["'none'"]);
    assert_eq!(get("object-src"), ["'none'"]);
    assert_eq!(get("base-uri"), ["'none'"]);
    assert_eq!(get("script-src"), ["'self'"]);
    // Tauri's IPC (a custom protocol of the app itself, not the network).
    let local = ["'self'", "ipc:", "http://ipc.localhost"];
    for (name, sources) in &directives {
        for source in sources {
            assert!(
                local.contains(&source.as_str()) || source == "'none'",
                "{name} allows {source}: only the app itself may be a source"
            );
            if source == "http://ipc.localhost" {
                assert_eq!(name, "connect-src", "{name} allows {source}");
            }
        }
    }
}
