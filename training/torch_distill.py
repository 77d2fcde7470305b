"""Step 2's self-distillation in large batches, through PyTorch.

    python training/torch_distill.py OUT --shard K [--sequences N] [--batch 2048]
                                          [--target DIR] [--deadline UNIX_TIME]
                                          [--prompt-at window|line|prose]

Writes OUT/sequences-shard-K.npz in the format `train_drafter.py` reads
(same prompts stream, same share of sampled rows, same metadata), so a
trainer takes these shards beside MLX-made ones.

Why a second generator: mlx-lm's decode step of this small target is bound
by launches and host work, and MLX's CUDA backend fails above batch 32
(docs/acceptance.md, "What bounds the distillation"), so MLX made ~50
sequences a second and the drafter's data, not its steps, bounded its
acceptance. One step here runs the whole batch (thousands of rows) in a few
hundred kernels.

The arithmetic mirrors mlx-lm's Qwen3.5 forward on the target's own
weights (read through mlx-lm, dequantized once): f32 maths, rounded to the
activations' type wherever mlx-lm stores a tensor in it. That is close to
MLX but not bit-identical (another matmul summation order), so a greedy
row can leave MLX's greedy path at a near-tie; the trainer measures how
often its MLX forward agrees with these tokens and refuses data that
agrees too rarely (`train_drafter.py`, `generator_agreement`).
"""

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import torch

import common
from train_drafter import SAMPLING_TEMPERATURE, is_sampled, shard_entropy


def dense(module) -> mx.array:
    """A linear map's or embedding's weight as f32, dequantized if quantized."""
    if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        biases = None if module.biases is None else module.biases.astype(mx.float32)
        return mx.dequantize(module.weight, module.scales.astype(mx.float32), biases,
                             module.group_size, module.bits)
    return module.weight.astype(mx.float32)


class TorchTarget:
    """The target's decode step for a batch of rows, one position at a time."""

    def __init__(self, model, device: str):
        text = model.language_model
        self.args, inner = text.args, text.model
        self.device = device
        dtype = inner.norm.weight.dtype
        self.act = {mx.bfloat16: torch.bfloat16, mx.float16: torch.float16}.get(dtype, torch.float32)

        def t(a: mx.array) -> torch.Tensor:
            return torch.from_numpy(np.array(a.astype(mx.float32))).to(device)

        self.embed = t(dense(inner.embed_tokens))
        self.norm = t(inner.norm.weight)
        self.layers = []
        for layer in inner.layers:
            w = {"in": t(layer.input_layernorm.weight), "post": t(layer.post_attention_layernorm.weight),
                 "gate": t(dense(layer.mlp.gate_proj)), "up": t(dense(layer.mlp.up_proj)),
                 "down": t(dense(layer.mlp.down_proj)), "linear": layer.is_linear}
            if layer.is_linear:
                g = layer.linear_attn
                w.update(qkv=t(dense(g.in_proj_qkv)), z=t(dense(g.in_proj_z)), b=t(dense(g.in_proj_b)),
                         a=t(dense(g.in_proj_a)), conv=t(g.conv1d.weight)[:, :, 0],
                         A_log=t(g.A_log), dt_bias=t(g.dt_bias), norm=t(g.norm.weight),
                         out=t(dense(g.out_proj)))
            else:
                s = layer.self_attn
                w.update(q=t(dense(s.q_proj)), k=t(dense(s.k_proj)), v=t(dense(s.v_proj)),
                         o=t(dense(s.o_proj)), q_norm=t(s.q_norm.weight), k_norm=t(s.k_norm.weight))
            self.layers.append(w)
        a = self.args
        rot = int(a.head_dim * a.partial_rotary_factor)
        self.inv_freq = a.rope_theta ** (-torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot)

    def r(self, x: torch.Tensor) -> torch.Tensor:
        """Round to the activations' type (kept in f32 for the next op)."""
        return x.to(self.act).float()

    def lin(self, x, w):
        return self.r(x @ w.T)

    def rms(self, x, w, eps):
        normed = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        return self.r(normed if w is None else normed * w)

    def rope(self, x, pos: int):
        half = self.inv_freq.numel()
        angle = pos * self.inv_freq
        cos, sin = torch.cos(angle), torch.sin(angle)
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return self.r(torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], -1))

    def start(self, rows: int, length: int):
        """Empty caches for `rows` sequences of up to `length` positions."""
        a, z = self.args, lambda *shape: torch.zeros(shape, device=self.device)
        conv_dim = 2 * a.linear_num_key_heads * a.linear_key_head_dim + a.linear_num_value_heads * a.linear_value_head_dim
        self.cache = []
        for w in self.layers:
            if w["linear"]:
                self.cache.append([z(rows, a.linear_conv_kernel_dim - 1, conv_dim),
                                   z(rows, a.linear_num_value_heads, a.linear_value_head_dim, a.linear_key_head_dim)])
            else:
                self.cache.append([z(rows, a.num_key_value_heads, length, a.head_dim),
                                   z(rows, a.num_key_value_heads, length, a.head_dim)])

    def gated_delta(self, w, c, h):
        a, eps = self.args, self.args.rms_norm_eps
        B, hk, hv, dk, dv = h.shape[0], a.linear_num_key_heads, a.linear_num_value_heads, a.linear_key_head_dim, a.linear_value_head_dim
        qkv, z = self.lin(h, w["qkv"]), self.lin(h, w["z"]).view(B, hv, dv)
        b, a_ = self.lin(h, w["b"]), self.lin(h, w["a"])
        window = torch.cat([c[0], qkv[:, None]], 1)
        c[0] = window[:, 1:]
        conv = self.r((window * w["conv"].T[None]).sum(1))
        conv = self.r(conv * torch.sigmoid(conv))
        q = conv[:, :hk * dk].view(B, hk, dk)
        k = conv[:, hk * dk:2 * hk * dk].view(B, hk, dk)
        v = conv[:, 2 * hk * dk:].view(B, hv, dv)
        inv = dk ** -0.5
        q = self.r(self.rms(q, None, eps * inv * inv) * (inv * inv))
        k = self.r(self.rms(k, None, eps * inv * inv) * inv)
        q, k = q.repeat_interleave(hv // hk, 1), k.repeat_interleave(hv // hk, 1)
        beta = self.r(torch.sigmoid(b))
        decay = torch.exp(-torch.exp(w["A_log"]) * self.r(torch.nn.functional.softplus(self.r(a_ + w["dt_bias"]))))
        state = c[1] * decay[..., None, None]
        kv = (state * k[:, :, None, :]).sum(-1)
        state = state + k[:, :, None, :] * ((v - kv) * beta[..., None])[..., None]
        c[1] = state
        y = self.r((state * q[:, :, None, :]).sum(-1))
        gated = self.r(torch.nn.functional.silu(z) * self.rms(y, w["norm"], eps))
        return self.lin(gated.reshape(B, -1), w["out"])

    def attention(self, w, c, h, pos: int):
        a = self.args
        B, nq, nk, d = h.shape[0], a.num_attention_heads, a.num_key_value_heads, a.head_dim
        qg = self.lin(h, w["q"]).view(B, nq, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(B, nq * d)
        k, v = self.lin(h, w["k"]).view(B, nk, d), self.lin(h, w["v"]).view(B, nk, d)
        q = self.rope(self.rms(q, w["q_norm"], a.rms_norm_eps), pos)
        k = self.rope(self.rms(k, w["k_norm"], a.rms_norm_eps), pos)
        c[0][:, :, pos], c[1][:, :, pos] = k, v
        keys, values = c[0][:, :, :pos + 1], c[1][:, :, :pos + 1]
        q = q.view(B, nk, nq // nk, d)
        scores = torch.einsum("bgrd,bgtd->bgrt", q, keys) * d ** -0.5
        out = self.r(torch.einsum("bgrt,bgtd->bgrd", scores.softmax(-1), values).reshape(B, nq * d))
        return self.lin(self.r(out * self.r(torch.sigmoid(gate))), w["o"])

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits (in the activations' type, held as f32) after `tokens` at `pos`."""
        eps = self.args.rms_norm_eps
        x = self.r(self.embed[tokens])
        for w, c in zip(self.layers, self.cache):
            h = self.rms(x, w["in"], eps)
            x = self.r(x + (self.gated_delta(w, c, h) if w["linear"] else self.attention(w, c, h, pos)))
            h = self.rms(x, w["post"], eps)
            g = self.lin(h, w["gate"])
            x = self.r(x + self.lin(self.r(self.r(g * torch.sigmoid(g)) * self.lin(h, w["up"])), w["down"]))
        return self.lin(self.rms(x, self.norm, eps), self.embed)


@torch.no_grad()
def generate(target: TorchTarget, prompts: np.ndarray, generate: int, sampled: np.ndarray,
             generator: torch.Generator) -> np.ndarray:
    """Each prompt and its continuation of `generate` tokens: greedy, or at
    SAMPLING_TEMPERATURE for the rows `sampled` marks."""
    rows, prompt = prompts.shape
    target.start(rows, prompt + generate)
    tokens = torch.from_numpy(prompts.astype(np.int64)).to(target.device)
    drawn_rows = torch.from_numpy(sampled).to(target.device)
    out = [tokens]
    for pos in range(prompt - 1):
        target.step(tokens[:, pos], pos)
    current = tokens[:, -1]
    for pos in range(prompt - 1, prompt + generate - 1):
        logits = target.step(current, pos)
        greedy = logits.argmax(-1)
        if drawn_rows.any():
            probs = torch.softmax(logits / SAMPLING_TEMPERATURE, -1)
            drawn = torch.multinomial(probs, 1, generator=generator)[:, 0]
            current = torch.where(drawn_rows, drawn, greedy)
        else:
            current = greedy
        out.append(current[:, None])
    return torch.cat(out, 1).to(torch.int32).cpu().numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--target", type=Path, help="default: OUT/target-raw, else models/default/target")
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequences", type=int, default=65536)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--generate", type=int, default=192)
    parser.add_argument("--sampled-fraction", type=float, default=0.125)
    parser.add_argument("--deadline", type=float, default=0.0, help="unix time; stop starting batches after it")
    parser.add_argument("--prompt-at", choices=("window", "line", "prose"), default="window",
                        help="window: prompts are random corpus windows; line: windows ending right "
                             "after a line that opens a block (common.line_end_windows); prose: "
                             "windows ending after a word of a docstring or comment "
                             "(common.prose_windows); both drawn without repeats, like the "
                             "prompts people write")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 products, as MLX's
    mx.set_default_device(mx.cpu)  # MLX only reads the weights; the GPU is torch's
    target_dir = args.target or (args.out / "target-raw")
    if not target_dir.exists():
        target_dir = common.ROOT / "models" / "default" / "target"
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "corpus.npz").exists():
        common.write_token_stream(common.load_tokenizer(target_dir), args.out / "corpus.npz", 20e6)
    corpus = np.load(args.out / "corpus.npz")
    stream = np.concatenate([corpus["train"], corpus["valid"]])
    target = TorchTarget(common.load_target(target_dir), args.device)
    rng = np.random.default_rng(shard_entropy(args.seed, args.shard))
    generator = torch.Generator(device=args.device).manual_seed(args.seed * 1000 + 1 + args.shard)
    began, out = time.time(), []
    if args.prompt_at != "window":
        find = {"line": common.line_end_windows, "prose": common.prose_windows}[args.prompt_at]
        ends = find(stream, common.load_tokenizer(target_dir), args.prompt)
        if len(ends) < args.sequences:
            raise SystemExit(f"only {len(ends)} {args.prompt_at} windows for {args.sequences} sequences")
        drawn_starts = rng.choice(ends, size=args.sequences, replace=False) - args.prompt
        print(f"{len(ends)} {args.prompt_at} windows in {time.time() - began:.1f} s", flush=True)
    for first in range(0, args.sequences, args.batch):
        if first and args.deadline and time.time() > args.deadline:
            break
        n = min(args.batch, args.sequences - first)
        if args.prompt_at != "window":
            starts = drawn_starts[first:first + n]
        else:
            starts = rng.integers(0, stream.size - args.prompt, size=n)
        prompts = np.stack([stream[s:s + args.prompt] for s in starts])
        sampled = np.array([is_sampled(i, args.sampled_fraction) for i in range(first, first + n)])
        t0 = time.time()
        out.append(generate(target, prompts, args.generate, sampled, generator))
        print(f"torch distill: {n} sequences in {time.time() - t0:.2f} s "
              f"({n / (time.time() - t0):.0f} sequences/s)", flush=True)
    sequences = np.concatenate(out)
    meta = {"seed": args.seed, "prompt": args.prompt, "generate": args.generate,
            "sampled_fraction": args.sampled_fraction, "distill_batch": args.batch, "sync": True,
            "temperature": SAMPLING_TEMPERATURE, "smoke": False,
            "target": common.sha256(next(iter(sorted(target_dir.glob("model*.safetensors"))))),
            "shard": args.shard, "backend": f"torch {torch.__version__} {args.device}",
            "prompt_at": args.prompt_at,
            "cut_by_deadline": len(sequences) < args.sequences}
    path = args.out / f"sequences-shard-{args.shard}.npz"
    np.savez(path, sequences=sequences, meta=json.dumps(meta))
    print(f"wrote {len(sequences)} sequences to {path} in {time.time() - began:.1f} s", flush=True)


if __name__ == "__main__":
    main()
