//! Model and drafter `config.json` parsing: any text must give a config or
//! a one-line error, never a panic, and an accepted config must be usable
//! by what loading does next (derived sizes, the tensor list it implies,
//! the drafter's fit to a target) without panicking or running away.
//!
//! Input: a target config, optionally a NUL byte and a drafter config (with
//! no NUL, the same text is tried as both).
#![no_main]

use flashbar_models::config::ModelConfig;
use flashbar_models::spec;
use flashbar_models::DrafterConfig;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

fuzz_target!(|data: &[u8]| {
    let (target_bytes, drafter_bytes) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, data),
    };
    let target = std::str::from_utf8(target_bytes)
        .ok()
        .map(ModelConfig::parse);
    if let Some(Ok(config)) = &target {
        let t = &config.text;
        let _ = (t.head_dim(), t.key_dim(), t.value_dim(), t.conv_dim());
        for layer in 0..t.num_hidden_layers {
            let _ = t.is_linear_layer(layer);
        }
        let _ = config.quantization.for_module("model.embed_tokens");
        // Loading compares the headers with the tensors the config needs:
        // with no tensors it must say which one is missing.
        let missing = spec::check(config, &BTreeMap::new()).unwrap_err();
        assert!(!missing.to_string().contains('\n'));
    } else if let Some(Err(error)) = &target {
        let text = format!("{error:?}");
        assert!(!text.is_empty());
    }
    if let Ok(text) = std::str::from_utf8(drafter_bytes) {
        match DrafterConfig::parse(text) {
            Ok(drafter) => {
                assert_eq!(drafter.layer_kinds.len(), drafter.num_hidden_layers);
                for layer in 0..drafter.num_hidden_layers {
                    let _ = (drafter.window(layer), drafter.causal(layer));
                }
                let _ = drafter.quant_of("layers.0.mlp.up_proj");
                if let Some(Ok(config)) = &target {
                    if let Err(reason) = drafter.check_target(config) {
                        assert!(!reason.contains('\n'), "{reason}");
                    }
                }
            }
            Err(reason) => assert!(!reason.contains('\n'), "{reason}"),
        }
    }
});
