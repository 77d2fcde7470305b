//! The machine's thermal state, behind one trait.
//!
//! - macOS: `NSProcessInfo.thermalState` (coarse: GPU work can slow down a
//!   lot while it still reads nominal, which is why the gate trusts measured
//!   throughput first and treats a state change only as a reason to
//!   recalibrate);
//! - Linux: the hottest `/sys/class/thermal` zone and how far the CPUs run
//!   below their top frequency (cpufreq); `Unknown` when neither exists;
//! - a scripted source for tests.

use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum ThermalState {
    Nominal,
    Fair,
    Serious,
    Critical,
    /// The platform offers no reading.
    Unknown,
}

pub trait ThermalSource: Send {
    /// The state now (sources may cache a reading for a short while).
    fn state(&mut self) -> ThermalState;
}

/// The best source for this platform.
pub fn system_source() -> Box<dyn ThermalSource> {
    #[cfg(target_os = "macos")]
    {
        Box::new(macos::ProcessInfoThermal)
    }
    #[cfg(not(target_os = "macos"))]
    {
        Box::new(Throttled::new(
            SysfsThermal::new("/sys"),
            Duration::from_secs(1),
        ))
    }
}

/// Replays a list of states, one per call, repeating the last.
pub struct ScriptedThermal {
    states: Vec<ThermalState>,
    next: usize,
}

impl ScriptedThermal {
    pub fn new(states: Vec<ThermalState>) -> Self {
        ScriptedThermal { states, next: 0 }
    }
}

impl ThermalSource for ScriptedThermal {
    fn state(&mut self) -> ThermalState {
        let state = self
            .states
            .get(self.next.min(self.states.len().saturating_sub(1)))
            .copied()
            .unwrap_or(ThermalState::Unknown);
        self.next += 1;
        state
    }
}

/// Reads an inner source at most once per `period` (sysfs reads cost a few
/// syscalls, and rounds can be sub-millisecond).
pub struct Throttled<S> {
    inner: S,
    period: Duration,
    last: Option<(Instant, ThermalState)>,
}

impl<S: ThermalSource> Throttled<S> {
    pub fn new(inner: S, period: Duration) -> Self {
        Throttled {
            inner,
            period,
            last: None,
        }
    }
}

impl<S: ThermalSource> ThermalSource for Throttled<S> {
    fn state(&mut self) -> ThermalState {
        match self.last {
            Some((at, state)) if at.elapsed() < self.period => state,
            _ => {
                let state = self.inner.state();
                self.last = Some((Instant::now(), state));
                state
            }
        }
    }
}

/// Linux sysfs: thermal zones (millidegrees C) and cpufreq scaling.
pub struct SysfsThermal {
    root: std::path::PathBuf,
}

impl SysfsThermal {
    /// `root` is `/sys` (tests point it at a fake tree).
    pub fn new(root: impl Into<std::path::PathBuf>) -> Self {
        SysfsThermal { root: root.into() }
    }

    fn hottest_zone_celsius(&self) -> Option<f64> {
        let zones = std::fs::read_dir(self.root.join("class/thermal")).ok()?;
        zones
            .flatten()
            .filter(|z| z.file_name().to_string_lossy().starts_with("thermal_zone"))
            .filter_map(|z| read_number(&z.path().join("temp")))
            .map(|milli| milli / 1000.0)
            .filter(|c| (-40.0..200.0).contains(c)) // drop bogus sensors
            .reduce(f64::max)
    }

    /// The lowest current/max frequency ratio over CPUs (1 = full speed).
    fn slowest_cpu_ratio(&self) -> Option<f64> {
        let cpus = std::fs::read_dir(self.root.join("devices/system/cpu")).ok()?;
        cpus.flatten()
            .filter_map(|cpu| {
                let freq = cpu.path().join("cpufreq");
                let current = read_number(&freq.join("scaling_cur_freq"))?;
                let max = read_number(&freq.join("cpuinfo_max_freq"))
                    .or_else(|| read_number(&freq.join("scaling_max_freq")))?;
                (max > 0.0).then_some(current / max)
            })
            .reduce(f64::min)
    }
}

impl ThermalSource for SysfsThermal {
    fn state(&mut self) -> ThermalState {
        let by_temperature = self.hottest_zone_celsius().map(|c| match c {
            c if c >= 95.0 => ThermalState::Critical,
            c if c >= 85.0 => ThermalState::Serious,
            c if c >= 75.0 => ThermalState::Fair,
            _ => ThermalState::Nominal,
        });
        // A CPU held well under its top clock is throttled (or saving power:
        // either way, measured speeds no longer hold).
        let by_clock = self.slowest_cpu_ratio().map(|r| match r {
            r if r < 0.4 => ThermalState::Serious,
            r if r < 0.7 => ThermalState::Fair,
            _ => ThermalState::Nominal,
        });
        match (by_temperature, by_clock) {
            (Some(a), Some(b)) => a.max(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => ThermalState::Unknown,
        }
    }
}

fn read_number(path: &std::path::Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(target_os = "macos")]
mod macos {
    use super::{ThermalSource, ThermalState};
    use objc2_foundation::{NSProcessInfo, NSProcessInfoThermalState};

    /// Reads `NSProcessInfo.processInfo.thermalState` (one message send, so
    /// it is read every round rather than through the change notification:
    /// the gate only acts between rounds anyway).
    pub struct ProcessInfoThermal;

    impl ThermalSource for ProcessInfoThermal {
        fn state(&mut self) -> ThermalState {
            let state = NSProcessInfo::processInfo().thermalState();
            if state == NSProcessInfoThermalState::Nominal {
                ThermalState::Nominal
            } else if state == NSProcessInfoThermalState::Fair {
                ThermalState::Fair
            } else if state == NSProcessInfoThermalState::Serious {
                ThermalState::Serious
            } else if state == NSProcessInfoThermalState::Critical {
                ThermalState::Critical
            } else {
                ThermalState::Unknown
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn fake_sys(zones: &[&str], cpus: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (i, temp) in zones.iter().enumerate() {
            let zone = root.path().join(format!("class/thermal/thermal_zone{i}"));
            fs::create_dir_all(&zone).unwrap();
            fs::write(zone.join("temp"), temp).unwrap();
        }
        for (i, (current, max)) in cpus.iter().enumerate() {
            let freq = root
                .path()
                .join(format!("devices/system/cpu/cpu{i}/cpufreq"));
            fs::create_dir_all(&freq).unwrap();
            fs::write(freq.join("scaling_cur_freq"), current).unwrap();
            fs::write(freq.join("cpuinfo_max_freq"), max).unwrap();
        }
        root
    }

    #[test]
    fn reads_the_hottest_zone() {
        let sys = fake_sys(&["45000\n", "88000\n"], &[]);
        assert_eq!(SysfsThermal::new(sys.path()).state(), ThermalState::Serious);
        let sys = fake_sys(&["50000"], &[]);
        assert_eq!(SysfsThermal::new(sys.path()).state(), ThermalState::Nominal);
    }

    #[test]
    fn a_throttled_clock_raises_the_state() {
        let sys = fake_sys(
            &["50000"],
            &[("3000000", "3000000"), ("1500000", "3000000")],
        );
        assert_eq!(SysfsThermal::new(sys.path()).state(), ThermalState::Fair);
    }

    #[test]
    fn nothing_readable_is_unknown_not_an_error() {
        let sys = fake_sys(&["garbage"], &[]);
        assert_eq!(SysfsThermal::new(sys.path()).state(), ThermalState::Unknown);
        assert_eq!(
            SysfsThermal::new("/nonexistent").state(),
            ThermalState::Unknown
        );
    }

    #[test]
    fn scripted_repeats_its_last_state() {
        let mut s = ScriptedThermal::new(vec![ThermalState::Nominal, ThermalState::Serious]);
        let seen: Vec<_> = (0..4).map(|_| s.state()).collect();
        assert_eq!(seen[0], ThermalState::Nominal);
        assert!(seen[1..].iter().all(|&t| t == ThermalState::Serious));
    }

    #[test]
    fn throttling_reuses_a_recent_reading() {
        let scripted = ScriptedThermal::new(vec![ThermalState::Nominal, ThermalState::Critical]);
        let mut throttled = Throttled::new(scripted, Duration::from_secs(60));
        assert_eq!(throttled.state(), ThermalState::Nominal);
        assert_eq!(throttled.state(), ThermalState::Nominal);
    }
}
