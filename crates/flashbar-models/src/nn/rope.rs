//! Rotary position embeddings: plain, linear-scaled and YaRN, the way the
//! reference builds them (docs/dflash.md, "Rope scaling"). The scaling's
//! parameters are read with the config (`config::Scaling`).
//!
//! YaRN rotates with per-pair periods blended between the original ones and
//! `factor` times longer ones, and multiplies the rotated dims by `mscale`
//! before rotating.

use crate::config::Scaling;
use crate::error::Result;
use mlx_rs::fast::rope;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

/// Rotates the first `dims` of the last axis of `x` (`[B, heads, L, head_dim]`)
/// for positions `offset..`.
pub fn apply(x: &Array, dims: i32, base: f32, scaling: Scaling, offset: i32) -> Result<Array> {
    match scaling {
        Scaling::Linear(scale) => Ok(rope(x, dims, false, base, scale, offset, None)?),
        Scaling::Yarn(yarn) => {
            let m = yarn.input_scale();
            let x = if m == 1.0 {
                x.clone()
            } else {
                let m = Array::from_f32(m).as_dtype(x.dtype())?;
                let head_dim = *x.shape().last().unwrap_or(&dims);
                if head_dim == dims {
                    x.multiply(&m)?
                } else {
                    let rotated = x.index((.., .., .., ..dims)).multiply(&m)?;
                    concatenate(&[&rotated, &x.index((.., .., .., dims..))], -1)?
                }
            };
            let periods = yarn.periods(dims as usize, base);
            let freqs = Array::from_slice(&periods, &[periods.len() as i32]);
            Ok(rope(&x, dims, false, None, 1.0, offset, &freqs)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Yarn;
    use serde_json::Value;

    // What mlx-lm's YarnRoPE (rope_utils.initialize_rope) gives for these
    // settings, printed from the test venv (docs/dflash.md, "Rope scaling").
    const YARN: &str = r#"{"rope_type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}"#;
    const PERIODS_16_1E7: [f32; 8] = [
        1.0, 11.998307, 224.93654, 1686.786, 12649.111, 94854.945, 711311.75, 5334085.5,
    ];
    const PERIODS_8_1E4: [f32; 4] = [1.0, 16.0, 400.0, 4000.0];
    // Rows of x = sin(0.37 i) [1, 2, 3, 16] rotated at offset 5 (all 16 dims,
    // base 1e7) and at offset 2 (first 8 dims, base 1e4): the first 8 values
    // of head 0, position 0 and of head 1, position 2.
    const FULL: [[f32; 8]; 2] = [
        [
            0.197186, 0.462829, 0.780984, 1.022567, 1.134373, 1.094596, 0.907, 0.596693,
        ],
        [
            -1.513737, -1.569122, -1.035247, -0.742331, -0.375654, 0.038778, 0.447674, 0.795963,
        ],
    ];
    const PARTIAL: [[f32; 8]; 2] = [
        [
            -1.031088, 0.272072, 0.76322, 1.01957, -0.471885, 1.137331, 0.91082, 0.597202,
        ],
        [
            0.437949, -1.104239, -1.006455, -0.739468, 1.081298, -0.241924, 0.437629, 0.795223,
        ],
    ];

    fn yarn() -> Yarn {
        let v: Value = serde_json::from_str(YARN).unwrap();
        match Scaling::parse(Some(&v)).unwrap() {
            Scaling::Yarn(y) => y,
            other => panic!("parsed as {other:?}"),
        }
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * y.abs().max(1.0), "{i}: {x} vs {y}");
        }
    }

    #[test]
    fn yarn_periods_and_mscale_match_mlx_lm() {
        let y = yarn();
        close(&y.periods(16, 1e7), &PERIODS_16_1E7, 1e-5);
        close(&y.periods(8, 1e4), &PERIODS_8_1E4, 1e-6);
        assert!((y.input_scale() - 1.138_629_4).abs() < 1e-6);
    }

    #[test]
    fn yarn_rotation_matches_mlx_lm_whole_and_partial() {
        let values: Vec<f32> = (0..96).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Array::from_slice(&values, &[1, 2, 3, 16]);
        for (dims, base, offset, expected) in [(16, 1e7, 5, FULL), (8, 1e4, 2, PARTIAL)] {
            let out = apply(&x, dims, base, Scaling::Yarn(yarn()), offset).unwrap();
            out.eval().unwrap();
            let out = out.as_slice::<f32>();
            close(&out[..8], &expected[0], 1e-4);
            let row = (3 + 2) * 16; // head 1, position 2
            close(&out[row..row + 8], &expected[1], 1e-4);
        }
    }
}
