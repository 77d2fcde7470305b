//! Checks that a model folder can be used, with reasons instead of panics:
//! the same validation loading does, without allocating the weights.

use crate::chat_template::{self, Message};
use crate::tokenizer::TextTokenizer;
use flashbar_models::config::Architecture;
use flashbar_models::Model;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// Runs every check on a target folder; all of them, even after a failure.
pub fn check_target(dir: &Path) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut add = |check, result: Result<String, String>| {
        let (ok, detail) = match result {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        findings.push(Finding { check, ok, detail });
    };
    if !dir.is_dir() {
        add("folder", Err(format!("{} is not a folder", dir.display())));
        return findings;
    }
    add(
        "weights",
        Model::check(dir)
            .map(|(config, checkpoint)| {
                let t = &config.text;
                let kind = match config.architecture {
                    Architecture::Dense => "dense".to_owned(),
                    Architecture::Moe => {
                        format!("MoE {}x top-{}", t.num_experts, t.num_experts_per_tok)
                    }
                };
                let quant = match config.quantization.default {
                    Some(q) => format!("{}-bit (group {})", q.bits, q.group_size),
                    None => "unquantized".to_owned(),
                };
                let mixed = mixed_bits(&config.quantization);
                let mut detail = format!(
                    "{kind}, {} layers, hidden {}, vocab {}, {quant}{mixed}, {} tensors checked",
                    t.num_hidden_layers,
                    t.hidden_size,
                    t.vocab_size,
                    checkpoint.tensors.len()
                );
                // Vision tower and MTP head: in the download, not loaded
                // (docs/checkpoints.md).
                if let Some(note) = checkpoint.skipped.note() {
                    detail.push_str("; ");
                    detail.push_str(&note);
                }
                detail
            })
            .map_err(|e| e.to_string()),
    );
    match TextTokenizer::load(dir) {
        Ok(tokenizer) => {
            add(
                "tokenizer",
                if tokenizer.eos_ids().is_empty() {
                    Err("no end-of-sequence token (eos_token / eos_token_id)".into())
                } else {
                    Ok(format!(
                        "{} tokens, eos {:?}",
                        tokenizer.vocab_size(),
                        tokenizer.eos_ids()
                    ))
                },
            );
            let probe = [Message::new("user", "hello")];
            add(
                "chat template",
                match tokenizer.chat_template() {
                    None => Err("none (plain prompts only)".into()),
                    Some(template) => chat_template::render(template, &probe, true)
                        .map(|text| format!("renders ({} bytes for one message)", text.len()))
                        .map_err(|e| e.to_string()),
                },
            );
        }
        Err(error) => add("tokenizer", Err(error.to_string())),
    }
    findings
}

/// ", N modules at other settings" when the config overrides some modules'
/// quantization (mlx-lm's 8-bit MoE router gates), else "".
fn mixed_bits(quantization: &flashbar_models::config::Quantization) -> String {
    let others = quantization
        .overrides
        .values()
        .filter(|params| **params != quantization.default)
        .count();
    match others {
        0 => String::new(),
        n => format!(", {n} modules at other settings"),
    }
}

/// Whether a drafter folder fits the target folder, and why not.
pub fn check_drafter(target_dir: &Path, drafter_dir: &Path) -> Finding {
    let result = if !drafter_dir.is_dir() {
        Err(format!("{} is not a folder", drafter_dir.display()))
    } else {
        Model::check(target_dir)
            .map_err(|e| format!("the target cannot be checked: {e}"))
            .and_then(|(target, _)| {
                flashbar_models::Drafter::check(drafter_dir, &target).map_err(|e| e.to_string())
            })
            .map(|(c, checkpoint)| {
                format!(
                    "{} layers, block {}, taps {:?}, mask token {}, {} tensors",
                    c.num_hidden_layers,
                    c.block_size,
                    c.target_layer_ids,
                    c.mask_token_id,
                    checkpoint.tensors.len()
                )
            })
    };
    let (ok, detail) = match result {
        Ok(detail) => (true, detail),
        Err(detail) => (false, detail),
    };
    Finding {
        check: "drafter",
        ok,
        detail,
    }
}
