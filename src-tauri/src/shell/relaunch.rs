//! A launch that meets the previous instance on its way out. On Linux the
//! single-instance plugin finds a running app by its name on the D-Bus
//! session bus and hands it this launch's arguments. An app that is
//! quitting (unloading its model) still holds the name for a moment but no
//! longer answers, so the plugin fails the new launch ("failed to forward
//! arguments to the running instance") and nothing opens. Quitting and
//! starting again at once is what a user does, so the new launch waits a
//! moment and starts over, in the same process (so whatever launched it,
//! the test driver included, still holds its id), a few times at most.

/// How the plugin words a hand-over that found nobody answering.
const NOBODY_ANSWERED: &str = "failed to forward arguments to the running instance";

/// Starts over at most this many times, this far apart.
const TRIES: u32 = 10;
const PAUSE: std::time::Duration = std::time::Duration::from_millis(300);

/// Counts the starts over, across `exec`.
const COUNT_ENV: &str = "FLASHBAR_RELAUNCHED";

/// Whether `error` (the app's build failed) is worth starting over for:
/// the hand-over to a quitting instance, and tries left.
pub fn worth_retrying(error: &str, tried: u32) -> bool {
    error.contains(NOBODY_ANSWERED) && tried < TRIES
}

/// Replaces this process with a fresh start of the same program after a
/// pause, when [`worth_retrying`]; returns (with the reason) when it did not.
#[cfg(unix)]
pub fn after(error: &str) -> Option<String> {
    use std::os::unix::process::CommandExt;
    let tried = std::env::var(COUNT_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if !worth_retrying(error, tried) {
        return None;
    }
    std::thread::sleep(PAUSE);
    let exe = std::env::current_exe().ok()?;
    let failed = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(COUNT_ENV, (tried + 1).to_string())
        .exec();
    Some(format!("could not start again: {failed}"))
}

#[cfg(not(unix))]
pub fn after(_error: &str) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_hand_over_nobody_answered_is_retried_and_only_a_few_times() {
        let gone = "failed to initialize plugin `single-instance`: failed to forward arguments \
                    to the running instance: org.freedesktop.DBus.Error.NoReply: Message \
                    recipient disconnected from message bus without replying";
        assert!(worth_retrying(gone, 0));
        assert!(worth_retrying(gone, TRIES - 1));
        assert!(!worth_retrying(gone, TRIES));
        assert!(!worth_retrying("failed to setup app: no window", 0));
    }
}
