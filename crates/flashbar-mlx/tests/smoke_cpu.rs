//! The MLX layer works on the CPU: every smoke check passes against its
//! independent reference.

use flashbar_mlx::device::Backend;
use flashbar_mlx::smoke;

#[test]
fn every_smoke_check_passes_on_cpu() {
    let scratch = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    let results = smoke::run_all(Backend::Cpu, scratch.path(), &mut |c| seen.push(c.name)).unwrap();
    // Each result reaches the caller as it is known, in order.
    assert_eq!(seen, results.iter().map(|c| c.name).collect::<Vec<_>>());
    let names: Vec<_> = results.iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        [
            "matmul_f32",
            "quantize_4bit",
            "quantized_matmul_4bit",
            "gather_qmm_4bit",
            "safetensors_round_trip",
            "half_round_trip"
        ]
    );
    for result in &results {
        assert!(result.passed(), "{result:?}");
        assert!(!result.output.is_empty(), "{} kept no output", result.name);
    }
}

#[test]
fn the_seeded_inputs_are_stable_and_spread() {
    let values = smoke::seeded_values(7, 10_000);
    assert_eq!(values, smoke::seeded_values(7, 10_000));
    assert_ne!(values, smoke::seeded_values(8, 10_000));
    assert!(values.iter().all(|v| (-1.0..1.0).contains(v)));
    let mean = values.iter().sum::<f32>() / values.len() as f32;
    assert!(mean.abs() < 0.05, "mean {mean}");
}

#[test]
fn relative_difference_sees_a_changed_output() {
    let a = [1.0, -2.0, 4.0];
    assert_eq!(smoke::relative_difference(&a, &a), Some(0.0));
    assert_eq!(
        smoke::relative_difference(&a, &[1.0, -2.0, 5.0]),
        Some(0.25)
    );
    assert_eq!(smoke::relative_difference(&a, &[1.0]), None);
}
