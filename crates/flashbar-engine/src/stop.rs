//! Stop sequences over streamed text: text that could still become a stop
//! sequence is held back, and nothing from a stop sequence on is emitted.

#[derive(Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

pub enum StopOutcome {
    /// Text safe to emit now.
    Continue(String),
    /// A stop sequence matched: the text before it, then generation ends.
    Stopped(String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, delta: &str) -> StopOutcome {
        self.pending.push_str(delta);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let before = self.pending[..at].to_owned();
            self.pending.clear();
            return StopOutcome::Stopped(before);
        }
        // Keep the longest tail that is a prefix of some stop sequence.
        let keep = self
            .stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len().min(self.pending.len() + 1))
                    .rev()
                    .filter(|&n| stop.is_char_boundary(n))
                    .find(|&n| self.pending.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0);
        let emit_len = self.pending.len() - keep;
        let emit = self.pending[..emit_len].to_owned();
        self.pending.drain(..emit_len);
        StopOutcome::Continue(emit)
    }

    /// Text held back when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut matcher = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for delta in deltas {
            match matcher.push(delta) {
                StopOutcome::Continue(text) => out.push_str(&text),
                StopOutcome::Stopped(text) => {
                    out.push_str(&text);
                    return (out, true);
                }
            }
        }
        out.push_str(&matcher.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_across_deltas_is_found_and_cut() {
        assert_eq!(
            run(&["\n\nUser:"], &["Hi", " there\n", "\nUs", "er: more"]),
            ("Hi there".into(), true)
        );
    }

    #[test]
    fn a_near_miss_is_released() {
        assert_eq!(run(&["STOP"], &["ST", "OP!"][..1]), ("ST".into(), false));
        assert_eq!(run(&["STOP"], &["ST", "ART"]), ("START".into(), false));
    }

    #[test]
    fn without_stops_everything_passes_at_once() {
        let mut matcher = StopMatcher::new(vec![]);
        assert!(matches!(matcher.push("abc"), StopOutcome::Continue(t) if t == "abc"));
    }

    #[test]
    fn multibyte_text_is_never_split() {
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
    }
}
