//! Joining and cutting arrays whose values are already on the host (made
//! by the host kernels, or from host data) without MLX: a concatenation or
//! a slice is a lazy MLX op, and reading its result hands it to MLX's
//! thread and waits, a sleep and a wake-up of the caller for a copy of a
//! few kilobytes (docs/cpu.md, "Host caches"). The same values as MLX's
//! ops give; None (the caller runs MLX's) on other devices than the CPU,
//! and when an array is not ready or not of a type read here.

use flashbar_mlx::device::{self, Backend};
use half::bf16;
use mlx_rs::{Array, ArrayElement, Dtype};

/// Ready to read here: on the CPU, and made or evaluated already.
fn is_ready(array: &Array) -> bool {
    device::current() == Backend::Cpu && flashbar_mlx::is_ready(array)
}

/// `arrays` joined along `axis`, as MLX's `concatenate` gives them.
pub fn concatenate_ready(arrays: &[&Array], axis: usize) -> Option<Array> {
    let first = arrays.first()?;
    let shape = first.shape();
    let same_but_axis = arrays.iter().all(|a| {
        let s = a.shape();
        a.dtype() == first.dtype()
            && s.len() == shape.len()
            && axis < s.len()
            && s.iter()
                .zip(shape)
                .enumerate()
                .all(|(i, (x, y))| i == axis || x == y)
    });
    if !same_but_axis || !arrays.iter().all(|a| is_ready(a)) {
        return None;
    }
    match first.dtype() {
        Dtype::Bfloat16 => join::<bf16>(arrays, axis).map(|(v, s)| Array::from_slice(&v, &s)),
        Dtype::Float32 => join::<f32>(arrays, axis).map(|(v, s)| Array::from_slice(&v, &s)),
        Dtype::Uint32 => join::<u32>(arrays, axis).map(|(v, s)| Array::from_slice(&v, &s)),
        Dtype::Int32 => join::<i32>(arrays, axis).map(|(v, s)| Array::from_slice(&v, &s)),
        _ => None,
    }
}

/// The joined values and their shape.
fn join<T: ArrayElement + Copy>(arrays: &[&Array], axis: usize) -> Option<(Vec<T>, Vec<i32>)> {
    let slices = arrays
        .iter()
        .map(|a| a.try_as_slice::<T>().ok())
        .collect::<Option<Vec<&[T]>>>()?;
    let mut shape = arrays[0].shape().to_vec();
    let outer: usize = shape[..axis].iter().map(|&d| d as usize).product();
    shape[axis] = arrays.iter().map(|a| a.shape()[axis]).sum();
    let mut out = Vec::with_capacity(slices.iter().map(|s| s.len()).sum());
    for o in 0..outer {
        for s in &slices {
            let inner = s.len() / outer.max(1);
            out.extend_from_slice(&s[o * inner..(o + 1) * inner]);
        }
    }
    Some((out, shape))
}

/// The first `rows` positions of `array` `[1, T, ...]` (`array[:, :rows]`).
pub fn prefix_ready(array: &Array, rows: usize) -> Option<Array> {
    let shape = array.shape();
    if shape.len() < 2 || shape[0] != 1 || rows > shape[1] as usize || !is_ready(array) {
        return None;
    }
    let mut cut = shape.to_vec();
    cut[1] = rows as i32;
    let take = rows * shape[2..].iter().map(|&d| d as usize).product::<usize>();
    Some(match array.dtype() {
        Dtype::Bfloat16 => Array::from_slice(&array.try_as_slice::<bf16>().ok()?[..take], &cut),
        Dtype::Float32 => Array::from_slice(&array.try_as_slice::<f32>().ok()?[..take], &cut),
        _ => return None,
    })
}

/// The ids of a ready `[..]` u32 or i32 array, as i32 (None otherwise).
pub fn ids_ready(ids: &Array) -> Option<Vec<i32>> {
    if !is_ready(ids) {
        return None;
    }
    match ids.dtype() {
        Dtype::Uint32 => Some(
            ids.try_as_slice::<u32>()
                .ok()?
                .iter()
                .map(|&i| i as i32)
                .collect(),
        ),
        Dtype::Int32 => Some(ids.try_as_slice::<i32>().ok()?.to_vec()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::concatenate;
    use mlx_rs::ops::indexing::IndexOp;

    fn bits(a: &Array) -> (Vec<i32>, Dtype, Vec<u32>) {
        let f = a.as_dtype(Dtype::Float32).unwrap();
        f.eval().unwrap();
        let v = match f.size() {
            0 => Vec::new(),
            _ => f.as_slice::<f32>().iter().map(|x| x.to_bits()).collect(),
        };
        (a.shape().to_vec(), a.dtype(), v)
    }

    /// The host's joins and prefixes are MLX's concatenate and slice, for
    /// every axis and type read here; arrays not ready are left to MLX.
    #[test]
    fn joins_and_prefixes_are_mlx_s() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let values = |n: usize, seed: f32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as f32 * 0.37 + seed).sin() * 5.0).round() / 4.0)
                .collect()
        };
        for dtype in [Dtype::Bfloat16, Dtype::Float32, Dtype::Uint32, Dtype::Int32] {
            let make = |shape: &[i32], seed: f32| {
                let n = shape.iter().product::<i32>() as usize;
                let a = Array::from_slice(&values(n, seed), shape)
                    .as_dtype(dtype)
                    .unwrap();
                a.eval().unwrap();
                a
            };
            for axis in 0..3 {
                let mut s1 = [1, 3, 4];
                let mut s2 = [1, 3, 4];
                s1[axis] = 2;
                s2[axis] = 5;
                let (a, b) = (make(&s1, 0.5), make(&s2, 2.0));
                let ours = concatenate_ready(&[&a, &b], axis).expect("ready arrays join");
                let mlx = concatenate(&[&a, &b], axis as i32).unwrap();
                assert_eq!(bits(&ours), bits(&mlx), "{dtype:?} axis {axis}");
            }
            let lazy = make(&[1, 2, 4], 1.0)
                .multiply(Array::from_int(1).as_dtype(dtype).unwrap())
                .unwrap();
            let ready = make(&[1, 2, 4], 1.5);
            assert!(
                concatenate_ready(&[&ready, &lazy], 1).is_none(),
                "{dtype:?}"
            );
        }
        let block = Array::from_slice(&values(5 * 6, 3.0), &[1, 5, 6])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        block.eval().unwrap();
        for rows in [0, 1, 3, 5] {
            let ours = prefix_ready(&block, rows).unwrap();
            assert_eq!(
                bits(&ours),
                bits(&block.index((.., ..rows as i32))),
                "rows {rows}"
            );
        }
        assert!(prefix_ready(&block, 6).is_none());
        let ids = Array::from_slice(&[7u32, 0, 4095], &[1, 3]);
        assert_eq!(ids_ready(&ids), Some(vec![7, 0, 4095]));
        assert_eq!(
            ids_ready(&ids.multiply(Array::from_slice(&[1u32], &[1])).unwrap()),
            None
        );
    }
}
