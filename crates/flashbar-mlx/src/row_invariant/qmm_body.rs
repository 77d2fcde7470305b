//! The row-invariant quantized matmul's body (`kernels/cuda/qmm.cu`) and
//! the template ints a call launches it with, packed or not (docs/gpu.md,
//! "Template values packed").

use crate::custom_kernel::Body;

static QMM: Body = Body::new("qmm", include_str!("../../../../kernels/cuda/qmm.cu"));

/// The same body taking its ten template ints packed into three
/// ([`Template::launch`]).
static QMM_PACKED: Body = Body::new(
    "qmm_packed",
    concat!(
        "#define PACKED 1\n",
        include_str!("../../../../kernels/cuda/qmm.cu")
    ),
);

/// A call's template ints go to MLX packed into three where they fit
/// (`0` passes the ten): MLX formats, copies and hashes each template value
/// on every call, some 0.2 us of host time a value (docs/gpu.md, "What a
/// call costs the host, by kind"). The kernel unpacks them into the same
/// constants, so its machine code is the same. On by default since an H100
/// timed it (docs/gpu.md, "Template values packed").
pub const PACKED_TEMPLATE_ENV: &str = "FLASHBAR_QMM_PACKED_TEMPLATE";

pub(super) fn packed_template() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(PACKED_TEMPLATE_ENV).as_deref() != Ok("0"))
}

/// A qmm call's template ints (`kernels/cuda/qmm.cu` says what each is).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Template {
    pub bits: i32,
    pub half: i32,
    pub nt: i32,
    pub mt: i32,
    pub glu: i32,
    pub res: i32,
    pub gather: i32,
    pub parts: [i32; 3],
}

/// A call's template values, kept on the stack (a call allocates nothing
/// of ours): ten, or the packed three.
#[derive(Debug)]
pub(crate) struct Ints {
    values: [(&'static str, i32); 10],
    len: usize,
}

impl Ints {
    pub(crate) fn as_slice(&self) -> &[(&'static str, i32)] {
        &self.values[..self.len]
    }
}

impl Template {
    /// The body and its template values: packed into three where every
    /// field fits its bits (and [`PACKED_TEMPLATE_ENV`] allows), else ten.
    pub(crate) fn launch(&self, packed: bool) -> (&'static Body, Ints) {
        match self.packed().filter(|_| packed) {
            Some([cfg, p12, p3]) => {
                let mut values = [("", 0); 10];
                values[..3].copy_from_slice(&[("CFG", cfg), ("P12", p12), ("P3", p3)]);
                (&QMM_PACKED, Ints { values, len: 3 })
            }
            None => (
                &QMM,
                Ints {
                    values: [
                        ("BITS", self.bits),
                        ("HALF", self.half),
                        ("NT", self.nt),
                        ("MT", self.mt),
                        ("GLU", self.glu),
                        ("RES", self.res),
                        ("GATHER", self.gather),
                        ("P1", self.parts[0]),
                        ("P2", self.parts[1]),
                        ("P3", self.parts[2]),
                    ],
                    len: 10,
                },
            ),
        }
    }

    /// CFG, P12 and P3 as the body's `PACKED` prologue reads them.
    fn packed(&self) -> Option<[i32; 3]> {
        let fits = |v: i32, bits: u32| (0..1 << bits).contains(&v);
        let [p1, p2, p3] = self.parts;
        (fits(self.bits, 4)
            && fits(self.half, 1)
            && fits(self.nt, 4)
            && fits(self.mt, 3)
            && fits(self.glu, 1)
            && fits(self.res, 1)
            && fits(self.gather, 2)
            && fits(p1, 15)
            && fits(p2, 15))
        .then(|| {
            let cfg = self.bits
                | self.half << 4
                | self.nt << 5
                | self.mt << 9
                | self.glu << 12
                | self.res << 13
                | self.gather << 14;
            [cfg, p1 | p2 << 15, p3]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ints packed as the body's `PACKED` prologue unpacks them, and
    /// ten where one does not fit.
    #[test]
    fn template_ints_pack_into_three_where_they_fit() {
        let t = Template {
            bits: 8,
            half: 1,
            nt: 4,
            mt: 4,
            glu: 1,
            res: 1,
            gather: 1,
            parts: [12288, 16384, 100_000],
        };
        let (body, ints) = t.launch(true);
        assert_eq!(body.name, "qmm_packed");
        let [("CFG", cfg), ("P12", p12), ("P3", p3)] = *ints.as_slice() else {
            panic!("{ints:?}")
        };
        // As kernels/cuda/qmm.cu reads them.
        let unpacked = Template {
            bits: cfg & 15,
            half: (cfg >> 4) & 1,
            nt: (cfg >> 5) & 15,
            mt: (cfg >> 9) & 7,
            glu: (cfg >> 12) & 1,
            res: (cfg >> 13) & 1,
            gather: (cfg >> 14) & 3,
            parts: [p12 & 0x7FFF, (p12 >> 15) & 0x7FFF, p3],
        };
        assert_eq!(unpacked, t);
        let wide = Template {
            parts: [40_000, 0, 0],
            ..t
        };
        let (body, ints) = wide.launch(true);
        assert_eq!((body.name, ints.as_slice().len()), ("qmm", 10));
        assert_eq!(ints.as_slice()[7], ("P1", 40_000));
        assert_eq!(t.launch(false).1.as_slice().len(), 10, "packing turned off");
    }
}
