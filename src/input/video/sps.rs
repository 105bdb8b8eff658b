//! The few facts of an H.264 sequence parameter set that decide whether and how a stream is
//! decoded, read before any picture is: profile, chroma format, bit depth, frame size,
//! progressive or interlaced, and the colour description of its VUI (range and matrix, which
//! the RGB conversion needs and openh264 does not report). ITU-T H.264 §7.3.2.1.1 and §E.1.1.

use super::color::ColorSpace;

/// What the server needs of one SPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceInfo {
    pub profile_idc: u8,
    /// 0 monochrome, 1 4:2:0, 2 4:2:2, 3 4:4:4.
    pub chroma_format_idc: u32,
    pub bit_depth_luma: u32,
    pub bit_depth_chroma: u32,
    /// Decoded size before cropping, in pixels.
    pub coded_width: u32,
    pub coded_height: u32,
    pub frame_mbs_only: bool,
    pub color: ColorSpace,
}

/// MSB-first bits of an RBSP (emulation-prevention bytes removed).
struct Bits {
    data: Vec<u8>,
    pos: usize,
}

impl Bits {
    fn new(nal: &[u8]) -> Self {
        // Drop the 0x03 of every 00 00 03 (emulation prevention).
        let mut data = Vec::with_capacity(nal.len());
        let mut zeros = 0;
        for &b in nal {
            if zeros >= 2 && b == 3 {
                zeros = 0;
                continue;
            }
            zeros = if b == 0 { zeros + 1 } else { 0 };
            data.push(b);
        }
        Bits { data, pos: 0 }
    }

    fn bit(&mut self) -> Option<u32> {
        let byte = *self.data.get(self.pos / 8)?;
        let bit = (byte >> (7 - self.pos % 8)) & 1;
        self.pos += 1;
        Some(bit as u32)
    }

    fn bits(&mut self, n: u32) -> Option<u32> {
        (0..n).try_fold(0u32, |acc, _| Some((acc << 1) | self.bit()?))
    }

    /// ue(v): Exp-Golomb; more than 31 leading zeros is not a valid SPS.
    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        let rest = self.bits(zeros)? as u64;
        u32::try_from((1u64 << zeros) - 1 + rest).ok()
    }

    fn se(&mut self) -> Option<i64> {
        let k = self.ue()? as i64;
        Some(if k % 2 == 1 { (k + 1) / 2 } else { -(k / 2) })
    }
}

/// Profiles whose SPS carries chroma format, bit depths and scaling matrices.
const HIGH_PROFILES: [u8; 13] = [100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135];

/// Parses an SPS NAL unit (its header byte included); `None` when it is cut short or invalid.
pub fn parse(nal: &[u8]) -> Option<SequenceInfo> {
    if nal.first()? & 0x1f != 7 {
        return None;
    }
    let mut r = Bits::new(&nal[1..]);
    let profile_idc = r.bits(8)? as u8;
    r.bits(16)?; // constraint flags, level
    r.ue()?; // seq_parameter_set_id
    let (mut chroma_format_idc, mut bit_depth_luma, mut bit_depth_chroma) = (1, 8, 8);
    if HIGH_PROFILES.contains(&profile_idc) {
        chroma_format_idc = r.ue()?;
        if chroma_format_idc == 3 {
            r.bit()?; // separate_colour_plane_flag
        }
        bit_depth_luma = 8 + r.ue()?;
        bit_depth_chroma = 8 + r.ue()?;
        r.bit()?; // qpprime_y_zero_transform_bypass_flag
        if r.bit()? == 1 {
            for i in 0..if chroma_format_idc != 3 { 8 } else { 12 } {
                if r.bit()? == 1 {
                    skip_scaling_list(&mut r, if i < 6 { 16 } else { 64 })?;
                }
            }
        }
    }
    r.ue()?; // log2_max_frame_num_minus4
    match r.ue()? {
        0 => {
            r.ue()?; // log2_max_pic_order_cnt_lsb_minus4
        }
        1 => {
            r.bit()?;
            r.se()?;
            r.se()?;
            let cycle = r.ue()?;
            if cycle > 255 {
                return None;
            }
            for _ in 0..cycle {
                r.se()?;
            }
        }
        _ => {}
    }
    r.ue()?; // max_num_ref_frames
    r.bit()?; // gaps_in_frame_num_value_allowed_flag
    let width_mbs = r.ue()?.checked_add(1)?;
    let height_units = r.ue()?.checked_add(1)?;
    let frame_mbs_only = r.bit()? == 1;
    if !frame_mbs_only {
        r.bit()?; // mb_adaptive_frame_field_flag
    }
    r.bit()?; // direct_8x8_inference_flag
    if r.bit()? == 1 {
        for _ in 0..4 {
            r.ue()?; // frame cropping offsets
        }
    }
    let mut color = ColorSpace { bt709: false, full_range: false };
    if r.bit()? == 1 {
        // vui_parameters
        if r.bit()? == 1 && r.bits(8)? == 255 {
            r.bits(32)?; // sar_width, sar_height
        }
        if r.bit()? == 1 {
            r.bit()?; // overscan_appropriate_flag
        }
        if r.bit()? == 1 {
            r.bits(3)?; // video_format
            color.full_range = r.bit()? == 1;
            if r.bit()? == 1 {
                r.bits(16)?; // colour_primaries, transfer_characteristics
                color.bt709 = r.bits(8)? == 1;
            }
        }
    }
    let field_factor = if frame_mbs_only { 1 } else { 2 };
    Some(SequenceInfo {
        profile_idc,
        chroma_format_idc,
        bit_depth_luma,
        bit_depth_chroma,
        coded_width: width_mbs.checked_mul(16)?,
        coded_height: height_units.checked_mul(16 * field_factor)?,
        frame_mbs_only,
        color,
    })
}

fn skip_scaling_list(r: &mut Bits, size: usize) -> Option<()> {
    let (mut last, mut next) = (8i64, 8i64);
    for _ in 0..size {
        if next != 0 {
            next = (last + r.se()? + 256).rem_euclid(256);
        }
        last = if next == 0 { last } else { next };
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_baseline_sps() {
        // x264's SPS of tests/fixtures/video/pattern_96x64_10fps_3s_baseline.mp4 (Baseline,
        // level 1.0): 6 × 4 macroblocks, two emulation-prevention bytes.
        let sps = [
            0x67, 0x42, 0xc0, 0x0a, 0xd9, 0x06, 0x26, 0x84, 0x00, 0x00, 0x03, 0x00, 0x04, 0x00, 0x00, 0x03, 0x00, 0x50, 0x3c, 0x48, 0x99,
            0x20,
        ];
        let info = parse(&sps).expect("valid SPS");
        assert_eq!((info.profile_idc, info.chroma_format_idc, info.bit_depth_luma), (66, 1, 8));
        assert_eq!((info.coded_width, info.coded_height, info.frame_mbs_only), (96, 64, true));
        assert!(parse(&sps[..5]).is_none());
        assert!(parse(&[0x68, 0x00]).is_none());
    }
}
