//! Linear maps whose weights are plain floats or MLX affine-quantized
//! (`weight` packed in u32 + `scales` + `biases`), chosen per module by what
//! the checkpoint holds; on the CPU, a small model's weights are unpacked
//! once at load (bf16 values as bf16, others as f32) and multiplied by the
//! row-invariant kernels of
//! [`crate::nn::host`] (docs/cpu.md).

use crate::config::{QuantParams, Quantization};
use crate::error::{ModelError, Result};
use crate::nn::host::{self, ColumnSum, HostMatrix};
use flashbar_mlx::device::{self, Backend};
use flashbar_mlx::row_invariant;
use mlx_rs::ops::{dequantize, gather_mm, gather_qmm, matmul, quantized_matmul};
use mlx_rs::{Array, Dtype};
use std::collections::HashMap;

/// A model past [`HOST_LIMIT_BYTES`] on the CPU: from this many rows on,
/// it multiplies by the dequantized weight (one BLAS gemm) instead of MLX's
/// quantized kernel, whose cost there grows with every row (a 2,000-token
/// prefill: seconds per layer against tens of milliseconds). Above the
/// largest verify block on purpose: decode and verify keep the quantized
/// kernel, whose rows do not depend on how many there are, so a verified
/// block still equals decoding it token by token; only prefill (shared by
/// every mode) takes the gemm.
pub const CPU_GEMM_FROM_ROWS: i32 = 64;

/// The most f32 bytes a checkpoint may unpack to for the CPU's host
/// kernels (the embedded pair: 55 MB; a 0.3B model: 1.2 GB). Larger models
/// keep MLX's kernels: memory over speed.
pub const HOST_LIMIT_BYTES: u64 = 2 << 30;

/// Chooses the CPU's matmul path: `auto` (host when the model fits
/// [`HOST_LIMIT_BYTES`]), `host`, or `mlx` (MLX's kernels; benchmarks
/// compare the two).
pub const CPU_MATMUL_ENV: &str = "FLASHBAR_CPU_MATMUL";

/// `mlx` makes CUDA decode steps and verifies use MLX's own quantized matmul
/// and attention instead of the row-invariant kernels
/// ([`flashbar_mlx::row_invariant`]); benchmarks compare the two. MLX's
/// kernels are not row-invariant there, so DFlash is then not guaranteed
/// lossless on CUDA.
pub const GPU_KERNELS_ENV: &str = "FLASHBAR_GPU_KERNELS";

/// Whether this device's decode and verify run on the row-invariant kernels
/// (CUDA, unless [`GPU_KERNELS_ENV`] is `mlx`).
pub fn row_kernels() -> bool {
    row_invariant::available(device::current())
        && std::env::var(GPU_KERNELS_ENV).as_deref() != Ok("mlx")
}

/// Whether decode steps and verifies multiply quantized maps by the
/// row-invariant kernel: [`row_kernels`], unless [`GPU_KERNELS_ENV`] is
/// `mlx-qmm` (MLX's quantized matmul alone, every other kernel ours:
/// benchmarks isolate the matmul's share of a step; not lossless on CUDA).
pub fn row_qmm() -> bool {
    row_kernels() && std::env::var(GPU_KERNELS_ENV).as_deref() != Ok("mlx-qmm")
}

/// Who multiplies a checkpoint's weights (and, for attention, its scores).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPath {
    /// MLX: the GPU, and large models on the CPU.
    Mlx,
    /// [`crate::nn::host`] over f32 weights unpacked at load: the CPU, where
    /// MLX's quantized kernel costs 10-20x more for 16 rows than for one
    /// and its BLAS products are not row-invariant.
    Host,
}

/// The loaded tensors, handed out once each by name.
pub struct Weights {
    arrays: HashMap<String, Array>,
    quantization: Quantization,
    path: MatmulPath,
}

impl Weights {
    /// The tensors of one checkpoint, with the matmul path chosen for this
    /// device and their size ([`MatmulPath`]).
    pub fn new(arrays: HashMap<String, Array>, quantization: Quantization) -> Self {
        let mut weights = Weights {
            arrays,
            quantization,
            path: MatmulPath::Mlx,
        };
        weights.path = weights.choose_path();
        weights
    }

    pub fn matmul_path(&self) -> MatmulPath {
        self.path
    }

    /// Whether attention and the gated-delta recurrence run on the host
    /// kernels: on the CPU whatever the model's size (they need no unpacked
    /// weights), unless `FLASHBAR_CPU_MATMUL=mlx`.
    pub fn host_kernels(&self) -> bool {
        device::current() == Backend::Cpu && std::env::var(CPU_MATMUL_ENV).as_deref() != Ok("mlx")
    }

    fn choose_path(&self) -> MatmulPath {
        if !self.host_kernels() {
            return MatmulPath::Mlx;
        }
        match std::env::var(CPU_MATMUL_ENV).as_deref() {
            Ok("host") => MatmulPath::Host,
            _ if self.unpacked_bytes() <= HOST_LIMIT_BYTES => MatmulPath::Host,
            _ => MatmulPath::Mlx,
        }
    }

    /// f32 bytes of every tensor unpacked (a quantized weight from its
    /// scales: one per group; packed words and biases not counted).
    fn unpacked_bytes(&self) -> u64 {
        self.arrays
            .iter()
            .map(|(name, array)| match name.strip_suffix(".scales") {
                Some(module) => self
                    .quantization
                    .for_module(module)
                    .map_or(0, |q| array.size() as u64 * q.group_size as u64 * 4),
                None if self.arrays.contains_key(&format!(
                    "{}.scales",
                    name.strip_suffix(".weight").unwrap_or(name)
                )) || name.ends_with(".biases") =>
                {
                    0
                }
                None => array.size() as u64 * 4,
            })
            .sum()
    }

    pub fn take(&mut self, name: &str) -> Result<Array> {
        self.arrays
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))
    }

    fn take_optional(&mut self, name: &str) -> Option<Array> {
        self.arrays.remove(name)
    }

    /// Quantization of module `path`, if the checkpoint stores it quantized.
    fn quant(&self, path: &str) -> Result<Option<QuantParams>> {
        if !self.arrays.contains_key(&format!("{path}.scales")) {
            return Ok(None);
        }
        self.quantization.for_module(path).map(Some).ok_or_else(|| {
            ModelError::UnexpectedTensor(format!("{path}.scales (the config does not quantize it)"))
        })
    }

    /// Names not taken by any module: a checkpoint that does not fit.
    pub fn leftover(&self) -> Option<&String> {
        self.arrays.keys().min()
    }
}

/// Packed affine-quantized weights.
pub struct Packed {
    pub weight: Array,
    pub scales: Array,
    pub biases: Array,
    pub group_size: i32,
    pub bits: i32,
    /// Few rows go through [`row_invariant::quantized_matmul`] ([`row_kernels`]).
    pub row_kernel: bool,
}

impl Packed {
    fn take(weights: &mut Weights, path: &str, params: QuantParams) -> Result<Self> {
        Ok(Packed {
            weight: weights.take(&format!("{path}.weight"))?,
            scales: weights.take(&format!("{path}.scales"))?,
            biases: weights.take(&format!("{path}.biases"))?,
            group_size: params.group_size as i32,
            bits: params.bits as i32,
            row_kernel: row_qmm(),
        })
    }
}

pub enum LinearWeight {
    Dense(Array),
    Quantized(Packed),
    /// For the host kernels: exactly the checkpoint's values (dequantized
    /// when packed; `dtype` is the type they came in), evaluated: bf16
    /// values stored bf16 by columns, summed as MLX's CPU kernel for them
    /// sums (its quantized matmul for packed ones, its gemm for the rest);
    /// others stored f32 by rows (docs/cpu.md, "Parity with mlx-lm").
    Host {
        weight: HostMatrix,
        dtype: Dtype,
    },
}

impl LinearWeight {
    /// `{path}.weight`, packed with `.scales` / `.biases` when quantized;
    /// unpacked for the host kernels when the checkpoint's path is
    /// [`MatmulPath::Host`] and `hostable`.
    fn load(weights: &mut Weights, path: &str, hostable: bool) -> Result<Self> {
        let loaded = match weights.quant(path)? {
            Some(params) => LinearWeight::Quantized(Packed::take(weights, path, params)?),
            None => LinearWeight::Dense(weights.take(&format!("{path}.weight"))?),
        };
        if !(hostable && weights.path == MatmulPath::Host) {
            return Ok(loaded);
        }
        let (values, dtype, sum) = match loaded {
            LinearWeight::Quantized(q) => (
                dequantize(&q.weight, &q.scales, &q.biases, q.group_size, q.bits)?,
                q.scales.dtype(),
                match host::arithmetic() {
                    host::Arithmetic::Mlx => ColumnSum::Bf16,
                    host::Arithmetic::F32 => ColumnSum::F32,
                },
            ),
            LinearWeight::Dense(w) => {
                let dtype = w.dtype();
                (w, dtype, ColumnSum::F32)
            }
            host => return Ok(host),
        };
        // bf16 values stay bf16 (they widen to f32 exactly in the kernels,
        // and a decode step reads half the bytes), by columns for MLX's
        // order of sums; others become f32, by rows.
        let weight = if dtype == Dtype::Bfloat16 {
            HostMatrix::columns(&values, sum)?
        } else {
            HostMatrix::rows(&values)?
        };
        Ok(LinearWeight::Host { weight, dtype })
    }

    /// `x W^T`.
    fn apply(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            LinearWeight::Dense(w) => matmul(x, w.t())?,
            LinearWeight::Host { weight, .. } => host::linear(x, weight)?,
            LinearWeight::Quantized(q) if prefers_gemm(x) => {
                // In f32, so the CPU's BLAS sgemm runs it whatever the dtype.
                let w = dequantize(&q.weight, &q.scales, &q.biases, q.group_size, q.bits)?
                    .as_dtype(Dtype::Float32)?;
                matmul(x.as_dtype(Dtype::Float32)?, w.t())?.as_dtype(x.dtype())?
            }
            LinearWeight::Quantized(q)
                if q.row_kernel
                    && row_invariant::takes_quantized(x, &q.scales, q.group_size, q.bits) =>
            {
                row_invariant::quantized_matmul(
                    x,
                    &q.weight,
                    &q.scales,
                    &q.biases,
                    q.group_size,
                    q.bits,
                )?
            }
            LinearWeight::Quantized(q) => quantized_matmul(
                x,
                &q.weight,
                &q.scales,
                &q.biases,
                true,
                q.group_size,
                q.bits,
            )?,
        })
    }
}

/// Whether `x` has enough rows for the CPU's dequantize-then-gemm path.
fn prefers_gemm(x: &Array) -> bool {
    let shape = x.shape();
    let rows: i32 = shape[..shape.len().saturating_sub(1)].iter().product();
    rows >= CPU_GEMM_FROM_ROWS && device::current() == Backend::Cpu
}

/// `y = x W^T (+ b)`.
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Array>,
}

impl Linear {
    pub fn load(weights: &mut Weights, path: &str) -> Result<Self> {
        let weight = LinearWeight::load(weights, path, true)?;
        let bias = weights.take_optional(&format!("{path}.bias"));
        Ok(Linear { weight, bias })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.weight.apply(x)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }
}

/// Several linear maps of one input (a layer's q/k/v, its gate and up
/// projections). On the host path their weights are stacked at load and
/// multiplied as one product: one read of the input and one hand-over from
/// MLX instead of one per map, the values bit for bit those of the maps
/// one by one (`host::linear_split`). Elsewhere each map runs on its own.
pub struct Fused {
    parts: Vec<Linear>,
    /// The stacked weights and each map's width, on the host path.
    host: Option<(HostMatrix, Vec<i32>)>,
}

impl Fused {
    pub fn load(weights: &mut Weights, paths: &[String]) -> Result<Self> {
        let parts = paths
            .iter()
            .map(|path| Linear::load(weights, path))
            .collect::<Result<Vec<_>>>()?;
        let stackable: Option<Vec<&HostMatrix>> = parts
            .iter()
            .map(|part| match (&part.weight, &part.bias) {
                (LinearWeight::Host { weight, .. }, None) => Some(weight),
                _ => None,
            })
            .collect();
        // Maps summed alike only (a checkpoint may pack some and not others).
        let stacked = match stackable.filter(|s| s.len() > 1) {
            Some(stack) => HostMatrix::stack(&stack)?,
            None => None,
        };
        let Some(weight) = stacked else {
            return Ok(Fused { parts, host: None });
        };
        let cols = stack_widths(&parts);
        Ok(Fused {
            parts: Vec::new(),
            host: Some((weight, cols)),
        })
    }

    /// Whether the maps are one host product (the CPU path), so that
    /// stacking rows of several inputs costs one hand-over, not several.
    pub fn is_host(&self) -> bool {
        self.host.is_some()
    }

    /// Map `i` alone (all of them on the host path, where they are one
    /// product).
    pub fn forward_one(&self, i: usize, x: &Array) -> Result<Array> {
        match self.parts.get(i) {
            Some(part) if self.host.is_none() => part.forward(x),
            _ => self.forward(x)?.into_iter().nth(i).ok_or_else(|| {
                mlx_rs::error::Exception::custom(format!("no map {i} in a fused linear")).into()
            }),
        }
    }

    /// Each map of `x`, in the order of the paths it was loaded from.
    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match &self.host {
            Some((weight, cols)) => host::linear_split(x, weight, cols),
            None => self.parts.iter().map(|part| part.forward(x)).collect(),
        }
    }
}

/// Each map's output width.
fn stack_widths(parts: &[Linear]) -> Vec<i32> {
    parts
        .iter()
        .map(|part| match &part.weight {
            LinearWeight::Host { weight, .. } => weight.n as i32,
            _ => 0,
        })
        .collect()
}

/// Token embedding; also the output head when the model ties them.
pub struct Embedding {
    weight: LinearWeight,
}

impl Embedding {
    pub fn load(weights: &mut Weights, path: &str) -> Result<Self> {
        Ok(Embedding {
            weight: LinearWeight::load(weights, path, true)?,
        })
    }

    pub fn lookup(&self, ids: &Array) -> Result<Array> {
        Ok(match &self.weight {
            LinearWeight::Dense(w) => w.take_axis(ids, 0)?,
            // The dequantized values, back in the type dequantize gives.
            LinearWeight::Host { weight, dtype } => {
                let shape = ids.shape().to_vec();
                let ids = ids.as_dtype(Dtype::Int32)?;
                ids.eval()?;
                let rows = weight.gather_rows(ids.as_slice::<i32>())?;
                let mut out_shape = shape;
                out_shape.push(weight.k as i32);
                host::from_f32(&rows, &out_shape, *dtype)?
            }
            LinearWeight::Quantized(q) => dequantize(
                q.weight.take_axis(ids, 0)?,
                q.scales.take_axis(ids, 0)?,
                &q.biases.take_axis(ids, 0)?,
                q.group_size,
                q.bits,
            )?,
        })
    }

    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        self.weight.apply(x)
    }
}

/// One linear map per expert, `[experts, out, in]`, applied by index.
pub struct SwitchLinear {
    weight: LinearWeight,
}

impl SwitchLinear {
    pub fn load(weights: &mut Weights, path: &str) -> Result<Self> {
        // Experts stay as they came: each token's rows go through its own
        // experts one row at a time, and MoE models are far past the limit.
        Ok(SwitchLinear {
            weight: LinearWeight::load(weights, path, false)?,
        })
    }

    /// `x`: `[..., 1, in]` rows, `indices`: the expert of each row.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        Ok(match &self.weight {
            LinearWeight::Dense(w) => gather_mm(x, w.swap_axes(-1, -2)?, None, indices, false)?,
            LinearWeight::Host { .. } => {
                return Err(mlx_rs::error::Exception::custom(
                    "experts are never unpacked for the host kernels",
                )
                .into())
            }
            LinearWeight::Quantized(q) => gather_qmm(
                x,
                &q.weight,
                &q.scales,
                &q.biases,
                None,
                indices,
                true,
                q.group_size,
                q.bits,
                false,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::{abs, quantize};

    fn quantized_linear(out: i32, inp: i32) -> Linear {
        let w = mlx_rs::random::normal::<f32>(&[out, inp], None, None, None).unwrap();
        let (weight, scales, biases) = quantize(&w, 64, 8).unwrap();
        let packed = Packed {
            weight,
            scales,
            biases,
            group_size: 64,
            bits: 8,
            row_kernel: false,
        };
        Linear {
            weight: LinearWeight::Quantized(packed),
            bias: None,
        }
    }

    fn kernel(linear: &Linear, x: &Array) -> Array {
        let LinearWeight::Quantized(q) = &linear.weight else {
            unreachable!("quantized_linear")
        };
        quantized_matmul(x, &q.weight, &q.scales, &q.biases, true, 64, 8).unwrap()
    }

    fn largest(a: &Array) -> f32 {
        abs(a)
            .unwrap()
            .max(None)
            .unwrap()
            .try_item_exact::<f32>()
            .unwrap()
    }

    /// Below the threshold (decode, verify blocks) the quantized kernel runs
    /// unchanged, bit for bit; from it on (CPU prefill) the gemm gives the
    /// same values up to f32 summation order.
    #[test]
    fn rows_choose_the_kernel_or_the_gemm() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let linear = quantized_linear(96, 128);
        let few =
            mlx_rs::random::normal::<f32>(&[1, CPU_GEMM_FROM_ROWS - 1, 128], None, None, None)
                .unwrap();
        assert!(!prefers_gemm(&few));
        let ours = linear.forward(&few).unwrap();
        assert_eq!(largest(&ours.subtract(kernel(&linear, &few)).unwrap()), 0.0);

        let many =
            mlx_rs::random::normal::<f32>(&[2, CPU_GEMM_FROM_ROWS, 128], None, None, None).unwrap();
        assert!(prefers_gemm(&many));
        let ours = linear.forward(&many).unwrap();
        let expected = kernel(&linear, &many);
        assert_eq!(ours.shape(), expected.shape());
        let diff = largest(&ours.subtract(&expected).unwrap());
        assert!(diff <= 1e-5 * largest(&expected), "gemm differs by {diff}");
    }
}
