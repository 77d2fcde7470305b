//! The CLI's log: tracing events on stderr, at `--log-level` (a level or
//! a filter such as `info,flashbar_hub=debug`), else `RUST_LOG`, else
//! warnings only. `flashbar serve --log-level info` prints one line per
//! HTTP request (docs/logging.md).

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Warnings and errors only: the commands' own output stays readable.
pub const DEFAULT_FILTER: &str = "warn";

/// The filter for `--log-level`, `RUST_LOG` or the default.
pub fn filter(level: Option<&str>) -> Result<EnvFilter, String> {
    match level {
        Some(level) => EnvFilter::try_new(level)
            .map_err(|e| format!("--log-level {level:?} is not a level or filter ({e})")),
        None => Ok(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
        ),
    }
}

/// Installs the stderr subscriber (once per process).
pub fn init(level: Option<&str>) -> Result<(), String> {
    let filter = filter(level)?;
    // A second install (a test calling main twice) keeps the first.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_filters_parse_and_nonsense_is_refused() {
        assert!(filter(Some("info")).is_ok());
        assert!(filter(Some("warn,flashbar::server::request=info")).is_ok());
        let error = filter(Some("loud=[")).unwrap_err();
        assert!(error.starts_with("--log-level \"loud=[\""), "{error}");
        assert!(!error.contains('\n'));
    }
}
