//! What a checkpoint must hold for a config: every tensor's name, dtype and
//! shape, checked against the safetensors headers before anything is loaded.

use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use std::collections::{BTreeMap, BTreeSet};

/// A tensor as a header describes it (after sanitizing names and layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub dtype: String,
    pub shape: Vec<usize>,
}

enum Expect {
    /// A float tensor of exactly this shape.
    Tensor(String, Vec<usize>),
    /// A linear map (or embedding) `[..lead, out, in]`, plain or quantized.
    Linear(String, Vec<usize>, usize, usize),
}

/// Checks `headers` (sanitized names) against what `config` needs.
pub fn check(config: &ModelConfig, headers: &BTreeMap<String, Header>) -> Result<()> {
    let mut used = BTreeSet::new();
    for expect in expected(config) {
        match expect {
            Expect::Tensor(name, shape) => {
                check_float(headers, &name, &shape)?;
                used.insert(name);
            }
            Expect::Linear(path, lead, out, inp) => {
                check_linear(config, headers, &path, &lead, out, inp, &mut used)?;
            }
        }
    }
    match headers.keys().find(|name| !used.contains(*name)) {
        Some(extra) => Err(ModelError::UnexpectedTensor(extra.clone())),
        None => Ok(()),
    }
}

fn expected(config: &ModelConfig) -> Vec<Expect> {
    let t = &config.text;
    let h = t.hidden_size;
    let linear = |path: String, out: usize, inp: usize| Expect::Linear(path, vec![], out, inp);
    let tensor = |name: String, shape: Vec<usize>| Expect::Tensor(name, shape);
    let mut out = vec![
        linear("model.embed_tokens".into(), t.vocab_size, h),
        tensor("model.norm.weight".into(), vec![h]),
    ];
    if !t.tie_word_embeddings {
        out.push(linear("lm_head".into(), t.vocab_size, h));
    }
    for i in 0..t.num_hidden_layers {
        let p = format!("model.layers.{i}");
        out.push(tensor(format!("{p}.input_layernorm.weight"), vec![h]));
        out.push(tensor(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
        ));
        if t.is_linear_layer(i) {
            let a = format!("{p}.linear_attn");
            let (hv, dv) = (t.linear_num_value_heads, t.linear_value_head_dim);
            out.push(linear(format!("{a}.in_proj_qkv"), t.conv_dim(), h));
            out.push(linear(format!("{a}.in_proj_z"), t.value_dim(), h));
            out.push(linear(format!("{a}.in_proj_b"), hv, h));
            out.push(linear(format!("{a}.in_proj_a"), hv, h));
            out.push(tensor(
                format!("{a}.conv1d.weight"),
                vec![t.conv_dim(), t.linear_conv_kernel_dim, 1],
            ));
            out.push(tensor(format!("{a}.dt_bias"), vec![hv]));
            out.push(tensor(format!("{a}.A_log"), vec![hv]));
            out.push(tensor(format!("{a}.norm.weight"), vec![dv]));
            out.push(linear(format!("{a}.out_proj"), h, t.value_dim()));
        } else {
            let a = format!("{p}.self_attn");
            let (n, kv, d) = (t.num_attention_heads, t.num_key_value_heads, t.head_dim());
            out.push(linear(format!("{a}.q_proj"), 2 * n * d, h));
            out.push(linear(format!("{a}.k_proj"), kv * d, h));
            out.push(linear(format!("{a}.v_proj"), kv * d, h));
            out.push(linear(format!("{a}.o_proj"), h, n * d));
            out.push(tensor(format!("{a}.q_norm.weight"), vec![d]));
            out.push(tensor(format!("{a}.k_norm.weight"), vec![d]));
            if t.attention_bias {
                for (proj, size) in [
                    ("q_proj", 2 * n * d),
                    ("k_proj", kv * d),
                    ("v_proj", kv * d),
                    ("o_proj", h),
                ] {
                    out.push(tensor(format!("{a}.{proj}.bias"), vec![size]));
                }
            }
        }
        let m = format!("{p}.mlp");
        match config.architecture {
            Architecture::Dense => {
                out.push(linear(format!("{m}.gate_proj"), t.intermediate_size, h));
                out.push(linear(format!("{m}.up_proj"), t.intermediate_size, h));
                out.push(linear(format!("{m}.down_proj"), h, t.intermediate_size));
            }
            Architecture::Moe => {
                let (e, mi, si) = (
                    t.num_experts,
                    t.moe_intermediate_size,
                    t.shared_expert_intermediate_size,
                );
                let switch = |name: &str, out_dim, in_dim| {
                    Expect::Linear(format!("{m}.switch_mlp.{name}"), vec![e], out_dim, in_dim)
                };
                out.push(linear(format!("{m}.gate"), e, h));
                out.push(switch("gate_proj", mi, h));
                out.push(switch("up_proj", mi, h));
                out.push(switch("down_proj", h, mi));
                out.push(linear(format!("{m}.shared_expert.gate_proj"), si, h));
                out.push(linear(format!("{m}.shared_expert.up_proj"), si, h));
                out.push(linear(format!("{m}.shared_expert.down_proj"), h, si));
                out.push(linear(format!("{m}.shared_expert_gate"), 1, h));
            }
        }
    }
    out
}

fn check_float(headers: &BTreeMap<String, Header>, name: &str, shape: &[usize]) -> Result<()> {
    let header = headers
        .get(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
    if !matches!(header.dtype.as_str(), "F32" | "F16" | "BF16") {
        return Err(ModelError::Dtype {
            name: name.to_owned(),
            found: header.dtype.clone(),
            expected: "F32, F16 or BF16",
        });
    }
    if header.shape != shape {
        return Err(ModelError::Shape {
            name: name.to_owned(),
            found: header.shape.clone(),
            expected: shape.to_vec(),
        });
    }
    Ok(())
}

fn check_linear(
    config: &ModelConfig,
    headers: &BTreeMap<String, Header>,
    path: &str,
    lead: &[usize],
    out: usize,
    inp: usize,
    used: &mut BTreeSet<String>,
) -> Result<()> {
    let with = |last: usize| [lead, &[out, last]].concat();
    let weight = format!("{path}.weight");
    let scales = format!("{path}.scales");
    if !headers.contains_key(&scales) {
        check_float(headers, &weight, &with(inp))?;
        used.insert(weight);
        return Ok(());
    }
    let params = config.quantization.for_module(path).ok_or_else(|| {
        ModelError::UnexpectedTensor(format!("{scales} (config.json does not quantize {path})"))
    })?;
    let packed = headers
        .get(&weight)
        .ok_or_else(|| ModelError::MissingTensor(weight.clone()))?;
    if packed.dtype != "U32" {
        return Err(ModelError::Dtype {
            name: weight,
            found: packed.dtype.clone(),
            expected: "U32 (packed quantized weights)",
        });
    }
    let packed_in = inp * params.bits / 32;
    if packed.shape != with(packed_in) {
        return Err(ModelError::Shape {
            name: weight,
            found: packed.shape.clone(),
            expected: with(packed_in),
        });
    }
    let biases = format!("{path}.biases");
    check_float(headers, &scales, &with(inp / params.group_size))?;
    check_float(headers, &biases, &with(inp / params.group_size))?;
    used.extend([weight, scales, biases]);
    Ok(())
}
