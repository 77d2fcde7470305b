//! The block size (last token + drafts per verify) from recent acceptance.
//!
//! A verify's cost grows with its width, and drafts past the first rejection
//! are wasted, so the block tracks the expected run of accepted drafts: an
//! exponential average of accepted drafts per round, with headroom (x1.5 + 2)
//! so a longer run can still show itself, rounded up to a power of two (few
//! distinct shapes, so GPU kernels compile once each), within [2, max].

#[derive(Clone, Debug)]
pub struct BlockSizePolicy {
    max: usize,
    /// Average accepted drafts per round; starts optimistic (a full block).
    expected_run: f64,
}

/// Weight of the newest round in the average.
const NEWEST: f64 = 0.5;
const MIN_BLOCK: usize = 2;

impl BlockSizePolicy {
    /// `max`: the drafter's block size (at least 2).
    pub fn new(max: usize) -> Self {
        let max = max.max(MIN_BLOCK);
        BlockSizePolicy {
            max,
            expected_run: (max - 1) as f64,
        }
    }

    /// Starts at a block of `first` (a power of two, at most `max`) instead
    /// of a full one: where a verify costs in proportion to its rows, as on
    /// a CPU (docs/acceptance.md, "Fixed blocks of 16 against the adapted
    /// block size, on the CPU"), the first rounds of an answer, which often
    /// accept little, are then cheap; a whole accepted block still grows it
    /// back to `max` within a few rounds.
    pub fn starting_at(max: usize, first: usize) -> Self {
        let max = max.max(MIN_BLOCK);
        let first = first.clamp(MIN_BLOCK, max);
        BlockSizePolicy {
            max,
            // The run [`Self::next`] maps to `first`.
            expected_run: (first as f64 - 2.0) / 1.5,
        }
    }

    /// The block size for the next round.
    pub fn next(&self) -> usize {
        let wanted = (self.expected_run * 1.5 + 2.0).round() as usize;
        wanted.next_power_of_two().clamp(MIN_BLOCK, self.max)
    }

    /// Records a round: `accepted` of `drafted` drafts were accepted. A
    /// round cut short by max_tokens or EOS still tells how far drafts ran.
    pub fn observe(&mut self, accepted: usize, drafted: usize) {
        if drafted == 0 {
            return;
        }
        // A fully accepted block says "at least this much": count it as one more.
        let run = if accepted == drafted {
            accepted as f64 + 1.0
        } else {
            accepted as f64
        };
        self.expected_run = (1.0 - NEWEST) * self.expected_run + NEWEST * run;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_the_drafter_block() {
        assert_eq!(BlockSizePolicy::new(16).next(), 16);
        assert_eq!(BlockSizePolicy::new(1).next(), 2);
    }

    #[test]
    fn can_start_smaller_and_grows_to_the_drafter_block() {
        for first in [2, 4, 8, 16] {
            assert_eq!(BlockSizePolicy::starting_at(16, first).next(), first);
        }
        assert_eq!(BlockSizePolicy::starting_at(8, 16).next(), 8);
        let mut p = BlockSizePolicy::starting_at(16, 8);
        let mut sizes = vec![p.next()];
        while p.next() < 16 {
            let block = p.next();
            p.observe(block - 1, block - 1);
            sizes.push(p.next());
            assert!(sizes.len() < 4, "grows slowly: {sizes:?}");
        }
    }

    #[test]
    fn shrinks_to_two_when_nothing_is_accepted() {
        let mut p = BlockSizePolicy::new(16);
        let mut sizes = Vec::new();
        for _ in 0..8 {
            let block = p.next();
            sizes.push(block);
            p.observe(0, block - 1);
        }
        assert_eq!(*sizes.last().unwrap(), 2, "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[1] <= w[0]), "{sizes:?}");
    }

    #[test]
    fn grows_back_when_whole_blocks_are_accepted() {
        let mut p = BlockSizePolicy::new(16);
        for _ in 0..10 {
            p.observe(0, 15);
        }
        assert_eq!(p.next(), 2);
        let mut rounds = 0;
        while p.next() < 16 {
            let block = p.next();
            p.observe(block - 1, block - 1);
            rounds += 1;
            assert!(rounds < 12, "stuck at {}", p.next());
        }
    }

    #[test]
    fn settles_near_the_accepted_run() {
        let mut p = BlockSizePolicy::new(16);
        for _ in 0..20 {
            let block = p.next();
            p.observe(3.min(block - 1), block - 1);
        }
        // A run of 3 drafts: 3 * 1.5 + 2 = 6.5 -> 8.
        assert_eq!(p.next(), 8);
    }
}
