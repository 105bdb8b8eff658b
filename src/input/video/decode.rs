//! MP4 in, the sampled frames out as RGB: [`demux`] reads the container ([`super::mp4`]) and the
//! stream's SPS and refuses what cannot or may not be decoded before any picture is;
//! [`decode_frames`] runs openh264 over the samples in decode order, numbers the pictures it
//! returns in display order, and converts the wanted ones ([`super::color`]).
//!
//! Every picture up to the last wanted one is decoded (H.264 predicts from earlier pictures),
//! so the cost of a video is its frame count up to there, bounded by the frame budget that
//! [`demux`] checks against the container's sample table.

use super::color::ColorSpace;
use super::mp4::Mp4Error;
use super::sps::{self, SequenceInfo};
use super::{VideoError, VideoLimits};
use openh264::decoder::{DecodedYUV, Decoder, DecoderConfig, Flush};
use openh264::formats::YUVSource;
use openh264::OpenH264API;
use std::ops::Range;

/// What the container says about its video track.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoInfo {
    pub width: usize,
    pub height: usize,
    /// Samples (frames) in the track.
    pub frames: usize,
    /// Frames per second over the track: `frames / duration` (PyAV's `average_rate`).
    pub fps: f64,
    pub duration: f64,
}

/// A video track ready to decode.
pub struct Demuxed {
    pub info: VideoInfo,
    sequence: SequenceInfo,
    /// Each sample's bytes in the file, in decode order.
    samples: Vec<Range<usize>>,
    /// The avcC's SPS and PPS NAL units in Annex B (start codes).
    parameter_sets: Vec<u8>,
    /// Bytes of each NAL unit's length prefix in a sample.
    length_size: usize,
}

/// Reads the container and the stream's SPS; refuses what is not H.264 in MP4, what openh264
/// cannot decode, and what is over `limits`, before any picture is decoded.
pub fn demux(bytes: &[u8], limits: &VideoLimits) -> Result<Demuxed, VideoError> {
    let track = super::mp4::avc_track(bytes, limits.max_frames as u64).map_err(|e| match e {
        Mp4Error::Invalid(message) => VideoError::Format(message),
        Mp4Error::TooManySamples(frames) => VideoError::TooManyFrames { frames, max: limits.max_frames },
    })?;
    let sps_nal = track.sps.first().ok_or_else(|| VideoError::Format("its H.264 track has no SPS".into()))?;
    let sequence = sps::parse(sps_nal).ok_or_else(|| VideoError::Format("its H.264 SPS could not be read".into()))?;
    let unsupported = |what: String| Err(VideoError::Unsupported(what));
    if sequence.chroma_format_idc != 1 {
        let name = ["monochrome", "4:2:0", "4:2:2", "4:4:4"].get(sequence.chroma_format_idc as usize).copied().unwrap_or("unknown");
        return unsupported(format!("{name} chroma (only 4:2:0 is decoded)"));
    }
    if (sequence.bit_depth_luma, sequence.bit_depth_chroma) != (8, 8) {
        return unsupported(format!("{}-bit samples (only 8-bit is decoded)", sequence.bit_depth_luma.max(sequence.bit_depth_chroma)));
    }
    if !sequence.frame_mbs_only {
        return unsupported("interlaced coding (only progressive frames are decoded)".into());
    }
    let (width, height) = (track.width, track.height);
    if width == 0 || height == 0 || width > sequence.coded_width as usize || height > sequence.coded_height as usize {
        return Err(VideoError::Format(format!(
            "its track is {width}x{height} but its stream codes {}x{}",
            sequence.coded_width, sequence.coded_height
        )));
    }
    let pixels = sequence.coded_width as u64 * sequence.coded_height as u64;
    if pixels > limits.max_frame_pixels {
        return Err(VideoError::TooLarge {
            width: sequence.coded_width,
            height: sequence.coded_height,
            max_pixels: limits.max_frame_pixels,
        });
    }
    let frames = track.samples.len();
    let cost = frames as u64 * limits.frame_cost(pixels);
    if cost > limits.max_frames as u64 {
        return Err(VideoError::TooManyFrames { frames: cost, max: limits.max_frames });
    }
    if frames == 0 || track.duration == 0 || track.timescale == 0 {
        return Err(VideoError::Format("its video track has no frames or no duration".into()));
    }
    let duration = track.duration as f64 / track.timescale as f64;
    let mut parameter_sets = Vec::new();
    for nal in track.sps.iter().chain(&track.pps) {
        parameter_sets.extend_from_slice(&[0, 0, 0, 1]);
        parameter_sets.extend_from_slice(nal);
    }
    let fps = frames as f64 * track.timescale as f64 / track.duration as f64;
    let info = VideoInfo { width, height, frames, fps, duration };
    Ok(Demuxed { info, sequence, samples: track.samples, parameter_sets, length_size: track.length_size })
}

/// A sample's length-prefixed NAL units (AVCC) as Annex B, into `out`.
fn annex_b(sample: &[u8], length_size: usize, out: &mut Vec<u8>) -> Result<(), VideoError> {
    let mut at = 0;
    while at < sample.len() {
        let prefix = sample.get(at..at + length_size).ok_or_else(|| VideoError::Decode("a frame's NAL unit is cut short".into()))?;
        let len = prefix.iter().fold(0usize, |acc, &b| (acc << 8) | b as usize);
        let nal = sample
            .get(at + length_size..at + length_size + len)
            .ok_or_else(|| VideoError::Decode("a frame's NAL unit is cut short".into()))?;
        out.extend_from_slice(&[0, 0, 0, 1]);
        out.extend_from_slice(nal);
        at += length_size + len;
    }
    Ok(())
}

/// Decodes `demuxed` up to the last of `wanted` (display-order frame indices, ascending) and
/// calls `keep(index, rgb)` for each wanted frame, `rgb` being `width × height × 3` bytes.
pub fn decode_frames(
    bytes: &[u8],
    demuxed: &Demuxed,
    wanted: &[usize],
    mut keep: impl FnMut(usize, &[u8]) -> Result<(), VideoError>,
) -> Result<(), VideoError> {
    let Some(&last) = wanted.last() else { return Ok(()) };
    let config = DecoderConfig::new().flush_after_decode(Flush::NoFlush);
    let mut decoder = Decoder::with_api_config(OpenH264API::from_source(), config).map_err(|e| VideoError::Decode(e.to_string()))?;
    let (info, color) = (&demuxed.info, demuxed.sequence.color);
    let mut state = Pictures { next: 0, wanted, at: 0, rgb: Vec::new(), width: info.width, height: info.height, color };
    let mut packet = demuxed.parameter_sets.clone();
    for range in &demuxed.samples {
        annex_b(&bytes[range.clone()], demuxed.length_size, &mut packet)?;
        let picture = decoder.decode(&packet).map_err(|e| VideoError::Decode(format!("frame {}: {e}", state.next)))?;
        packet.clear();
        if let Some(picture) = picture {
            state.take(&picture, &mut keep)?;
        }
        if state.next > last {
            return Ok(());
        }
    }
    for picture in decoder.flush_remaining().map_err(|e| VideoError::Decode(e.to_string()))? {
        state.take(&picture, &mut keep)?;
    }
    if state.at < wanted.len() {
        return Err(VideoError::Decode(format!("the stream ended after {} of its {} frames", state.next, info.frames)));
    }
    Ok(())
}

/// The pictures coming out of the decoder, numbered in display order.
struct Pictures<'a> {
    next: usize,
    wanted: &'a [usize],
    /// The next entry of `wanted`.
    at: usize,
    rgb: Vec<u8>,
    width: usize,
    height: usize,
    color: ColorSpace,
}

impl Pictures<'_> {
    fn take(&mut self, picture: &DecodedYUV<'_>, keep: &mut impl FnMut(usize, &[u8]) -> Result<(), VideoError>) -> Result<(), VideoError> {
        let index = self.next;
        self.next += 1;
        if self.wanted.get(self.at) != Some(&index) {
            return Ok(());
        }
        self.at += 1;
        let (w, h) = picture.dimensions();
        let (ys, us, vs) = picture.strides();
        let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
        let fits = |plane: &[u8], stride: usize, pw: usize, ph: usize| stride >= pw && plane.len() >= stride * (ph - 1) + pw;
        if (w, h) != (self.width, self.height)
            || !fits(picture.y(), ys, w, h)
            || !fits(picture.u(), us, cw, ch)
            || !fits(picture.v(), vs, cw, ch)
        {
            return Err(VideoError::Decode(format!("frame {index} decoded as {w}x{h}, not the track's {}x{}", self.width, self.height)));
        }
        self.color.to_rgb((picture.y(), picture.u(), picture.v()), (ys, us, vs), w, h, &mut self.rgb);
        keep(index, &self.rgb)
    }
}
