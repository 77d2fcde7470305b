//! Rotary position embeddings: plain, linear-scaled and YaRN, the way the
//! reference builds them (docs/dflash.md, "Rope scaling").
//!
//! YaRN rotates with per-pair periods blended between the original ones and
//! `factor` times longer ones, and multiplies the rotated dims by `mscale`
//! before rotating.

use crate::config::require_finite;
use crate::error::Result;
use mlx_rs::fast::rope;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serde_json::Value;

/// YaRN's parameters (`rope_scaling` / `rope_parameters` of type "yarn").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_max_position_embeddings: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub mscale: f32,
    pub mscale_all_dim: f32,
}

/// How positions are scaled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scaling {
    /// Positions times this (1 = none, 1/factor = "linear").
    Linear(f32),
    Yarn(Yarn),
}

impl Scaling {
    /// From a `rope_scaling` / `rope_parameters` object (None = default).
    pub fn parse(params: Option<&Value>) -> Result<Self, String> {
        let Some(p) = params.filter(|p| !p.is_null()) else {
            return Ok(Scaling::Linear(1.0));
        };
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let num = |key: &str| p.get(key).and_then(Value::as_f64).map(|v| v as f32);
        let factor = || -> Result<f32, String> {
            let f = num("factor").ok_or(format!("{kind} rope scaling needs `factor`"))?;
            require_finite("rope factor", f, false)?;
            Ok(f)
        };
        match kind {
            "default" => Ok(Scaling::Linear(1.0)),
            "linear" => Ok(Scaling::Linear(1.0 / factor()?)),
            "yarn" => {
                let yarn = Yarn {
                    factor: factor()?,
                    original_max_position_embeddings: num("original_max_position_embeddings")
                        .unwrap_or(4096.0),
                    beta_fast: num("beta_fast").unwrap_or(32.0),
                    beta_slow: num("beta_slow").unwrap_or(1.0),
                    mscale: num("mscale").unwrap_or(1.0),
                    mscale_all_dim: num("mscale_all_dim").unwrap_or(0.0),
                };
                require_finite(
                    "original_max_position_embeddings",
                    yarn.original_max_position_embeddings,
                    false,
                )?;
                require_finite("beta_fast", yarn.beta_fast, false)?;
                require_finite("beta_slow", yarn.beta_slow, false)?;
                require_finite("mscale", yarn.mscale, true)?;
                require_finite("mscale_all_dim", yarn.mscale_all_dim, true)?;
                if num("attention_factor").is_some() || yarn.mscale_all_dim != 0.0 {
                    return Err(
                        "yarn rope scaling with attention_factor or mscale_all_dim is not supported"
                            .into(),
                    );
                }
                Ok(Scaling::Yarn(yarn))
            }
            other => Err(format!(
                "unsupported rope scaling type {other:?} (default, linear, yarn)"
            )),
        }
    }
}

impl Yarn {
    fn get_mscale(scale: f64, mscale: f64) -> f64 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * mscale * scale.ln() + 1.0
        }
    }

    /// What the rotated dims are multiplied by before rotating.
    pub fn input_scale(&self) -> f32 {
        let f = self.factor as f64;
        (Self::get_mscale(f, self.mscale as f64) / Self::get_mscale(f, self.mscale_all_dim as f64))
            as f32
    }

    /// The period of each rotated pair (`dims / 2` values), as `fast::rope`
    /// takes them in `freqs`.
    pub fn periods(&self, dims: usize, base: f32) -> Vec<f32> {
        let (d, base) = (dims as f64, base as f64);
        let original = self.original_max_position_embeddings as f64;
        let correction = |rotations: f64| {
            d * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let low = correction(self.beta_fast as f64).floor().max(0.0);
        let mut high = correction(self.beta_slow as f64).ceil().min(d - 1.0);
        if low == high {
            high += 0.001;
        }
        (0..dims / 2)
            .map(|i| {
                // f32 steps where the reference computes in f32.
                let extra = (base as f32).powf((2 * i) as f32 / dims as f32) as f64;
                let inter = self.factor as f64 * extra;
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let mask = 1.0 - ramp;
                ((inter * extra) / (inter * mask + extra * (1.0 - mask))) as f32
            })
            .collect()
    }
}

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

    #[test]
    fn rope_types_parse_or_are_refused() {
        let parse = |s: &str| Scaling::parse(Some(&serde_json::from_str(s).unwrap()));
        assert_eq!(
            parse(r#"{"rope_type": "default"}"#),
            Ok(Scaling::Linear(1.0))
        );
        assert_eq!(
            parse(r#"{"type": "linear", "factor": 2.0}"#),
            Ok(Scaling::Linear(0.5))
        );
        assert_eq!(Scaling::parse(None), Ok(Scaling::Linear(1.0)));
        assert!(parse(r#"{"rope_type": "yarn"}"#)
            .unwrap_err()
            .contains("factor"));
        assert!(
            parse(r#"{"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 1.0}"#)
                .unwrap_err()
                .contains("mscale_all_dim")
        );
        assert!(parse(r#"{"rope_type": "longrope", "factor": 4.0}"#)
            .unwrap_err()
            .contains("longrope"));
    }
}
