//! Several maps of one input as one product ([`Fused`]): stacked at load
//! where they share a format, and a SwiGLU's gate and up paired for the
//! row-invariant kernel's GLU end (docs/gpu.md, "Fewer calls", "Fused ends").

use super::{fuse_ends, HostMatrix, Linear, LinearWeight, Packed, Weights};
use crate::error::Result;
use crate::nn::host;
use flashbar_mlx::row_invariant::{self, Ends};
use mlx_rs::ops::{concatenate, split_at_indices};
use mlx_rs::Array;

/// Several linear maps of one input (a layer's q/k/v, its gate and up
/// projections, a gated-delta layer's four input maps), stacked at load
/// into one weight where they are stored alike and multiplied as one
/// product: one read of the input and one call instead of one per map.
/// On the host path the values are bit for bit those of the maps one by
/// one (`host::linear_split`); packed maps on MLX's path (the GPU, large
/// models on the CPU) become one quantized matmul whose columns are each
/// map's, split after it (docs/gpu.md, "Fewer calls"); dense maps only
/// where loaded by [`Fused::load_stacking_dense`] (the drafter's q/k/v:
/// docs/gpu.md, "The drafter's forward on the GPU").
pub struct Fused {
    /// The maps one by one, where they are not stacked.
    parts: Vec<Linear>,
    /// The stacked weight and each map's width.
    stacked: Option<(LinearWeight, Vec<i32>)>,
    /// A SwiGLU's gate and up maps stacked with their rows paired for the
    /// row-invariant kernel's GLU end ([`Fused::load_glu`]).
    paired: bool,
}

/// `0` keeps packed maps on MLX's path one product each instead of stacked
/// ([`Fused`]); benchmarks compare the two.
pub const STACK_MAPS_ENV: &str = "FLASHBAR_STACK_MAPS";

/// `0` keeps a stacked product whole on the row-invariant kernel's path,
/// each map's part a strided slice of it, instead of each part written
/// apart ([`Fused::forward`]); benchmarks compare the two.
pub const SPLIT_PARTS_ENV: &str = "FLASHBAR_SPLIT_PARTS";

fn split_parts() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(SPLIT_PARTS_ENV).as_deref() != Ok("0"))
}

impl Fused {
    pub fn load(weights: &mut Weights, paths: &[String]) -> Result<Self> {
        Self::of(load_parts(weights, paths)?)
    }

    /// [`Self::load`], and where the maps are dense (unquantized, on MLX's
    /// path) of one dtype and input width, they are stacked too: one
    /// product instead of one per map. For the drafter, whose maps are so
    /// small that on the GPU each costs a call's floor, not its arithmetic
    /// (docs/gpu.md, "The drafter's forward on the GPU"); the target keeps
    /// its dense maps apart.
    pub fn load_stacking_dense(weights: &mut Weights, paths: &[String]) -> Result<Self> {
        let parts = load_parts(weights, paths)?;
        match stack_dense(&parts)? {
            Some(weight) => Ok(Self::from_parts(parts, Some(weight))),
            None => Self::of(parts),
        }
    }

    /// The maps one by one again, where they are one dense product (the
    /// tests compare the two).
    #[cfg(test)]
    pub(crate) fn unstacked(self) -> Result<Self> {
        let Some((LinearWeight::Dense(w), widths)) = &self.stacked else {
            return Ok(self);
        };
        let mut parts = Vec::with_capacity(widths.len());
        let mut start = 0;
        for &n in widths {
            parts.push(Linear {
                weight: LinearWeight::Dense(mlx_rs::ops::indexing::IndexOp::index(
                    w,
                    start..start + n,
                )),
                bias: None,
            });
            start += n;
        }
        Ok(Self::from_parts(parts, None))
    }

    fn of(parts: Vec<Linear>) -> Result<Self> {
        let weight = stack(&parts)?;
        Ok(Self::from_parts(parts, weight))
    }

    /// The maps as one product where `stacked` holds their weights as one,
    /// else one by one.
    fn from_parts(parts: Vec<Linear>, stacked: Option<LinearWeight>) -> Self {
        match stacked {
            Some(weight) => Fused {
                stacked: Some((weight, stack_widths(&parts))),
                parts: Vec::new(),
                paired: false,
            },
            None => Fused {
                parts,
                stacked: None,
                paired: false,
            },
        }
    }

    /// A SwiGLU's `gate` and `up` maps ([`Self::load`]), stacked with
    /// their rows paired where the row-invariant kernel can compute
    /// `silu(gate) * up` as it writes the product ([`Self::forward_glu`];
    /// docs/gpu.md, "Fused ends"). Memory is unchanged: the rows are only
    /// reordered, straight from the two maps.
    pub fn load_glu(weights: &mut Weights, gate: &str, up: &str) -> Result<Self> {
        let parts = vec![Linear::load(weights, gate)?, Linear::load(weights, up)?];
        let widths = stack_widths(&parts);
        let paired = match packed_alike(&parts).as_deref() {
            Some(&[g, u])
                if widths[0] == widths[1]
                    && g.row_kernel
                    && fuse_ends()
                    && row_invariant::takes_glu(
                        2 * widths[0],
                        g.weight.shape()[1] * (32 / g.bits),
                        g.bits,
                    ) =>
            {
                Packed::rebuilt(g, |of| Ok(row_invariant::pair_glu_rows(of(g), of(u))?))?
            }
            _ => return Self::of(parts),
        };
        Ok(Fused {
            stacked: Some((LinearWeight::Quantized(paired), widths)),
            parts: Vec::new(),
            paired: true,
        })
    }

    /// `silu(gate) * up` of a [`Self::load_glu`] pair in one call, where
    /// its rows are paired and the row-invariant kernel takes `x`, or where
    /// the host kernels multiply (the gate computed on their product, the
    /// same bits as product, split, then gate); None elsewhere.
    pub fn forward_glu(&self, x: &Array) -> Result<Option<Array>> {
        match &self.stacked {
            Some((LinearWeight::Host { weight, .. }, cols))
                if cols.len() == 2 && cols[0] == cols[1] && fuse_ends() =>
            {
                host::linear_swiglu(x, weight, cols[0] as usize)
            }
            Some((weight, _)) if self.paired => {
                let ends = Ends {
                    glu: true,
                    residual: None,
                };
                weight.apply_with(x, ends)
            }
            _ => Ok(None),
        }
    }

    /// The maps' whole product `[.., sum of widths]`, where they are one
    /// packed product (their columns in the order they were loaded); None
    /// elsewhere. The MoE kernels read the router's and the shared gate's
    /// columns from it in place (docs/gpu.md, "The MoE block in four
    /// kernels").
    pub fn forward_whole(&self, x: &Array) -> Result<Option<Array>> {
        match &self.stacked {
            Some((weight @ LinearWeight::Quantized(_), _)) if !self.paired => {
                Ok(Some(weight.apply(x)?))
            }
            _ => Ok(None),
        }
    }

    /// The packed weight of a [`Self::load_glu`] pair whose rows are
    /// paired; None elsewhere.
    pub(crate) fn glu_packed(&self) -> Option<&Packed> {
        match &self.stacked {
            Some((LinearWeight::Quantized(q), _)) if self.paired => Some(q),
            _ => None,
        }
    }

    /// Whether the maps are one host product (the CPU path), so that
    /// stacking rows of several inputs costs one hand-over, not several.
    pub fn is_host(&self) -> bool {
        matches!(&self.stacked, Some((LinearWeight::Host { .. }, _)))
    }

    /// Whether the maps are one product (host or packed), so that one call
    /// on the rows of several inputs is cheaper than a call per map.
    pub fn is_stacked(&self) -> bool {
        self.stacked.is_some()
    }

    /// Map `i` alone (all of them where they are one product).
    pub fn forward_one(&self, i: usize, x: &Array) -> Result<Array> {
        match self.parts.get(i) {
            Some(part) => part.forward(x),
            None => self.forward(x)?.into_iter().nth(i).ok_or_else(|| {
                mlx_rs::error::Exception::custom(format!("no map {i} in a fused linear")).into()
            }),
        }
    }

    /// Each map of `x`, in the order of the paths it was loaded from.
    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match &self.stacked {
            Some((LinearWeight::Host { weight, .. }, cols)) => host::linear_split(x, weight, cols),
            Some((weight, cols)) => {
                let ends: Vec<i32> = cols
                    .iter()
                    .scan(0, |end, n| {
                        *end += n;
                        Some(*end)
                    })
                    .collect();
                // A block of rows only: a single row's parts are contiguous
                // slices already, and the parts' own views cost a decode step
                // more host time than they save (docs/gpu.md, "Stacked maps'
                // parts apart").
                let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
                if !self.paired && rows > 1 && split_parts() {
                    if let Some(parts) = weight.apply_parts(x, cols)? {
                        return Ok(parts);
                    }
                }
                let all = weight.apply(x)?;
                if self.paired {
                    let (gate, up) = row_invariant::unpair_glu_columns(&all)?;
                    return Ok(vec![gate, up]);
                }
                Ok(split_at_indices(&all, &ends[..ends.len() - 1], -1)?)
            }
            None => self.parts.iter().map(|part| part.forward(x)).collect(),
        }
    }
}

fn load_parts(weights: &mut Weights, paths: &[String]) -> Result<Vec<Linear>> {
    paths
        .iter()
        .map(|path| Linear::load(weights, path))
        .collect()
}

/// Dense maps' weights as one (rows of each map in order), where every map
/// is dense, of one dtype and input width, and without a bias; None
/// elsewhere (or where [`STACK_MAPS_ENV`] is `0`).
fn stack_dense(parts: &[Linear]) -> Result<Option<LinearWeight>> {
    if parts.len() < 2
        || parts.iter().any(|p| p.bias.is_some())
        || std::env::var(STACK_MAPS_ENV).as_deref() == Ok("0")
    {
        return Ok(None);
    }
    let Some(dense) = parts
        .iter()
        .map(|part| match &part.weight {
            LinearWeight::Dense(w) if w.ndim() == 2 => Some(w),
            _ => None,
        })
        .collect::<Option<Vec<&Array>>>()
    else {
        return Ok(None);
    };
    let first = dense[0];
    if dense
        .iter()
        .any(|w| w.dtype() != first.dtype() || w.shape()[1] != first.shape()[1])
    {
        return Ok(None);
    }
    Ok(Some(LinearWeight::Dense(concatenate(&dense, 0)?)))
}

/// The maps' weights as one, outputs in order: host matrices summed alike,
/// or packed weights of one format (on MLX's path, unless
/// [`STACK_MAPS_ENV`] is `0`). None where they differ, carry a bias, or
/// are a single map.
fn stack(parts: &[Linear]) -> Result<Option<LinearWeight>> {
    if parts.len() < 2 || parts.iter().any(|p| p.bias.is_some()) {
        return Ok(None);
    }
    let hosts: Option<Vec<&HostMatrix>> = parts
        .iter()
        .map(|part| match &part.weight {
            LinearWeight::Host { weight, .. } => Some(weight),
            _ => None,
        })
        .collect();
    if let Some(hosts) = hosts {
        let LinearWeight::Host { dtype, .. } = parts[0].weight else {
            unreachable!("every part is a host matrix")
        };
        return Ok(HostMatrix::stack(&hosts)?.map(|weight| LinearWeight::Host { weight, dtype }));
    }
    let Some(packed) = packed_alike(parts) else {
        return Ok(None);
    };
    if std::env::var(STACK_MAPS_ENV).as_deref() == Ok("0") {
        return Ok(None);
    }
    let first = packed[0];
    let joined = Packed::rebuilt(first, |of| {
        Ok(concatenate(
            &packed.iter().map(|q| of(q)).collect::<Vec<_>>(),
            0,
        )?)
    })?;
    Ok(Some(LinearWeight::Quantized(joined)))
}

/// The maps' packed weights where every map is packed alike (bits, group,
/// kernel, scales' type, inputs) and has no bias; None elsewhere.
fn packed_alike(parts: &[Linear]) -> Option<Vec<&Packed>> {
    let packed: Vec<&Packed> = parts
        .iter()
        .map(|part| match (&part.weight, &part.bias) {
            (LinearWeight::Quantized(q), None) => Some(q),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let first = *packed.first()?;
    packed
        .iter()
        .all(|q| {
            (q.group_size, q.bits, q.row_kernel) == (first.group_size, first.bits, first.row_kernel)
                && q.scales.dtype() == first.scales.dtype()
                && q.weight.shape()[1..] == first.weight.shape()[1..]
        })
        .then_some(packed)
}

/// Each map's output width.
fn stack_widths(parts: &[Linear]) -> Vec<i32> {
    parts
        .iter()
        .map(|part| match &part.weight {
            LinearWeight::Host { weight, .. } => weight.n as i32,
            LinearWeight::Quantized(q) => q.weight.shape()[0],
            LinearWeight::Dense(w) => w.shape()[0],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{largest, packed, values};
    use super::*;

    /// Packed maps of one format become one quantized matmul whose columns
    /// are each map's, bit for bit (a gated-delta layer's four maps, the
    /// narrow ones included); maps of different formats stay apart.
    #[test]
    fn packed_maps_stack_into_one_product_with_the_same_values() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let parts: Vec<Linear> = [(96, 1.0), (64, 2.0), (8, 3.0), (8, 4.0)]
            .iter()
            .map(|&(n, salt)| packed(n, 128, 4, salt))
            .collect();
        let weight = stack(&parts).unwrap().expect("one format: stacked");
        let fused = Fused {
            stacked: Some((weight, stack_widths(&parts))),
            parts: Vec::new(),
            paired: false,
        };
        assert!(fused.is_stacked() && !fused.is_host());
        for rows in [1, 16] {
            let x = values(rows, 128, 9.0);
            let maps = fused.forward(&x).unwrap();
            assert_eq!(maps.len(), parts.len());
            for (i, (map, part)) in maps.iter().zip(&parts).enumerate() {
                let alone = part.forward(&x).unwrap();
                assert_eq!(map.shape(), alone.shape(), "map {i}");
                assert_eq!(largest(&map.subtract(&alone).unwrap()), 0.0, "map {i}");
                let one = fused.forward_one(i, &x).unwrap();
                assert_eq!(largest(&one.subtract(&alone).unwrap()), 0.0, "map {i}");
            }
        }
        let mixed = vec![packed(32, 128, 4, 1.0), packed(32, 128, 8, 2.0)];
        assert!(stack(&mixed).unwrap().is_none(), "4-bit and 8-bit maps");
    }

    /// Dense maps of one dtype and input width stack into one product
    /// whose columns are each map's (the drafter's q/k/v on MLX's path);
    /// maps of another width, another dtype or with a bias stay apart.
    #[test]
    fn dense_maps_stack_into_one_product() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let dense = |n: i32, k: i32, salt: f32| Linear {
            weight: LinearWeight::Dense(values(n, k, salt)),
            bias: None,
        };
        let parts = vec![dense(96, 64, 1.0), dense(32, 64, 2.0), dense(32, 64, 3.0)];
        let weight = stack_dense(&parts).unwrap().expect("one dtype and width");
        let fused = Fused {
            stacked: Some((weight, stack_widths(&parts))),
            parts: Vec::new(),
            paired: false,
        };
        for rows in [1, 21] {
            let x = values(rows, 64, 9.0);
            let maps = fused.forward(&x).unwrap();
            assert_eq!(maps.len(), 3);
            for (i, (map, part)) in maps.iter().zip(&parts).enumerate() {
                let alone = part.forward(&x).unwrap();
                assert_eq!(map.shape(), alone.shape(), "map {i}");
                let tolerance = 1e-5 * largest(&alone);
                assert!(
                    largest(&map.subtract(&alone).unwrap()) <= tolerance,
                    "map {i}, {rows} rows"
                );
            }
        }
        let unstacked = fused.unstacked().unwrap();
        assert!(!unstacked.is_stacked());
        assert_eq!(unstacked.forward(&values(1, 64, 9.0)).unwrap().len(), 3);
        let widths = vec![dense(32, 64, 1.0), dense(32, 48, 2.0)];
        assert!(
            stack_dense(&widths).unwrap().is_none(),
            "input widths differ"
        );
        let mut dtypes = vec![dense(32, 64, 1.0), dense(32, 64, 2.0)];
        dtypes[1].weight = LinearWeight::Dense(
            values(32, 64, 2.0)
                .as_dtype(mlx_rs::Dtype::Bfloat16)
                .unwrap(),
        );
        assert!(stack_dense(&dtypes).unwrap().is_none(), "dtypes differ");
        let mut biased = vec![dense(32, 64, 1.0), dense(32, 64, 2.0)];
        biased[0].bias = Some(values(1, 32, 3.0));
        assert!(stack_dense(&biased).unwrap().is_none(), "a bias");
        assert!(stack_dense(&parts[..1]).unwrap().is_none(), "one map");
    }

    /// A gate and up pair stacked with their rows paired (the GPU's GLU
    /// end) still gives each map's own product when the kernel does not
    /// take the input (prefill): the columns are unpaired after it.
    #[test]
    fn paired_glu_rows_give_each_maps_product() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let parts = vec![packed(64, 128, 4, 1.0), packed(64, 128, 4, 2.0)];
        let Some(LinearWeight::Quantized(mut q)) = stack(&parts).unwrap() else {
            panic!("one format: stacked");
        };
        for array in [&mut q.weight, &mut q.scales, &mut q.biases] {
            let halves = mlx_rs::ops::split_equal(&*array, 2, 0).unwrap();
            *array = row_invariant::pair_glu_rows(&halves[0], &halves[1]).unwrap();
        }
        let fused = Fused {
            stacked: Some((LinearWeight::Quantized(q), stack_widths(&parts))),
            parts: Vec::new(),
            paired: true,
        };
        // Not on the row-invariant kernel (the CPU): no fused gate here.
        let x = values(16, 128, 9.0);
        assert!(fused.forward_glu(&x).unwrap().is_none());
        let maps = fused.forward(&x).unwrap();
        for (map, part) in maps.iter().zip(&parts) {
            let alone = part.forward(&x).unwrap();
            assert_eq!(map.shape(), alone.shape());
            assert_eq!(largest(&map.subtract(&alone).unwrap()), 0.0);
        }
    }
}
