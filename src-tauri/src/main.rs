// No console window on Windows release builds; elsewhere a no-op.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    flashbar_app::run();
}
