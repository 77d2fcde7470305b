//! Speed at a glance: what the tray shows while a generation runs
//! ("84 tok/s · DFlash 2.3x", or "80 tok/s" on plain rounds), and nothing
//! when idle. A pure state machine fed each round's committed tokens, time
//! and speedup with the time it arrived (the caller's clock), so it is
//! tested on scripted rounds. Redraws are throttled to one per
//! [`REDRAW_MS`].

use std::collections::VecDeque;

/// Rounds averaged over: about a second of decoding on a fast machine.
pub const WINDOW: usize = 8;
/// At most one tray update per this many milliseconds.
pub const REDRAW_MS: u64 = 250;

/// One round, as the glance needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Round {
    pub committed: usize,
    /// Draft + verify + rollback time.
    pub ms: f64,
    /// A DFlash round's realized speedup over plain decoding (None for
    /// plain rounds, or before plain decoding was timed).
    pub speedup: Option<f64>,
    pub dflash: bool,
}

#[derive(Default)]
pub struct Glance {
    rounds: VecDeque<Round>,
    /// When the tray was last redrawn (caller's milliseconds).
    drawn_at: Option<u64>,
}

impl Glance {
    /// Takes a round at `now_ms`; the text to show if the tray should be
    /// redrawn now.
    pub fn round(&mut self, round: Round, now_ms: u64) -> Option<String> {
        if self.rounds.len() == WINDOW {
            self.rounds.pop_front();
        }
        self.rounds.push_back(round);
        if self
            .drawn_at
            .is_some_and(|at| now_ms.saturating_sub(at) < REDRAW_MS)
        {
            return None;
        }
        self.drawn_at = Some(now_ms);
        Some(self.text())
    }

    /// The generation ended: forget it (the tray goes back to its icon).
    pub fn idle(&mut self) {
        self.rounds.clear();
        self.drawn_at = None;
    }

    /// Tokens/s over the window, and the DFlash part when the latest round
    /// was drafted: the mean realized speedup of the window's DFlash rounds.
    pub fn text(&self) -> String {
        let tokens: usize = self.rounds.iter().map(|r| r.committed).sum();
        let ms: f64 = self.rounds.iter().map(|r| r.ms).sum();
        let rate = if ms > 0.0 {
            tokens as f64 * 1000.0 / ms
        } else {
            0.0
        };
        let speedups: Vec<f64> = self.rounds.iter().filter_map(|r| r.speedup).collect();
        let drafted = self.rounds.back().is_some_and(|r| r.dflash);
        match (drafted, speedups.is_empty()) {
            (true, false) => format!(
                "{rate:.0} tok/s · DFlash {:.1}x",
                speedups.iter().sum::<f64>() / speedups.len() as f64
            ),
            (true, true) => format!("{rate:.0} tok/s · DFlash"),
            (false, _) => format!("{rate:.0} tok/s"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dflash(committed: usize, ms: f64, speedup: f64) -> Round {
        Round {
            committed,
            ms,
            speedup: Some(speedup),
            dflash: true,
        }
    }

    fn plain(ms: f64) -> Round {
        Round {
            committed: 1,
            ms,
            speedup: None,
            dflash: false,
        }
    }

    #[test]
    fn shows_the_window_rate_and_the_mean_speedup() {
        let mut glance = Glance::default();
        assert_eq!(
            glance.round(dflash(6, 60.0, 2.0), 0).as_deref(),
            Some("100 tok/s · DFlash 2.0x")
        );
        // Within REDRAW_MS of the last draw: no redraw, but it counts.
        assert_eq!(glance.round(dflash(2, 40.0, 1.0), 100), None);
        assert_eq!(
            glance.round(dflash(4, 100.0, 1.5), 300).as_deref(),
            Some("60 tok/s · DFlash 1.5x")
        );
    }

    #[test]
    fn plain_rounds_show_only_the_rate_and_the_window_slides() {
        let mut glance = Glance::default();
        glance.round(dflash(16, 10.0, 9.0), 0);
        for n in 0..WINDOW as u64 {
            glance.round(plain(20.0), 1000 + n * REDRAW_MS);
        }
        // The drafted round has left the window: 8 plain rounds of 20 ms.
        assert_eq!(glance.text(), "50 tok/s");
        glance.idle();
        assert_eq!(
            glance.round(dflash(3, 30.0, 0.0), 5000).as_deref(),
            Some("100 tok/s · DFlash 0.0x")
        );
    }

    #[test]
    fn dflash_before_plain_decoding_was_timed_has_no_ratio() {
        let mut glance = Glance::default();
        let round = Round {
            committed: 4,
            ms: 20.0,
            speedup: None,
            dflash: true,
        };
        assert_eq!(
            glance.round(round, 0).as_deref(),
            Some("200 tok/s · DFlash")
        );
    }
}
