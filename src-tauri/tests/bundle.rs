//! The bundle's configuration, checked from the sources on any machine
//! (docs/bundle.md): what the macOS .app gets, which Linux cannot build
//! (minimum macOS, LSUIElement merged from Info.plist, the .icns made from
//! icons/icon.svg), and the icons both bundles install. The .deb itself is
//! built, installed and started by tests/e2e/deb.sh.

use std::path::Path;

fn read(path: &str) -> Vec<u8> {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn bundle() -> serde_json::Value {
    let config: serde_json::Value = serde_json::from_slice(&read("tauri.conf.json")).unwrap();
    config["bundle"].clone()
}

#[test]
fn the_app_needs_macos_14_and_has_no_dock_icon() {
    let mac = &bundle()["macOS"];
    // MLX's minimum macOS.
    assert_eq!(mac["minimumSystemVersion"], "14.0");
    // Tauri merges this plist into the generated one.
    let plist = String::from_utf8(read(mac["infoPlist"].as_str().unwrap())).unwrap();
    let key = plist
        .find("<key>LSUIElement</key>")
        .expect("LSUIElement is set");
    let value = plist[key..].split("</key>").nth(1).unwrap().trim_start();
    assert!(value.starts_with("<true/>"), "LSUIElement: {value}");
}

/// The entries of an .icns file: (type, data).
fn icns_entries(bytes: &[u8]) -> Vec<(String, &[u8])> {
    assert_eq!(&bytes[..4], b"icns", "not an .icns file");
    let total = u32::from_be_bytes(bytes[4..8].try_into().unwrap()) as usize;
    assert_eq!(total, bytes.len(), "the .icns header's length");
    let mut entries = Vec::new();
    let mut at = 8;
    while at < total {
        let kind = String::from_utf8_lossy(&bytes[at..at + 4]).into_owned();
        let len = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        entries.push((kind, &bytes[at + 8..at + len]));
        at += len;
    }
    entries
}

#[test]
fn the_icns_is_the_flashbar_mark_up_to_1024_pixels() {
    let icons: Vec<String> = serde_json::from_value(bundle()["icon"].clone()).unwrap();
    // The first PNG is the window's (and Linux tray's) icon: the 64 px original.
    assert_eq!(icons[0], "icons/icon.png");
    assert!(icons.contains(&"icons/icon.icns".to_owned()), "{icons:?}");
    let icns = read("icons/icon.icns");
    let entries = icns_entries(&icns);
    let kinds: Vec<&str> = entries.iter().map(|(kind, _)| kind.as_str()).collect();
    // 16, 32, 64, 128, 256, 512 and 1024 px (ic10: 512@2x).
    for kind in ["ic11", "ic12", "ic07", "ic13", "ic08", "ic09", "ic10"] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    let (_, png) = entries.iter().find(|(kind, _)| kind == "ic10").unwrap();
    let image = tauri::image::Image::from_bytes(png).expect("ic10 is a PNG");
    assert_eq!((image.width(), image.height()), (1024, 1024));
    // icons/icon.svg on its 64-unit grid, scaled by 16: the orange square
    // from 8 to 56 and the white stroke through the middle.
    let pixel = |x: u32, y: u32| {
        let at = ((y * 1024 + x) * 4) as usize;
        image.rgba()[at..at + 4].to_vec()
    };
    assert_eq!(pixel(2 * 16, 2 * 16)[3], 0, "outside the square is clear");
    assert_eq!(pixel(10 * 16, 50 * 16), [0xd9, 0x77, 0x06, 0xff]);
    assert_eq!(pixel(32 * 16, 32 * 16), [0xff, 0xff, 0xff, 0xff]);
}

#[test]
fn the_linux_icons_are_square_pngs() {
    for (file, size) in [
        ("icons/32x32.png", 32),
        ("icons/128x128.png", 128),
        ("icons/128x128@2x.png", 256),
    ] {
        let image = tauri::image::Image::from_bytes(&read(file)).expect(file);
        assert_eq!((image.width(), image.height()), (size, size), "{file}");
    }
}
