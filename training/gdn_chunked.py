"""The chunked gated delta rule in MLX ops: the GDN recurrence computed in
parallel over time inside chunks of C tokens, with the state passed between
chunks (WY form, as in the Gated DeltaNet paper). Training needs it because
mlx-lm's ops path loops over every token, which makes a backward pass over a
256-token sequence thousands of tiny kernels.

Same contract as mlx-lm's `gated_delta_ops`: q, k [B, T, Hk, Dk] already
normalized (q carries the Dk^-1/2 readout scale), v [B, T, Hv, Dv], g and beta
[B, T, Hv], state [B, Hv, Dv, Dk] f32; returns y [B, T, Hv, Dv] and the final
state. Per step: S <- g S; delta = beta (v - S k); S <- S + delta k^T; y = S q.
"""

import mlx.core as mx


def _unit_lower_inverse(strict: mx.array, size: int) -> mx.array:
    """(I + A)^-1 for strictly lower-triangular A, by forward substitution one
    row at a time (vectorized over every chunk and head). A product form
    (I - A)(I + A^2)(I + A^4)... is shorter but its powers grow like binomial
    coefficients when keys align, and f32 cancellation then gives inf/NaN."""
    rows = [-strict[..., 0, :]]
    for i in range(1, size):
        row = -strict[..., i, :]
        # row_i = -A_i - sum_{j<i} A_ij row_j  (row_j already solved)
        below = mx.stack(rows, axis=-2)  # [..., i, size]
        row = row - (strict[..., i, :i, None] * below).sum(-2)
        rows.append(row)
    return mx.stack(rows, axis=-2) + mx.eye(size, dtype=strict.dtype)


def chunked_gated_delta(q, k, v, g, beta, state=None, chunk: int = 32, log_g=None):
    """`log_g` (the log of g, computed without the exp) may replace g: a g
    that underflows to 0 would make log(g) -inf and the chunk maths NaN."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if (repeat := Hv // Hk) > 1:
        q = mx.repeat(q, repeat, -2)
        k = mx.repeat(k, repeat, -2)
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    C = min(chunk, 1 << max(0, (T - 1).bit_length()))
    pad = (-T) % C
    f32 = mx.float32
    # [B, H, T, D], padded with steps that leave the state alone (k = v =
    # beta = 0, g = 1).
    q, k, v = (x.astype(f32).transpose(0, 2, 1, 3) for x in (q, k, v))
    log_g = (mx.log(g.astype(f32)) if log_g is None else log_g.astype(f32)).transpose(0, 2, 1)
    beta = beta.astype(f32).transpose(0, 2, 1)
    if pad:
        widths = [(0, 0), (0, 0), (0, pad), (0, 0)]
        q, k, v = (mx.pad(x, widths) for x in (q, k, v))
        log_g = mx.pad(log_g, widths[:3])
        beta = mx.pad(beta, widths[:3])
    n = (T + pad) // C
    q, k, v = (x.reshape(B, Hv, n, C, -1) for x in (q, k, v))
    log_g = log_g.reshape(B, Hv, n, C)
    beta = beta.reshape(B, Hv, n, C)

    cum = mx.cumsum(log_g, axis=-1)  # log of the decay since the chunk start
    rows = mx.arange(C)[:, None]
    cols = mx.arange(C)[None, :]
    lower = rows >= cols
    diff = cum[..., :, None] - cum[..., None, :]
    decay = mx.where(lower, mx.exp(mx.where(lower, diff, 0.0)), 0.0)
    k_beta = k * beta[..., None]
    v_beta = v * beta[..., None]
    strict = mx.where(rows > cols, (k_beta @ k.swapaxes(-1, -2)) * decay, 0.0)
    solve = _unit_lower_inverse(strict, C)
    w = solve @ v_beta                                  # [B,H,n,C,Dv]
    k_decayed = solve @ (k_beta * mx.exp(cum)[..., None])  # [B,H,n,C,Dk]
    qk = (q @ k.swapaxes(-1, -2)) * decay               # [B,H,n,C,C]
    q_decayed = q * mx.exp(cum)[..., None]
    tail = mx.exp(cum[..., -1:] - cum)[..., None]       # decay to the chunk end

    ys = []
    for i in range(n):
        s_t = state.swapaxes(-1, -2)                    # [B,H,Dk,Dv]
        delta = w[:, :, i] - k_decayed[:, :, i] @ s_t   # [B,H,C,Dv]
        ys.append(q_decayed[:, :, i] @ s_t + qk[:, :, i] @ delta)
        state = (mx.exp(cum[:, :, i, -1])[..., None, None] * state
                 + delta.swapaxes(-1, -2) @ (k[:, :, i] * tail[:, :, i]))
    y = mx.stack(ys, axis=2).reshape(B, Hv, n * C, Dv)[:, :, :T]
    return y.transpose(0, 2, 1, 3), state
