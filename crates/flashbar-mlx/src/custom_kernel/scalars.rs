//! One-value kernel arguments made once and shared (docs/gpu.md, "One-value
//! arguments made once").
//!
//! A kernel's position, length, step count or scale goes in as an array of
//! one value. Made from a host value on every call, each is a new buffer
//! that the host writes and the GPU then reads: on MLX's CUDA backend a few
//! bytes of managed memory, shared with other small buffers. Within a step
//! every attention layer passes the same position and length, and every
//! gated-delta layer of a rollback the same step count, so the arrays of the
//! few values seen last are kept (per thread, as MLX's arrays are) and
//! handed out again: the same values, one buffer each.

use mlx_rs::Array;
use std::cell::RefCell;

/// How many recent values are kept: a step's and a draft's positions,
/// lengths and scales, with room to spare.
const KEPT: usize = 16;

#[derive(Clone, Copy, PartialEq)]
enum Value {
    Int(i32),
    /// By its bits, so that every f32 (a NaN too) has one key.
    Float(u32),
}

thread_local! {
    static RECENT: RefCell<Vec<(Value, Array)>> = const { RefCell::new(Vec::new()) };
}

fn kept(value: Value, make: impl FnOnce() -> Array) -> Array {
    RECENT.with(|recent| {
        let mut recent = recent.borrow_mut();
        if let Some(at) = recent.iter().position(|(v, _)| *v == value) {
            let entry = recent.remove(at);
            let array = entry.1.clone();
            recent.insert(0, entry);
            return array;
        }
        let array = make();
        recent.insert(0, (value, array.clone()));
        recent.truncate(KEPT);
        array
    })
}

/// `[value]`, an i32 array of shape `[1]`.
pub fn int(value: i32) -> Array {
    kept(Value::Int(value), || Array::from_slice(&[value], &[1]))
}

/// `[value]`, an f32 array of shape `[1]`.
pub fn float(value: f32) -> Array {
    kept(Value::Float(value.to_bits()), || {
        Array::from_slice(&[value], &[1])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::Dtype;

    /// Where an array's value lives (one buffer, one address).
    fn data(array: &Array) -> *const u8 {
        match array.dtype() {
            Dtype::Int32 => array.as_slice::<i32>().as_ptr().cast(),
            _ => array.as_slice::<f32>().as_ptr().cast(),
        }
    }

    #[test]
    fn a_value_asked_again_is_the_same_buffer_with_the_same_value() {
        let first = int(1_234);
        let other = int(1_235);
        let again = int(1_234);
        assert_eq!(again.as_slice::<i32>(), &[1_234]);
        assert_eq!(other.as_slice::<i32>(), &[1_235]);
        assert_eq!((again.shape(), again.dtype()), (&[1][..], Dtype::Int32));
        assert_eq!(data(&first), data(&again));
        assert_ne!(data(&first), data(&other));
        // An int and a float of the same bits are different arrays.
        let scale = float(f32::from_bits(1_234));
        assert_eq!(scale.dtype(), Dtype::Float32);
        assert_eq!(scale.as_slice::<f32>(), &[f32::from_bits(1_234)]);
        assert_eq!(data(&float(0.125)), data(&float(0.125)));
        assert_eq!(float(0.125).as_slice::<f32>(), &[0.125]);
    }

    #[test]
    fn only_the_most_recent_values_are_kept() {
        let held = |value: Value| RECENT.with(|r| r.borrow().iter().any(|(v, _)| *v == value));
        int(-7);
        int(-8);
        for v in 0..KEPT as i32 - 1 {
            int(10_000 + v);
            int(-8); // asked again: back to the front
        }
        // -7 was pushed out by the KEPT newer values, -8 was not.
        assert!(!held(Value::Int(-7)));
        assert!(held(Value::Int(-8)));
        RECENT.with(|recent| assert_eq!(recent.borrow().len(), KEPT));
        assert_eq!(int(-7).as_slice::<i32>(), &[-7]);
    }
}
