//! Whether a pair fits in the memory it will run from: the measure lives in
//! [`flashbar_mlx::memory`] (the engine refuses a load with it too); the
//! doctor and the catalogue read it from here.

pub use flashbar_mlx::memory::{budget, required_bytes, MemoryBudget};
