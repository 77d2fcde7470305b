//! Where MLX computes, decided in one place.
//!
//! Order of preference: Metal (macOS), then CUDA when the linked MLX library
//! has it and sees a GPU, else the CPU. `FLASHBAR_DEVICE=auto|cpu|gpu`
//! overrides it. A GPU device is never handed to MLX unless the library
//! reports one: `Device::gpu()` on a CPU-only libmlx aborts inside MLX.

use mlx_rs::Device;
use std::fmt;
use std::str::FromStr;

/// The environment variable that overrides the automatic choice.
pub const DEVICE_ENV: &str = "FLASHBAR_DEVICE";

/// A compute backend MLX can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

impl Backend {
    /// The MLX device for this backend.
    pub fn device(self) -> Device {
        match self {
            Backend::Cpu => Device::cpu(),
            Backend::Cuda | Backend::Metal => Device::gpu(),
        }
    }

    pub fn is_gpu(self) -> bool {
        self != Backend::Cpu
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Metal => "metal",
        })
    }
}

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Auto,
    Cpu,
    Gpu,
}

impl FromStr for Request {
    type Err = DeviceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Request::Auto),
            "cpu" => Ok(Request::Cpu),
            "gpu" | "cuda" | "metal" => Ok(Request::Gpu),
            _ => Err(DeviceError::UnknownRequest(text.to_owned())),
        }
    }
}

/// GPU backends the linked MLX library reports as usable right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub metal: bool,
    pub cuda: bool,
}

impl Capabilities {
    /// Asks the linked library. Both calls are safe on every build of MLX.
    pub fn probe() -> Self {
        crate::install_mlx_error_handler();
        let mut metal = false;
        let mut cuda = false;
        // SAFETY: each call only writes the bool it is given.
        let metal_ok = unsafe { mlx_sys::mlx_metal_is_available(&mut metal) } == 0;
        let cuda_ok = unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) } == 0;
        Capabilities {
            metal: metal_ok && metal,
            cuda: cuda_ok && cuda,
        }
    }

    /// The GPU backend to use, Metal first.
    pub fn gpu(self) -> Option<Backend> {
        if self.metal {
            Some(Backend::Metal)
        } else if self.cuda {
            Some(Backend::Cuda)
        } else {
            None
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    #[error("{DEVICE_ENV}={0:?} is not one of auto, cpu, gpu")]
    UnknownRequest(String),
    #[error(
        "{DEVICE_ENV}=gpu, but the linked MLX library ({0}) reports no usable GPU; \
         use FLASHBAR_DEVICE=cpu or build with the cuda feature on a machine with an NVIDIA GPU"
    )]
    NoGpu(&'static str),
}

/// Pure decision: the request and what the library offers.
pub fn resolve(request: Request, capabilities: Capabilities) -> Result<Backend, DeviceError> {
    match (request, capabilities.gpu()) {
        (Request::Cpu, _) => Ok(Backend::Cpu),
        (Request::Auto, gpu) => Ok(gpu.unwrap_or(Backend::Cpu)),
        (Request::Gpu, Some(gpu)) => Ok(gpu),
        (Request::Gpu, None) => Err(DeviceError::NoGpu(mlx_sys::MLX_LIBRARY)),
    }
}

/// Reads the override from the environment and probes the library.
pub fn choose() -> Result<Backend, DeviceError> {
    let request = match std::env::var(DEVICE_ENV) {
        Ok(text) => text.parse()?,
        Err(_) => Request::Auto,
    };
    resolve(request, Capabilities::probe())
}

/// The backend of MLX's current default device (a `with_device` scope included).
pub fn current() -> Backend {
    let gpu = Device::try_default()
        .and_then(|d| d.get_type())
        .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Gpu));
    match (gpu, mlx_sys::MLX_LIBRARY) {
        (false, _) => Backend::Cpu,
        (true, "cuda") => Backend::Cuda,
        (true, _) => Backend::Metal,
    }
}

/// MLX's CUDA backend multiplies f32 matrices in TF32 unless this is "0".
pub const TF32_ENV: &str = "MLX_ENABLE_TF32";

/// Chooses the backend and makes it MLX's default device for this process.
///
/// On CUDA it also turns TF32 off (unless the user set it): a TF32 GEMM for a
/// multi-token verify rounds differently from a one-token decode step, and
/// on the H200 that flipped sampled and near-tie tokens, breaking DFlash's
/// promise of plain decoding's exact output; in full f32 both paths agreed.
pub fn activate() -> Result<Backend, DeviceError> {
    let backend = choose()?;
    if backend == Backend::Cuda && std::env::var_os(TF32_ENV).is_none() {
        // Before any MLX work, while the process has one thread.
        std::env::set_var(TF32_ENV, "0");
    }
    Device::set_default(&backend.device());
    Ok(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Capabilities = Capabilities {
        metal: false,
        cuda: false,
    };
    const CUDA: Capabilities = Capabilities {
        metal: false,
        cuda: true,
    };
    const METAL: Capabilities = Capabilities {
        metal: true,
        cuda: false,
    };

    #[test]
    fn auto_prefers_a_gpu_and_falls_back_to_cpu() {
        assert_eq!(resolve(Request::Auto, METAL), Ok(Backend::Metal));
        assert_eq!(resolve(Request::Auto, CUDA), Ok(Backend::Cuda));
        assert_eq!(resolve(Request::Auto, NONE), Ok(Backend::Cpu));
    }

    #[test]
    fn cpu_request_wins_even_with_a_gpu() {
        assert_eq!(resolve(Request::Cpu, CUDA), Ok(Backend::Cpu));
    }

    #[test]
    fn gpu_request_without_gpu_is_an_error_not_a_crash() {
        let error = resolve(Request::Gpu, NONE).unwrap_err();
        assert!(matches!(error, DeviceError::NoGpu(_)));
        assert!(error.to_string().contains("no usable GPU"));
    }

    #[test]
    fn requests_parse_case_insensitively() {
        assert_eq!("GPU".parse(), Ok(Request::Gpu));
        assert_eq!(" cpu ".parse(), Ok(Request::Cpu));
        assert_eq!("".parse(), Ok(Request::Auto));
        assert!("tpu".parse::<Request>().is_err());
    }

    #[test]
    fn the_probe_matches_the_linked_library() {
        let capabilities = Capabilities::probe();
        if mlx_sys::MLX_LIBRARY == "cpu" {
            assert_eq!(capabilities, NONE, "a CPU-only libmlx must report no GPU");
        }
    }
}
