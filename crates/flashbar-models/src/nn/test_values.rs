//! Deterministic, sign-mixed test inputs shared by the host paths' unit
//! tests (no random seed: every machine sees the same values).

use half::bf16;

/// `sin((i + salt) * 0.618034) * scale` for i in 0..n.
pub fn values(n: usize, salt: f32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + salt) * 0.618_034).sin() * scale)
        .collect()
}

/// [`values`] rounded to bf16 (as f32).
pub fn bf16_values(n: usize, salt: f32, scale: f32) -> Vec<f32> {
    values(n, salt, scale)
        .into_iter()
        .map(|v| bf16::from_f32(v).to_f32())
        .collect()
}
