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
use flashbar_mlx::row_invariant::{self, Ends};
use mlx_rs::ops::{dequantize, matmul, quantized_matmul};
use mlx_rs::{Array, Dtype};
use std::collections::HashMap;

mod experts;
mod stacked;
pub use experts::{ExpertsGlu, SwitchLinear};
pub use stacked::{Fused, STACK_MAPS_ENV};

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

/// `0` keeps a SwiGLU's gate and a block's residual add as MLX ops beside
/// the row-invariant matmul instead of fused into it ([`Onto`]), and as
/// host ops on arrays of their own beside the host kernels' product;
/// benchmarks compare the two.
pub const FUSE_ENDS_ENV: &str = "FLASHBAR_FUSE_ENDS";

fn fuse_ends() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(FUSE_ENDS_ENV).as_deref() != Ok("0"))
}

/// A block's output on its way onto the residual stream: already added
/// where the row-invariant matmul added it in its last step (decode and
/// verify on CUDA, docs/gpu.md "Fused ends"), else still to add.
pub enum Onto {
    Added(Array),
    Apart(Array),
}

impl Onto {
    /// The residual stream after this block: `add` the output where it is
    /// still apart.
    pub fn or_add(self, add: impl FnOnce(&Array) -> Result<Array>) -> Result<Array> {
        match self {
            Onto::Added(sum) => Ok(sum),
            Onto::Apart(out) => add(&out),
        }
    }
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

    /// Overrides the chosen path (the tests run MLX's path on the CPU).
    pub(crate) fn set_matmul_path(&mut self, path: MatmulPath) {
        self.path = path;
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
    /// A packed weight in `like`'s format whose weight, scales and biases
    /// `make` builds from maps' arrays of one kind (`of` picks it), each
    /// evaluated now, so that the arrays it came from are freed with them.
    fn rebuilt(
        like: &Packed,
        make: impl Fn(fn(&Packed) -> &Array) -> Result<Array>,
    ) -> Result<Packed> {
        let part = |of: fn(&Packed) -> &Array| -> Result<Array> {
            let array = make(of)?;
            array.eval()?;
            Ok(array)
        };
        Ok(Packed {
            weight: part(|q| &q.weight)?,
            scales: part(|q| &q.scales)?,
            biases: part(|q| &q.biases)?,
            group_size: like.group_size,
            bits: like.bits,
            row_kernel: like.row_kernel,
        })
    }

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
        // The default arithmetic fuses each multiply-add; MLX's sums its
        // quantized kernel in bf16 and its bf16 gemm in f32.
        let mlx = host::arithmetic() == host::Arithmetic::Mlx;
        let (values, dtype, sum) = match loaded {
            LinearWeight::Quantized(q) => (
                dequantize(&q.weight, &q.scales, &q.biases, q.group_size, q.bits)?,
                q.scales.dtype(),
                if mlx {
                    ColumnSum::Bf16
                } else {
                    ColumnSum::Fused
                },
            ),
            LinearWeight::Dense(w) => {
                let dtype = w.dtype();
                (
                    w,
                    dtype,
                    if mlx {
                        ColumnSum::F32
                    } else {
                        ColumnSum::Fused
                    },
                )
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

    /// The row-invariant matmul of a stacked weight whose columns are maps
    /// of `widths`, each map's product a contiguous array of its own
    /// (docs/gpu.md, "Stacked maps' parts apart"); None where another path
    /// multiplies or the maps are too many.
    fn apply_parts(&self, x: &Array, widths: &[i32]) -> Result<Option<Vec<Array>>> {
        let LinearWeight::Quantized(q) = self else {
            return Ok(None);
        };
        if !(q.row_kernel
            && widths.len() <= row_invariant::MAX_PARTS
            && row_invariant::takes_quantized(x, &q.scales, q.group_size, q.bits))
        {
            return Ok(None);
        }
        Ok(Some(row_invariant::quantized_matmul_parts(
            x,
            &q.weight,
            &q.scales,
            &q.biases,
            q.group_size,
            q.bits,
            widths,
        )?))
    }

    /// The row-invariant matmul with its [`Ends`] fused in, where it takes
    /// `x` (the activations, or a SwiGLU's `[gate | up]` halves); None where
    /// another path multiplies (the CPU, prefill, other formats).
    fn apply_with(&self, x: &Array, ends: Ends) -> Result<Option<Array>> {
        if let LinearWeight::Host { weight, .. } = self {
            // The host kernels' product and its residual add in one pass;
            // their SwiGLU end is `Fused::forward_glu`'s.
            return match ends {
                Ends {
                    glu: false,
                    residual: Some(residual),
                } if fuse_ends() => host::linear_add(x, weight, residual),
                _ => Ok(None),
            };
        }
        let LinearWeight::Quantized(q) = self else {
            return Ok(None);
        };
        if !(q.row_kernel
            && fuse_ends()
            && row_invariant::takes_quantized(x, &q.scales, q.group_size, q.bits))
        {
            return Ok(None);
        }
        let k = q.weight.shape()[1] * (32 / q.bits);
        let fits = x.shape()[x.ndim() - 1] == k
            && (!ends.glu || row_invariant::takes_glu(q.weight.shape()[0], k, q.bits));
        let residual_fits = ends.residual.is_none_or(|r| {
            r.dtype() == x.dtype() && r.shape()[..r.ndim() - 1] == x.shape()[..x.ndim() - 1]
        });
        if !(fits && residual_fits) {
            return Ok(None);
        }
        let product = row_invariant::quantized_matmul_with(
            x,
            &q.weight,
            &q.scales,
            &q.biases,
            q.group_size,
            q.bits,
            ends,
        )?;
        Ok(Some(product))
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

    /// The packed weight, where the map is one and has no bias.
    pub(crate) fn packed(&self) -> Option<&Packed> {
        match (&self.weight, &self.bias) {
            (LinearWeight::Quantized(q), None) => Some(q),
            _ => None,
        }
    }

    /// [`Self::forward`] onto the residual stream `residual`: added in the
    /// matmul's last step where the row-invariant kernel runs it.
    pub fn forward_onto(&self, x: &Array, residual: &Array) -> Result<Onto> {
        if self.bias.is_none() {
            let ends = Ends {
                glu: false,
                residual: Some(residual),
            };
            if let Some(sum) = self.weight.apply_with(x, ends)? {
                return Ok(Onto::Added(sum));
            }
        }
        Ok(Onto::Apart(self.forward(x)?))
    }
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
                let rows = match host::ids_ready(ids) {
                    Some(ids) => weight.gather_rows(&ids)?,
                    None => {
                        let ids = ids.as_dtype(Dtype::Int32)?;
                        ids.eval()?;
                        weight.gather_rows(ids.as_slice::<i32>())?
                    }
                };
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

    pub(super) fn largest(a: &Array) -> f32 {
        abs(a)
            .unwrap()
            .max(None)
            .unwrap()
            .try_item_exact::<f32>()
            .unwrap()
    }

    /// Deterministic values, `[rows, cols]`.
    pub(super) fn values(rows: i32, cols: i32, salt: f32) -> Array {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32 + salt) * 0.618).sin())
            .collect();
        Array::from_slice(&v, &[rows, cols])
    }

    pub(super) fn packed(out: i32, inp: i32, bits: i32, salt: f32) -> Linear {
        let (weight, scales, biases) = quantize(values(out, inp, salt), 64, bits).unwrap();
        let packed = Packed {
            weight,
            scales,
            biases,
            group_size: 64,
            bits,
            row_kernel: false,
        };
        Linear {
            weight: LinearWeight::Quantized(packed),
            bias: None,
        }
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
