//! `flashbar smoke`: runs the MLX smoke checks on the CPU and, when the
//! linked library offers one, on the GPU, and compares the two.

use anyhow::Context;
use flashbar_mlx::device::{self, Backend, Capabilities};
use flashbar_mlx::smoke::{self, CheckResult};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct SmokeArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Report {
    mlx_version: &'static str,
    mlx_library: &'static str,
    chosen_device: Backend,
    runs: Vec<DeviceRun>,
    /// Per check: relative difference of the GPU output from the CPU output.
    cross_device: Vec<CrossDevice>,
    passed: bool,
}

#[derive(serde::Serialize)]
struct DeviceRun {
    backend: Backend,
    checks: Vec<CheckLine>,
}

#[derive(serde::Serialize)]
struct CheckLine {
    name: &'static str,
    max_error: f64,
    tolerance: f64,
    passed: bool,
}

#[derive(serde::Serialize)]
struct CrossDevice {
    name: &'static str,
    relative_difference: f64,
    tolerance: f64,
    passed: bool,
}

pub fn run(args: SmokeArgs) -> anyhow::Result<ExitCode> {
    let chosen_device = device::choose()?;
    let mut backends = vec![Backend::Cpu];
    backends.extend(Capabilities::probe().gpu());

    let scratch = tempfile::tempdir().context("cannot create a scratch folder")?;
    let mut results: Vec<(Backend, Vec<CheckResult>)> = Vec::new();
    for backend in backends {
        // Progress on stderr (stdout carries the table or the JSON).
        let mut progress = |c: &CheckResult| {
            eprintln!("smoke: {backend} {} {}", c.name, verdict(c.passed()));
        };
        let mut checks = smoke::run_all(backend, scratch.path(), &mut progress)
            .with_context(|| format!("MLX failed on {backend}"))?;
        // The models' own GPU checks (the fused gated-delta layer), last so
        // that the checks both devices run line up.
        if backend != Backend::Cpu {
            let layer = mlx_rs::with_device(backend.device(), || {
                if flashbar_models::nn::gated_delta_checks::available() {
                    flashbar_models::nn::gated_delta_checks::smoke_checks()
                } else {
                    Ok(Vec::new())
                }
            })
            .with_context(|| format!("the gated-delta layer checks failed on {backend}"))?;
            checks.extend(layer);
        }
        results.push((backend, checks));
    }

    let cross_device = match results.as_slice() {
        [(_, cpu), (_, gpu)] => compare(cpu, gpu),
        _ => Vec::new(),
    };
    let runs: Vec<DeviceRun> = results
        .iter()
        .map(|(backend, checks)| DeviceRun {
            backend: *backend,
            checks: checks.iter().map(line).collect(),
        })
        .collect();
    let passed = runs.iter().flat_map(|r| &r.checks).all(|c| c.passed)
        && cross_device.iter().all(|c| c.passed);
    let (mlx_version, mlx_library) = flashbar_mlx::library();
    let report = Report {
        mlx_version,
        mlx_library,
        chosen_device,
        runs,
        cross_device,
        passed,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn line(result: &CheckResult) -> CheckLine {
    CheckLine {
        name: result.name,
        max_error: result.max_error,
        tolerance: result.tolerance,
        passed: result.passed(),
    }
}

fn compare(cpu: &[CheckResult], gpu: &[CheckResult]) -> Vec<CrossDevice> {
    cpu.iter()
        .zip(gpu)
        .map(|(c, g)| {
            let difference =
                smoke::relative_difference(&c.output, &g.output).unwrap_or(f64::INFINITY);
            let tolerance = c.cross_device_tolerance.max(g.cross_device_tolerance);
            CrossDevice {
                name: c.name,
                relative_difference: difference,
                tolerance,
                passed: difference <= tolerance,
            }
        })
        .collect()
}

fn print_table(report: &Report) {
    println!(
        "MLX {} ({} library), default device: {}",
        report.mlx_version, report.mlx_library, report.chosen_device
    );
    for run in &report.runs {
        for check in &run.checks {
            println!(
                "{:<5} {:<24} error {:<10.3e} tolerance {:<9.1e} {}",
                run.backend.to_string(),
                check.name,
                check.max_error,
                check.tolerance,
                verdict(check.passed)
            );
        }
    }
    for check in &report.cross_device {
        println!(
            "gpu~cpu {:<22} rel.diff {:<10.3e} tolerance {:<9.1e} {}",
            check.name,
            check.relative_difference,
            check.tolerance,
            verdict(check.passed)
        );
    }
    println!("smoke: {}", verdict(report.passed));
}

fn verdict(passed: bool) -> &'static str {
    if passed {
        "ok"
    } else {
        "FAILED"
    }
}
