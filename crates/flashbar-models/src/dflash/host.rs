//! The DFlash drafter's forward on the CPU's host path (docs/cpu.md, "The
//! drafter"): its linear maps were already host products, but every norm,
//! residual add, RoPE, concatenation and its attention were MLX ops, each
//! a hand-over to MLX's worker thread between two host products. Here they
//! run in Rust on the arrays the products return: the norms and RoPE as
//! the target's host ops compute them (MLX's, bit for bit), the attention
//! in the host kernels' f32 arithmetic, so the drafts are close to the MLX
//! path's, not equal. That is enough: drafts are proposals, and the verify
//! decides every token (docs/dflash.md).
//!
//! Taken for one sequence of bf16 activations, bf16 norms, unscaled or
//! linearly scaled RoPE, and layers that see their whole context and block
//! (no window, not causal: the embedded drafter's); others run MLX's ops.

use super::{DraftAttention, Drafter};
use crate::config::Rope;
use crate::error::Result;
use crate::nn::attention::KvCache;
use crate::nn::attention_host::{by_heads, HostAttention};
use crate::nn::host::{self, host_f32, HostVector};
use crate::{DraftCache, Model};
use mlx_rs::{Array, Dtype};

/// What the host path computes with, made once at load.
pub struct HostDraft {
    hidden_norm: HostVector,
    norm: HostVector,
    layers: Vec<HostLayer>,
    eps: f32,
}

struct HostLayer {
    /// The q/k norms and RoPE.
    head: HostAttention,
    input_layernorm: HostVector,
    post_attention_layernorm: HostVector,
}

impl HostDraft {
    /// None when the drafter is not one this path takes (see the module).
    pub fn new(drafter: &Drafter, host_maps: bool) -> Result<Option<Self>> {
        let c = drafter.config();
        let bf16 = |a: &Array| a.dtype() == Dtype::Bfloat16;
        if !host_maps || c.input_embedding_scale != 1.0 {
            return Ok(None);
        }
        let mut layers = Vec::with_capacity(drafter.layers.len());
        for layer in &drafter.layers {
            let a = &layer.attention;
            let norms = [&layer.input_layernorm, &layer.post_attention_layernorm];
            if a.window.is_some() || a.causal || !norms.iter().all(|n| bf16(n)) {
                return Ok(None);
            }
            let rope = Rope {
                dims: a.head_dim as usize,
                theta: c.rope_theta,
                scaling: c.rope_scaling,
            };
            let Some(head) = HostAttention::new(&a.q_norm, &a.k_norm, rope, c.rms_norm_eps)? else {
                return Ok(None);
            };
            layers.push(HostLayer {
                head,
                input_layernorm: HostVector::of(norms[0])?,
                post_attention_layernorm: HostVector::of(norms[1])?,
            });
        }
        if !bf16(&drafter.hidden_norm) || !bf16(&drafter.norm) {
            return Ok(None);
        }
        Ok(Some(HostDraft {
            hidden_norm: HostVector::of(&drafter.hidden_norm)?,
            norm: HostVector::of(&drafter.norm)?,
            layers,
            eps: c.rms_norm_eps,
        }))
    }

    /// [`Drafter::forward`]'s logits before the config's output scaling, or
    /// None (nothing touched) when the inputs are not one bf16 sequence.
    pub fn forward(
        &self,
        drafter: &Drafter,
        target: &Model,
        block: &Array,
        taps: &Array,
        cache: &mut DraftCache,
    ) -> Result<Option<Array>> {
        let mut h = target.embed(block)?;
        if h.dtype() != Dtype::Bfloat16 || h.shape()[0] != 1 {
            return Ok(None);
        }
        let context = drafter.fc.forward(taps)?;
        if context.dtype() != Dtype::Bfloat16 {
            return Ok(None);
        }
        let context = self.norm(&context, &self.hidden_norm)?;
        let start = cache.positions;
        for ((layer, host), kv) in drafter
            .layers
            .iter()
            .zip(&self.layers)
            .zip(cache.layers.iter_mut())
        {
            let x = self.norm(&h, &host.input_layernorm)?;
            let attended = layer
                .attention
                .forward_host(&host.head, &x, &context, start, kv)?;
            h = add(&h, &attended)?;
            let x = self.norm(&h, &host.post_attention_layernorm)?;
            h = add(&h, &layer.mlp.forward(&x)?)?;
        }
        cache.positions += taps.shape()[1];
        // Positions 1.. are the drafts.
        let (l, hidden) = (h.shape()[1], h.shape()[2] as usize);
        let mut drafts = host_f32(&h)?.split_off(hidden);
        host::norm_rows(&mut drafts, &self.norm, self.eps, true);
        let h = host::from_f32(&drafts, &[1, l - 1, hidden as i32], Dtype::Bfloat16)?;
        Ok(Some(target.lm_head(&h)?))
    }

    /// MLX's RMS norm of bf16 `x` by a bf16 weight, on the host.
    fn norm(&self, x: &Array, w: &HostVector) -> Result<Array> {
        host::rms_norm(x, w, self.eps)?.ok_or_else(|| unexpected("a norm's input"))
    }
}

/// MLX's add of two bf16 arrays of one shape, on the host.
fn add(a: &Array, b: &Array) -> Result<Array> {
    host::add(a, b)?.ok_or_else(|| unexpected("a residual add"))
}

fn unexpected(what: &str) -> crate::error::ModelError {
    mlx_rs::error::Exception::custom(format!("the host drafter got {what} of another type")).into()
}

impl DraftAttention {
    /// [`DraftAttention::forward`] on the host (no window, no mask): `x` the
    /// block `[1, L, hidden]`, `context` S new committed positions from
    /// absolute position `start`.
    fn forward_host(
        &self,
        head: &HostAttention,
        x: &Array,
        context: &Array,
        start: i32,
        kv: &mut KvCache,
    ) -> Result<Array> {
        let (l, s) = (x.shape()[1] as usize, context.shape()[1] as usize);
        let (heads, kv_heads, d) = (
            self.heads as usize,
            self.kv_heads as usize,
            self.head_dim as usize,
        );
        let hidden = x.shape()[2];
        // The context's rows and the block's through one product (the
        // context's queries are not used).
        let rows = if s > 0 {
            let mut both = host_f32(context)?;
            both.extend(host_f32(x)?);
            host::from_f32(&both, &[1, (s + l) as i32, hidden], Dtype::Bfloat16)?
        } else {
            x.clone()
        };
        let qkv = self.qkv.forward(&rows)?;
        let (q, k, v) = (host_f32(&qkv[0])?, host_f32(&qkv[1])?, host_f32(&qkv[2])?);
        let (qw, kw) = (heads * d, kv_heads * d);
        let block_start = start + s as i32;
        let mut queries = by_heads(&q[s * qw..], l, heads, d);
        head.queries(&mut queries, l, d, block_start);
        let mut block_keys = by_heads(&k[s * kw..], l, kv_heads, d);
        head.keys(&mut block_keys, l, d, block_start);
        let block_values = by_heads(&v[s * kw..], l, kv_heads, d);
        let mut new_keys = by_heads(&k[..s * kw], s, kv_heads, d);
        head.keys(&mut new_keys, s, d, start);
        let new_values = by_heads(&v[..s * kw], s, kv_heads, d);
        // The context grows by its new rows; the block's rows are put after
        // them for this attention only.
        let cache = kv.host(kv_heads, d)?;
        cache.append(&new_keys, &new_values);
        let ctx_len = cache.len();
        cache.append(&block_keys, &block_values);
        let mut out = vec![0f32; heads * l * d];
        let dims = (heads, kv_heads, l, ctx_len + l, d);
        let scale = (d as f32).powf(-0.5);
        host::full_attention(&queries, cache.rows(), dims, scale, &mut out);
        cache.truncate(ctx_len);
        // [heads, L, d] to [1, L, heads * d].
        let mut by_rows = vec![0f32; out.len()];
        for h in 0..heads {
            for t in 0..l {
                by_rows[(t * heads + h) * d..][..d].copy_from_slice(&out[(h * l + t) * d..][..d]);
            }
        }
        let shape = [1, l as i32, (heads * d) as i32];
        self.o_proj
            .forward(&host::from_f32(&by_rows, &shape, Dtype::Bfloat16)?)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Drafter, Model, Outputs};
    use mlx_rs::ops::indexing::IndexOp;
    use mlx_rs::Array;
    use std::path::PathBuf;

    fn embedded(which: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/default")
            .join(which)
    }

    fn values(a: &Array) -> Vec<f32> {
        crate::nn::host::host_f32(a).unwrap()
    }

    /// The embedded drafter on the host path against MLX's ops, over three
    /// rounds (a prompt's context, then 5 and 1 committed positions): the
    /// logits within a few bf16 roundings of each other (the host's
    /// attention sums in f32, MLX's CPU fallback rounds to bf16 on the way),
    /// and the drafts, the logits' argmax, the same where MLX's top two are
    /// not within that distance. MLX's ops are checked twice: over the host
    /// path's weights, and on MLX's own matmul path (the GPU's: dense
    /// products, q/k/v stacked into one, the context's and the block's keys
    /// rotated in one call).
    #[test]
    fn host_drafts_are_the_mlx_path_s_within_bf16_rounding() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let target = Model::load(&embedded("target")).unwrap();
        let host = Drafter::load(&embedded("drafter"), &target).unwrap();
        assert!(host.is_host(), "the embedded drafter takes the host path");
        let over_host_weights = Drafter::load(&embedded("drafter"), &target)
            .unwrap()
            .without_host();
        let gpu_path = Drafter::load_on_mlx_path(&embedded("drafter"), &target).unwrap();
        assert!(!gpu_path.is_host());
        assert!(gpu_path.layers[0].attention.qkv.is_stacked());
        for (name, mlx) in [
            ("host weights", over_host_weights),
            ("MLX's path", gpu_path),
        ] {
            let rounds = rounds(&target, &host, &mlx);
            for (round, (a, b)) in rounds.iter().enumerate() {
                let (worst, largest) = worst_and_largest(a, b);
                // A few bf16 units of the largest logit (2^-8 relative each).
                assert!(
                    worst <= 8.0 * largest / 256.0,
                    "{name}, round {round}: logits differ by {worst} (largest {largest})"
                );
                for (p, (x, y)) in a.chunks(4096).zip(b.chunks(4096)).enumerate() {
                    let top = |v: &[f32]| {
                        (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
                    };
                    let mut sorted = y.to_vec();
                    sorted.sort_by(|p, q| q.total_cmp(p));
                    if sorted[0] - sorted[1] > 2.0 * worst {
                        assert_eq!(top(x), top(y), "{name}, round {round}, draft {p}");
                    }
                }
            }
        }
    }

    /// On MLX's path, q/k/v as one product over the context's and the
    /// block's rows (keys rotated together), and gate and up as one, draft
    /// what the maps one by one draft, each on its own rows, within float
    /// rounding (the products' sums may run in another order).
    #[test]
    fn stacked_dense_maps_draft_as_the_maps_apart() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let target = Model::load(&embedded("target")).unwrap();
        let load = || Drafter::load_on_mlx_path(&embedded("drafter"), &target).unwrap();
        let (stacked, apart) = (load(), load().with_maps_apart());
        for layer in &stacked.layers {
            assert!(layer.attention.qkv.is_stacked() && layer.mlp.is_stacked());
        }
        for layer in &apart.layers {
            assert!(!layer.attention.qkv.is_stacked() && !layer.mlp.is_stacked());
        }
        for (round, (a, b)) in rounds(&target, &stacked, &apart).iter().enumerate() {
            let (worst, largest) = worst_and_largest(a, b);
            assert!(
                worst <= 2.0 * largest / 256.0,
                "round {round}: logits differ by {worst} (largest {largest})"
            );
        }
    }

    /// The largest difference between `a` and `b` (of one length), and the
    /// largest magnitude in `b`.
    fn worst_and_largest(a: &[f32], b: &[f32]) -> (f32, f32) {
        assert_eq!(a.len(), b.len());
        let largest = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        (worst, largest)
    }

    /// Both drafters' logits over three rounds of the same taps: a prompt's
    /// context, then 5 and 1 committed positions.
    fn rounds(target: &Model, a: &Drafter, b: &Drafter) -> Vec<(Vec<f32>, Vec<f32>)> {
        let taps = a.config().target_layer_ids.clone();
        let ids: Vec<u32> = (0..40).map(|i| (i * 7919 + 13) % 4096).collect();
        let mut cache = target.new_cache();
        let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let tapped = target
            .forward(&tokens, &mut cache, Outputs::ALL.tapping(&taps))
            .unwrap()
            .taps
            .unwrap();
        let (mut a_cache, mut b_cache) = (a.new_cache(), b.new_cache());
        let mask = a.config().mask_token_id;
        let mut from = 0;
        let mut out = Vec::new();
        for to in [30, 35, 36] {
            let mut block = vec![ids[to - 1]];
            block.extend(std::iter::repeat_n(mask, 15));
            let block = Array::from_slice(&block, &[1, 16]);
            let rows = tapped.index((.., from as i32..to as i32));
            from = to;
            out.push((
                values(&a.forward(target, &block, &rows, &mut a_cache).unwrap()),
                values(&b.forward(target, &block, &rows, &mut b_cache).unwrap()),
            ));
            assert_eq!(a_cache.positions(), b_cache.positions());
        }
        out
    }

    /// A drafter with a context window of 12 drafts, round after round, as
    /// a fresh one fed only the latest 12 committed rows at their absolute
    /// positions: older rows are never seen, on the host path and on MLX's.
    #[test]
    fn a_context_window_sees_only_the_latest_rows() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let target = Model::load(&embedded("target")).unwrap();
        for path in ["host", "MLX over host weights", "MLX's path"] {
            let load = || match path {
                "host" => Drafter::load(&embedded("drafter"), &target).unwrap(),
                "MLX over host weights" => Drafter::load(&embedded("drafter"), &target)
                    .unwrap()
                    .without_host(),
                _ => Drafter::load_on_mlx_path(&embedded("drafter"), &target).unwrap(),
            };
            let mut windowed = load();
            windowed.config.context_window = Some(12);
            let mut whole = load();
            whole.config.context_window = None;
            let taps = whole.config().target_layer_ids.clone();
            let ids: Vec<u32> = (0..40).map(|i| (i * 7919 + 13) % 4096).collect();
            let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
            let tapped = target
                .forward(
                    &tokens,
                    &mut target.new_cache(),
                    Outputs::ALL.tapping(&taps),
                )
                .unwrap()
                .taps
                .unwrap();
            let mask = whole.config().mask_token_id;
            let mut cache = windowed.new_cache();
            let mut from = 0;
            for to in [30, 35, 36, 37] {
                let mut block = vec![ids[to - 1]];
                block.extend(std::iter::repeat_n(mask, 15));
                let block = Array::from_slice(&block, &[1, 16]);
                let rows = tapped.index((.., from as i32..to as i32));
                from = to;
                let ours = values(
                    &windowed
                        .forward(&target, &block, &rows, &mut cache)
                        .unwrap(),
                );
                let mut fresh = whole.new_cache();
                fresh.positions = to as i32 - 12;
                let latest = tapped.index((.., (to as i32 - 12)..to as i32));
                let expected =
                    values(&whole.forward(&target, &block, &latest, &mut fresh).unwrap());
                assert_eq!(ours, expected, "{path}, round ending at {to}");
                assert_eq!(cache.positions(), to);
            }
        }
    }
}
