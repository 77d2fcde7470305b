//! Keys and values kept on the host for the CPU path (docs/cpu.md, "Host
//! caches"): bf16 rows per head with room to grow, read in place by the
//! attention kernels, so a step costs in proportion to its new rows, not
//! to the context. An MLX array cache instead widened the whole cache to
//! f32, concatenated the new rows (a copy) and rounded it all back to bf16
//! at every step of every attention layer.

use super::{round_bf16, KvRows, Weight};
use crate::error::Result;
use half::bf16;
use mlx_rs::{Array, Dtype};

/// Positions a cache makes room for at least when it grows.
const GROW_BY: usize = 256;

/// One attention layer's keys and values `[heads, capacity, d]`, the first
/// `len` positions of each head in use. Values are bf16 (as the model
/// computes them), so the cache takes what MLX's bf16 arrays took, plus
/// the room kept for the next positions (a quarter more at most, or
/// [`GROW_BY`] positions).
#[derive(Clone, Debug)]
pub struct HostKv {
    heads: usize,
    d: usize,
    len: usize,
    capacity: usize,
    keys: Vec<bf16>,
    values: Vec<bf16>,
}

impl HostKv {
    pub fn new(heads: usize, d: usize) -> Self {
        HostKv {
            heads,
            d,
            len: 0,
            capacity: 0,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `rows` positions: `keys`, `values` `[heads, rows, d]` whose
    /// values are bf16's (they are stored exactly; others would be rounded).
    pub fn append(&mut self, keys: &[f32], values: &[f32]) {
        let rows = keys.len() / (self.heads * self.d);
        debug_assert_eq!(keys.len(), self.heads * rows * self.d);
        debug_assert_eq!(values.len(), keys.len());
        self.reserve(self.len + rows);
        let d = self.d;
        for h in 0..self.heads {
            let at = (h * self.capacity + self.len) * d;
            let from = h * rows * d..(h + 1) * rows * d;
            let put = |to: &mut [bf16], from: &[f32]| {
                for (t, &f) in to.iter_mut().zip(from) {
                    *t = bf16::from_bits((round_bf16(f).to_bits() >> 16) as u16);
                }
            };
            put(&mut self.keys[at..at + rows * d], &keys[from.clone()]);
            put(&mut self.values[at..at + rows * d], &values[from]);
        }
        self.len += rows;
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Keeps the last `len` positions (drops the oldest).
    pub fn keep_last(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let (d, from) = (self.d, self.len - len);
        for h in 0..self.heads {
            let at = h * self.capacity * d;
            let span = at + from * d..at + self.len * d;
            self.keys.copy_within(span.clone(), at);
            self.values.copy_within(span, at);
        }
        self.len = len;
    }

    /// The rows for the kernels (the first [`Self::len`] positions of each
    /// head are the cache's).
    pub fn rows(&self) -> KvRows<'_, bf16> {
        KvRows {
            keys: &self.keys,
            values: &self.values,
            stride: self.capacity,
        }
    }

    /// Room for `positions` per head and a quarter more (so a prompt's
    /// cache takes the next steps without moving), moving the heads apart
    /// when it grows.
    fn reserve(&mut self, positions: usize) {
        if positions <= self.capacity {
            return;
        }
        let capacity = (positions + positions / 4).max(GROW_BY);
        let d = self.d;
        let move_to = |old: &[bf16]| {
            let mut grown = vec![bf16::ZERO; self.heads * capacity * d];
            for h in 0..self.heads {
                let from = h * self.capacity * d;
                grown[h * capacity * d..][..self.len * d]
                    .copy_from_slice(&old[from..from + self.len * d]);
            }
            grown
        };
        self.keys = move_to(&self.keys);
        self.values = move_to(&self.values);
        self.capacity = capacity;
    }

    /// A cache holding `keys`, `values` `[1, heads, S, d]` (bf16 or f32
    /// arrays of bf16 values).
    pub fn of(keys: &Array, values: &Array) -> Result<Self> {
        let shape = keys.shape();
        let mut kv = HostKv::new(shape[1] as usize, shape[3] as usize);
        kv.append(&super::host_f32(keys)?, &super::host_f32(values)?);
        Ok(kv)
    }

    /// Keys and values `[1, heads, len, d]` as bf16 arrays (tests, and a
    /// cache read by MLX's ops).
    pub fn arrays(&self) -> Result<(Array, Array)> {
        let shape = [1, self.heads as i32, self.len as i32, self.d as i32];
        let gather = |all: &[bf16]| -> Vec<f32> {
            (0..self.heads)
                .flat_map(|h| all[h * self.capacity * self.d..][..self.len * self.d].iter())
                .map(|v| v.widen())
                .collect()
        };
        Ok((
            super::from_f32(&gather(&self.keys), &shape, Dtype::Bfloat16)?,
            super::from_f32(&gather(&self.values), &shape, Dtype::Bfloat16)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends across growths, a truncation and appends after it: the
    /// cache holds exactly the rows appended and kept, head by head.
    #[test]
    fn holds_what_was_appended_across_growths_and_truncation() {
        let (heads, d) = (3, 4);
        let mut kv = HostKv::new(heads, d);
        let mut expected: Vec<Vec<f32>> = vec![Vec::new(); heads];
        let mut next = 0f32;
        for rows in [1usize, 5, 300, 2, 90, 1] {
            let mut keys = vec![0f32; heads * rows * d];
            for (h, head) in keys.chunks_exact_mut(rows * d).enumerate() {
                for v in head.iter_mut() {
                    *v = next;
                    next += 1.0;
                }
                expected[h].extend_from_slice(head);
            }
            let values: Vec<f32> = keys.iter().map(|k| -k).collect();
            kv.append(&keys, &values);
            if rows == 90 {
                kv.truncate(kv.len() - 7);
                for head in &mut expected {
                    head.truncate(head.len() - 7 * d);
                }
            }
        }
        assert_eq!(kv.len(), expected[0].len() / d);
        let (keys, values) = kv.arrays().unwrap();
        let keys = super::super::host_f32(&keys).unwrap();
        let values = super::super::host_f32(&values).unwrap();
        let all: Vec<f32> = expected.concat();
        // The values up to 256 are bf16-exact integers; beyond, rounded.
        let rounded: Vec<f32> = all.iter().map(|&v| round_bf16(v)).collect();
        assert_eq!(keys, rounded);
        assert_eq!(values, rounded.iter().map(|v| -v).collect::<Vec<_>>());
        let rows = kv.rows();
        assert!(rows.stride >= kv.len());
        for h in 0..heads {
            let head = &rows.keys[h * rows.stride * d..][..kv.len() * d];
            let widened: Vec<f32> = head.iter().map(|v| v.widen()).collect();
            assert_eq!(widened, rounded[h * kv.len() * d..][..kv.len() * d]);
        }
    }

    /// Keeping the last rows drops the oldest of every head, and appends go
    /// on after them.
    #[test]
    fn keep_last_drops_the_oldest_rows_of_each_head() {
        let (heads, d) = (2, 3);
        let mut kv = HostKv::new(heads, d);
        let rows = |first: usize, n: usize| -> Vec<f32> {
            (0..heads)
                .flat_map(|h| (0..n * d).map(move |i| (h * 1000 + first * d + i) as f32))
                .collect()
        };
        kv.append(&rows(0, 10), &rows(0, 10));
        kv.keep_last(4);
        kv.keep_last(9); // more than it holds: nothing changes
        kv.append(&rows(10, 2), &rows(10, 2));
        let (keys, _) = kv.arrays().unwrap();
        let expected: Vec<f32> = (0..heads)
            .flat_map(|h| (6 * d..12 * d).map(move |i| round_bf16((h * 1000 + i) as f32)))
            .collect();
        assert_eq!(super::super::host_f32(&keys).unwrap(), expected);
    }
}
