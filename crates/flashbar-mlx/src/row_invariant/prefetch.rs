//! What the quantized matmul asks the L2 for ahead of its loads (docs/gpu.md,
//! "Weights asked for ahead"): its own block's weights (`qmm.cu`'s `PF`) and
//! the first megabytes of the product that comes next (`NEXT`). Cache hints
//! only: every value is the same either way, so decode and verify still run
//! one kernel with one order of sums.
//!
//! Which product comes next is learnt, not wired: a model's decode steps
//! make the same calls in the same order every step, so each call records
//! its weight as the successor of the call before it, and the next time the
//! earlier weight is used its successor is asked for. A wrong guess (the
//! first step, a verify after a decode step) costs some bandwidth, never a
//! value.

use mlx_rs::Array;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// `1`: each block asks for its own weights; `next`: the blocks ask for the
/// next product's; `both`. Not yet timed on a GPU, so off by default.
pub const PREFETCH_ENV: &str = "FLASHBAR_QMM_PREFETCH";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Setting {
    own: bool,
    next: bool,
}

fn parse(value: Option<&str>) -> Setting {
    match value {
        Some("1") => Setting {
            own: true,
            next: false,
        },
        Some("next") => Setting {
            own: false,
            next: true,
        },
        Some("both") => Setting {
            own: true,
            next: true,
        },
        _ => Setting {
            own: false,
            next: false,
        },
    }
}

fn setting() -> Setting {
    static SETTING: OnceLock<Setting> = OnceLock::new();
    *SETTING.get_or_init(|| parse(std::env::var(PREFETCH_ENV).ok().as_deref()))
}

/// The body's `PF` for a decode step's or a block's product.
pub(super) fn own() -> i32 {
    i32::from(setting().own)
}

/// Successors: the weight (by its array handle) that followed each weight
/// last time, and the weight of the call before this one.
#[derive(Default)]
struct Chain {
    after: HashMap<usize, (usize, Array)>,
    last: Option<usize>,
}

// SAFETY: the arrays are handles to immutable weights, only cloned and read
// (as kernel inputs) under the lock.
unsafe impl Send for Chain {}

fn chain() -> &'static Mutex<Chain> {
    static CHAIN: OnceLock<Mutex<Chain>> = OnceLock::new();
    CHAIN.get_or_init(Mutex::default)
}

/// A map's identity: its handle, the same object every call since the model
/// keeps it.
fn key(w: &Array) -> usize {
    w.as_ptr().ctx as usize
}

/// Records `w` as the successor of the call before and returns what came
/// after `w` last time, where [`PREFETCH_ENV`] asks for it.
pub(super) fn next_after(w: &Array) -> Option<Array> {
    if !setting().next {
        return None;
    }
    follow(&mut chain().lock().unwrap_or_else(|e| e.into_inner()), w)
}

fn follow(chain: &mut Chain, w: &Array) -> Option<Array> {
    let this = key(w);
    if let Some(before) = chain.last.replace(this) {
        if before != this && chain.after.get(&before).map(|(k, _)| *k) != Some(this) {
            chain.after.insert(before, (this, w.clone()));
        }
    }
    chain.after.get(&this).map(|(_, next)| next.clone())
}

/// Forgets every successor (and so lets their weights go): a model that
/// goes away calls it, since the chain holds handles to its maps.
pub fn forget_next_weights() {
    let mut chain = chain().lock().unwrap_or_else(|e| e.into_inner());
    *chain = Chain::default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_reads_its_three_values() {
        assert_eq!(parse(None), parse(Some("0")));
        assert!(!parse(None).own && !parse(None).next);
        assert!(parse(Some("1")).own && !parse(Some("1")).next);
        assert!(!parse(Some("next")).own && parse(Some("next")).next);
        assert!(parse(Some("both")).own && parse(Some("both")).next);
    }

    #[test]
    fn a_repeated_order_of_calls_is_learnt() {
        let maps: Vec<Array> = (1..=3u32)
            .map(|v| Array::from_slice(&[v], &[1, 1]))
            .collect();
        let (a, b, c) = (&maps[0], &maps[1], &maps[2]);
        // Which map came back, by its value (a clone is a new handle).
        let value = |next: Option<Array>| next.map(|n| n.try_item_exact::<u32>().unwrap());
        let mut chain = Chain::default();
        // The first step knows nothing ahead.
        for w in [a, b, c] {
            assert!(follow(&mut chain, w).is_none());
        }
        // The second: a is followed by b, b by c; c by a (the step's wrap).
        let got: Vec<Option<u32>> = [a, b, c]
            .iter()
            .map(|w| value(follow(&mut chain, w)))
            .collect();
        assert_eq!(got, vec![Some(2), Some(3), Some(1)]);
        // A changed order is learnt over: a, c.
        follow(&mut chain, a);
        follow(&mut chain, c);
        assert_eq!(value(follow(&mut chain, a)), Some(3));
        // The same map twice in a row is not its own successor.
        assert_eq!(value(follow(&mut chain, a)), Some(3));
    }
}
