//! Helpers shared by the hub's integration tests.

pub mod fake_hub;
pub mod fixture;
