//! Rope scaling as config.json gives it (`rope_scaling` / `rope_parameters`):
//! parsed and checked here with the rest of the config; `nn::rope` rotates
//! with it (docs/dflash.md, "Rope scaling").

use super::require_finite;
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

#[cfg(test)]
mod tests {
    use super::*;

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
