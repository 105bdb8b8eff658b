//! YUV 4:2:0 to RGB exactly as the reference gets its frames: transformers' PyAV loader calls
//! `frame.to_ndarray("rgb24")`, which is FFmpeg's swscale, and on x86-64 swscale takes its
//! SSSE3 path. That path works in 16-bit fixed point: the luma is scaled by 8 and multiplied
//! with `pmulhw` (the high half of a 16 × 16-bit product, an arithmetic shift by 16), the
//! chroma is centred and scaled by 8, each coefficient is swscale's table entry divided by 8
//! and rounded, and chroma is upsampled by repetition (each sample covers 2 × 2 pixels).
//! Checked against PyAV 18.1 (FFmpeg 8): every byte equal on Baseline and High streams,
//! limited and full range, BT.601 and BT.709 tagged.
//!
//! The matrix and range come from the stream's SPS (its VUI, [`super::sps`]): BT.709 when it
//! says so, BT.601 otherwise (swscale's default for untagged and 601/470BG/SMPTE170M streams;
//! the rare others, FCC, SMPTE 240M, BT.2020, are converted as BT.601 too, a documented
//! difference).

/// How a stream's YUV maps to RGB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColorSpace {
    pub bt709: bool,
    pub full_range: bool,
}

/// swscale's `ff_yuv2rgb_coeffs` entries (crv, cbu, cgu, cgv) for BT.601 and BT.709.
const BT601: [i64; 4] = [104_597, 132_201, 25_675, 53_279];
const BT709: [i64; 4] = [117_489, 138_438, 13_975, 34_925];

/// The high half of a 16-bit product (`pmulhw`).
#[inline]
fn mulhw(a: i32, b: i32) -> i32 {
    (a * b) >> 16
}

/// A coefficient as the SSSE3 path stores it: divided by 8, rounded (floor of x/8 + ½).
fn table_entry(c: i64) -> i32 {
    ((c * 8192 + 32768) >> 16) as i32
}

impl ColorSpace {
    /// (v→R, u→G, v→G, u→B) multipliers.
    fn coefficients(self) -> [i32; 4] {
        let base = if self.bt709 { BT709 } else { BT601 };
        // Full range: swscale first scales the table by 224/255 (integer division).
        let scaled = base.map(|c| if self.full_range { c * 224 / 255 } else { c });
        [table_entry(scaled[0]), table_entry(-scaled[2]), table_entry(-scaled[3]), table_entry(scaled[1])]
    }

    /// Writes `width × height` RGB pixels (row-major, 3 bytes each) of a 4:2:0 picture to `out`.
    /// `y`, `u`, `v` are the planes with their strides; the chroma planes hold ⌈w/2⌉ × ⌈h/2⌉.
    #[allow(clippy::too_many_arguments)]
    pub fn to_rgb(
        self,
        (y, u, v): (&[u8], &[u8], &[u8]),
        (ys, us, vs): (usize, usize, usize),
        width: usize,
        height: usize,
        out: &mut Vec<u8>,
    ) {
        let [vr, ug, vg, ub] = self.coefficients();
        out.clear();
        out.reserve(width * height * 3);
        for row in 0..height {
            let (yrow, urow, vrow) = (&y[row * ys..row * ys + width], &u[(row / 2) * us..], &v[(row / 2) * vs..]);
            for (col, &luma) in yrow.iter().enumerate() {
                let luma = luma as i32;
                let l = if self.full_range { mulhw(luma * 8, 8192) } else { mulhw(luma * 8 - 128, 9539) };
                let cu = (urow[col / 2] as i32 - 128) * 8;
                let cv = (vrow[col / 2] as i32 - 128) * 8;
                let r = l + mulhw(cv, vr);
                let g = l + mulhw(cu, ug) + mulhw(cv, vg);
                let b = l + mulhw(cu, ub);
                out.extend([r.clamp(0, 255) as u8, g.clamp(0, 255) as u8, b.clamp(0, 255) as u8]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coefficients_are_swscales_over_eight() {
        // The SSSE3 path's table for BT.601 limited range: 13075, -3209, -6660, 16525.
        assert_eq!(ColorSpace { bt709: false, full_range: false }.coefficients(), [13075, -3209, -6660, 16525]);
        assert_eq!(ColorSpace { bt709: true, full_range: false }.coefficients(), [14686, -1747, -4366, 17305]);
    }

    #[test]
    fn grey_and_extremes() {
        let cs = ColorSpace { bt709: false, full_range: false };
        let mut out = Vec::new();
        // Limited-range black, white and mid grey with neutral chroma.
        cs.to_rgb((&[16, 235, 126, 126], &[128, 128], &[128, 128]), (4, 2, 2), 4, 1, &mut out);
        assert_eq!(&out[..6], &[0, 0, 0, 255, 255, 255]);
        assert_eq!(out[6], out[7]);
    }
}
