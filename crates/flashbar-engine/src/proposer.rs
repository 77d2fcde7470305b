//! Where a speculative round's draft tokens come from.
//!
//! The draft-verify loop only needs "propose `n` tokens after `last`"; the
//! DFlash drafter is the real proposer, and tests plug in proposers whose
//! drafts are known (right, or wrong at a chosen position) to prove the
//! loop's accept / commit / rollback logic independently of a drafter's skill.

use crate::choose::argmax_rows;
use crate::error::Result;
use flashbar_models::{DraftCache, Drafter, Model};
use mlx_rs::Array;

/// Proposes draft tokens for one round.
pub trait Proposer {
    /// The target layers whose outputs the proposer reads (may be empty).
    fn tap_layers(&self) -> &[usize];

    /// The largest block (last token + drafts) it proposes.
    fn max_block_size(&self) -> usize;

    /// Drafts `[1, count]` (u32, may stay on the device) following `last`.
    /// `new_context` holds the taps of the committed positions the proposer
    /// has not seen yet `[1, S, taps*hidden]`, ending just before `last`;
    /// `committed` is how many tokens were generated so far (`last` included).
    fn propose(
        &mut self,
        target: &Model,
        last: u32,
        new_context: &Array,
        count: usize,
        committed: usize,
    ) -> Result<Array>;
}

/// The DFlash drafter with its context cache for one generation.
pub struct DflashProposer<'a> {
    drafter: &'a Drafter,
    cache: DraftCache,
}

impl<'a> DflashProposer<'a> {
    pub fn new(drafter: &'a Drafter) -> Self {
        DflashProposer {
            drafter,
            cache: drafter.new_cache(),
        }
    }
}

impl Proposer for DflashProposer<'_> {
    fn tap_layers(&self) -> &[usize] {
        &self.drafter.config().target_layer_ids
    }

    fn max_block_size(&self) -> usize {
        self.drafter.config().block_size
    }

    fn propose(
        &mut self,
        target: &Model,
        last: u32,
        new_context: &Array,
        count: usize,
        _committed: usize,
    ) -> Result<Array> {
        let mask = self.drafter.config().mask_token_id;
        let mut block = vec![mask; count + 1];
        block[0] = last;
        let block = Array::from_slice(&block, &[1, count as i32 + 1]);
        let logits = self
            .drafter
            .forward(target, &block, new_context, &mut self.cache)?;
        // Drafts are the drafter's argmax at any temperature: acceptance then
        // compares them with the target's own (position-keyed) choice, so the
        // output is exactly what plain decoding gives. On the CPU's host path
        // they are read where the host left the logits.
        argmax_rows(&logits)
    }
}
