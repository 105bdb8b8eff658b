//! Encoded audio to mono samples at the model's rate.
//!
//! transformers loads audio with `load_audio` (torchcodec's FFmpeg where it is installed, else
//! soundfile and soxr's high-quality resampler), averages the channels, and resamples. Here
//! symphonia demuxes and decodes (its pure-Rust WAV/PCM, FLAC, MP3 and Vorbis codecs, with the
//! encoder delay and padding of MP3s trimmed, as libsndfile trims them), channels are averaged
//! as they arrive, and libsoxr converts the rate with the quality and the steps python-soxr's
//! `resample` uses. PCM and FLAC decode to the same samples as libsndfile, and resample to
//! soxr's within float rounding (python-soxr builds libsoxr with its SIMD FFT, soxr-sys without);
//! MP3 and Vorbis decoders differ in their last bits (measured against transformers in
//! tests/suite/embedding_gemma2_audio.rs).

use super::{screen, AudioError, AudioLimits};
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL, CODEC_TYPE_VORBIS};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

/// The highest source rate decoded: 192 kHz covers studio recordings; past it, a header is
/// more likely hostile (the decoded buffer grows with the rate).
pub const MAX_SOURCE_RATE: u32 = 192_000;
/// The most channels decoded (7.1 surround is 8).
pub const MAX_CHANNELS: usize = 8;

/// The audio's container and stream checked from its headers, nothing decoded: a request's
/// audio all pass this before the first of them runs (as images' headers do).
pub fn check_header(bytes: &[u8], rate: u32, max_samples: usize, limits: &AudioLimits) -> Result<(), AudioError> {
    guarded(|| probe(bytes, rate, max_samples, limits).map(|_| ()))
}

/// Runs symphonia's part of a request with its panics turned into a refused file.
///
/// symphonia returns errors for the broken files it foresaw; for others it has panicked (a WAV
/// with a sample rate of 0 divided by zero, a Vorbis codebook trips an `assert!`). [`screen`]
/// refuses the ones we know of before symphonia sees them; this is the net under the rest, so
/// a client's bad file is a 400, not a 500. Sound: the closure owns everything it touches
/// (the decoder, its buffers), all dropped with it, so nothing half-changed outlives the panic.
fn guarded<T>(work: impl FnOnce() -> Result<T, AudioError>) -> Result<T, AudioError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
        .unwrap_or_else(|_| Err(AudioError::Decode("the decoder failed on this file".into())))
}

/// The container's reader, its audio track, the track's parameters and its sample rate,
/// checked against the limits (rate, channels, declared duration).
fn probe(
    bytes: &[u8],
    rate: u32,
    max_samples: usize,
    limits: &AudioLimits,
) -> Result<(Box<dyn symphonia::core::formats::FormatReader>, u32, symphonia::core::codecs::CodecParameters, u32), AudioError> {
    screen::container(bytes)?;
    let source = MediaSourceStream::new(Box::new(std::io::Cursor::new(bytes.to_vec())), MediaSourceStreamOptions::default());
    let format_options = FormatOptions { enable_gapless: true, ..FormatOptions::default() };
    let probed = symphonia::default::get_probe()
        .format(&Hint::new(), source, &format_options, &MetadataOptions::default())
        .map_err(|e| AudioError::Format(describe(&e)))?;
    let reader = probed.format;
    let track = reader
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| AudioError::Format("no audio track".into()))?;
    let (track_id, params) = (track.id, track.codec_params.clone());
    let source_rate = params.sample_rate.ok_or_else(|| AudioError::Format("no sample rate".into()))?;
    if source_rate == 0 || source_rate > MAX_SOURCE_RATE {
        return Err(AudioError::Unsupported { what: "sample rate", value: source_rate.into(), limit: "at most 192000 Hz" });
    }
    if let Some(channels) = params.channels.map(|c| c.count()) {
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(AudioError::Unsupported { what: "channel count", value: channels as u64, limit: "1 to 8" });
        }
    }
    // The header's duration, when it has one, is checked before anything is decoded.
    if let Some(frames) = params.n_frames {
        let seconds = frames as f64 / source_rate as f64;
        if seconds > limits.max_declared_seconds {
            return Err(AudioError::TooLong { seconds, max: limits.max_declared_seconds, heard: max_samples as f64 / rate as f64 });
        }
    }
    Ok((reader, track_id, params, source_rate))
}

/// The first `max_samples` samples at `rate` Hz of the audio in `bytes`, channels averaged.
pub fn decode_mono(bytes: &[u8], rate: u32, max_samples: usize, limits: &AudioLimits) -> Result<Vec<f32>, AudioError> {
    guarded(|| decode_mono_unguarded(bytes, rate, max_samples, limits))
}

fn decode_mono_unguarded(bytes: &[u8], rate: u32, max_samples: usize, limits: &AudioLimits) -> Result<Vec<f32>, AudioError> {
    let (mut reader, track_id, params, source_rate) = probe(bytes, rate, max_samples, limits)?;
    if let (CODEC_TYPE_VORBIS, Some(setup)) = (params.codec, &params.extra_data) {
        screen::vorbis_setup(setup)?;
    }
    let mut decoder =
        symphonia::default::get_codecs().make(&params, &DecoderOptions::default()).map_err(|e| AudioError::Format(describe(&e)))?;

    // Source samples needed for `max_samples` output ones, and a little more for the
    // resampler's filter to settle on the last of them.
    let wanted = if source_rate == rate {
        max_samples
    } else {
        (max_samples as u64 * source_rate as u64).div_ceil(rate as u64) as usize + source_rate as usize / 10
    };
    let mut mono: Vec<f32> = Vec::new();
    let mut interleaved: Option<SampleBuffer<f32>> = None;
    while mono.len() < wanted {
        let packet = match reader.next_packet() {
            Ok(packet) => packet,
            // The end of the stream (a truncated file ends here too, with what it holds).
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(SymphoniaError::ResetRequired) => break,
            Err(e) => return Err(AudioError::Decode(describe(&e))),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(decoded) => decoded,
            // A corrupt packet is skipped, as symphonia's players do; a file with no good
            // packet at all is refused below.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(AudioError::Decode(describe(&e))),
        };
        let spec = *decoded.spec();
        let channels = spec.channels.count();
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(AudioError::Unsupported { what: "channel count", value: channels as u64, limit: "1 to 8" });
        }
        if spec.rate != source_rate {
            return Err(AudioError::Decode("the sample rate changes within the stream".into()));
        }
        let buffer = match &mut interleaved {
            Some(buffer) if buffer.capacity() >= decoded.capacity() * channels => buffer,
            slot => slot.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
        };
        buffer.copy_interleaved_ref(decoded);
        let take = (wanted - mono.len()) * channels;
        let samples = &buffer.samples()[..buffer.samples().len().min(take)];
        mono.extend(samples.chunks_exact(channels).map(|frame| frame.iter().sum::<f32>() / channels as f32));
    }
    if mono.is_empty() {
        return Err(AudioError::Decode("no audio samples in the file".into()));
    }
    let mut wave = if source_rate == rate { mono } else { resample(&mono, source_rate, rate)? };
    wave.truncate(max_samples);
    Ok(wave)
}

/// `samples` from `from` Hz to `to` Hz, `ceil(n · to / from)` samples long, as transformers'
/// `load_audio` resamples: python-soxr's `resample(wave, from, to, quality="soxr_hq")` (libsoxr's
/// 20-bit "HQ" recipe, linear phase, fed in python-soxr's chunks and flushed), then zero-padded
/// or cut to that length.
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, AudioError> {
    let expected = (samples.len() as u64 * to as u64).div_ceil(from as u64) as usize;
    let mut resampler = Soxr::new(from, to)?;
    // python-soxr's output buffer: `n · to / from + 1` samples; soxr stops writing there.
    let mut out = vec![0f32; (samples.len() as f64 * to as f64 / from as f64) as usize + 1];
    let mut written = 0;
    // python-soxr's chunk: at least 1000 input samples, or a second at 48 kHz output.
    let chunk = (48_000.0 * from as f64 / to as f64).max(1000.0) as usize;
    for piece in samples.chunks(chunk) {
        written += resampler.process(Some(piece), &mut out[written..])?;
    }
    written += resampler.process(None, &mut out[written..])?;
    out.truncate(written);
    out.resize(expected, 0.0);
    Ok(out)
}

/// One libsoxr resampler, mono f32 in and out, deleted on drop.
struct Soxr(soxr_sys::soxr_t);

impl Soxr {
    fn new(from: u32, to: u32) -> Result<Self, AudioError> {
        let float = soxr_sys::soxr_datatype_t_SOXR_FLOAT32_I;
        // SAFETY: a plain constructor that returns a struct by value and reads no pointer.
        let io = unsafe { soxr_sys::soxr_io_spec(float, float) };
        // SOXR_20_BITQ is soxr.h's SOXR_HQ, the recipe python-soxr's "soxr_hq" names.
        // SAFETY: as above, a struct returned by value.
        let quality = unsafe { soxr_sys::soxr_quality_spec(soxr_sys::SOXR_20_BITQ as _, 0) };
        let mut error: soxr_sys::soxr_error_t = std::ptr::null();
        // SAFETY: the specs outlive the call (soxr copies them), `error` is a valid out-pointer,
        // and a null runtime spec asks for libsoxr's defaults.
        let handle = unsafe { soxr_sys::soxr_create(from as f64, to as f64, 1, &mut error, &io, &quality, std::ptr::null()) };
        if !error.is_null() || handle.is_null() {
            if !handle.is_null() {
                // SAFETY: a handle soxr_create returned, deleted once.
                unsafe { soxr_sys::soxr_delete(handle) };
            }
            return Err(AudioError::Decode(format!("resampling failed: {}", soxr_message(error))));
        }
        Ok(Self(handle))
    }

    /// Feeds `input` (or, with `None`, flushes the filter's tail) and returns how many samples
    /// were written at the start of `out`.
    fn process(&mut self, input: Option<&[f32]>, out: &mut [f32]) -> Result<usize, AudioError> {
        let (input_ptr, input_len) = input.map_or((std::ptr::null(), 0), |i| (i.as_ptr().cast(), i.len()));
        let (mut consumed, mut written) = (0usize, 0usize);
        // SAFETY: `self.0` is a live handle; the input pointer is valid for `input_len` f32s (or
        // null to flush), the output for `out.len()` f32s, one channel interleaved as created;
        // soxr writes at most `out.len()` samples and the counts through valid pointers.
        let error = unsafe {
            soxr_sys::soxr_process(self.0, input_ptr, input_len, &mut consumed, out.as_mut_ptr().cast(), out.len(), &mut written)
        };
        if !error.is_null() {
            return Err(AudioError::Decode(format!("resampling failed: {}", soxr_message(error))));
        }
        Ok(written)
    }
}

impl Drop for Soxr {
    fn drop(&mut self) {
        // SAFETY: the handle came from soxr_create and is deleted only here.
        unsafe { soxr_sys::soxr_delete(self.0) }
    }
}

/// libsoxr's error, a static C string (or none).
fn soxr_message(error: soxr_sys::soxr_error_t) -> String {
    if error.is_null() {
        return "unknown error".into();
    }
    // SAFETY: libsoxr's errors are pointers to static NUL-terminated strings.
    unsafe { std::ffi::CStr::from_ptr(error) }.to_string_lossy().into_owned()
}

/// A symphonia error in a sentence (its unsupported-format errors name what is missing).
fn describe(e: &SymphoniaError) -> String {
    match e {
        SymphoniaError::Unsupported(what) => format!("unsupported {what}"),
        SymphoniaError::IoError(io) => format!("the file ends early or is not audio ({io})"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 16-bit PCM WAV file of `samples` at `rate` Hz with `channels` interleaved.
    pub(crate) fn wav(samples: &[i16], rate: u32, channels: u16) -> Vec<u8> {
        let data = samples.len() * 2;
        let mut out = Vec::with_capacity(44 + data);
        out.extend(b"RIFF");
        out.extend(((36 + data) as u32).to_le_bytes());
        out.extend(b"WAVEfmt ");
        out.extend(16u32.to_le_bytes());
        out.extend(1u16.to_le_bytes());
        out.extend(channels.to_le_bytes());
        out.extend(rate.to_le_bytes());
        out.extend((rate * channels as u32 * 2).to_le_bytes());
        out.extend((channels * 2).to_le_bytes());
        out.extend(16u16.to_le_bytes());
        out.extend(b"data");
        out.extend((data as u32).to_le_bytes());
        samples.iter().for_each(|s| out.extend(s.to_le_bytes()));
        out
    }

    #[test]
    fn pcm_decodes_exactly_and_channels_are_averaged() {
        let limits = AudioLimits::default();
        let wave = decode_mono(&wav(&[0, 16384, -32768, 8192], 16000, 1), 16000, 100, &limits).unwrap();
        assert_eq!(wave, vec![0.0, 0.5, -1.0, 0.25]);
        let stereo = decode_mono(&wav(&[16384, 0, -16384, -16384], 16000, 2), 16000, 100, &limits).unwrap();
        assert_eq!(stereo, vec![0.25, -0.5]);
        // Decoding stops at what the model reads.
        assert_eq!(decode_mono(&wav(&[1; 1000], 16000, 1), 16000, 300, &limits).unwrap().len(), 300);
    }

    #[test]
    fn hostile_headers_are_refused_before_decoding() {
        let limits = AudioLimits { max_declared_seconds: 10.0 };
        // A header that declares an hour of audio (the data chunk's size), over a few bytes.
        let mut bomb = wav(&[0; 8], 16000, 1);
        bomb[4..8].copy_from_slice(&(36 + 16000u32 * 3600 * 2).to_le_bytes());
        bomb[40..44].copy_from_slice(&(16000u32 * 3600 * 2).to_le_bytes());
        let refused = decode_mono(&bomb, 16000, 480_000, &limits);
        assert!(matches!(refused, Err(AudioError::TooLong { .. })), "{refused:?}");
        assert!(matches!(decode_mono(&wav(&[0; 8], 900_000, 1), 16000, 100, &limits), Err(AudioError::Unsupported { .. })));
        assert!(matches!(decode_mono(b"RIFF\x04\0\0\0WAVE", 16000, 100, &limits), Err(AudioError::Format(_) | AudioError::Decode(_))));
        assert!(matches!(decode_mono(b"not audio at all", 16000, 100, &limits), Err(AudioError::Format(_))));
        // Truncated: the samples it holds.
        let whole = wav(&[1000; 100], 16000, 1);
        assert_eq!(decode_mono(&whole[..44 + 50], 16000, 1000, &AudioLimits::default()).unwrap().len(), 25);
    }

    #[test]
    fn decoding_stops_early_without_changing_what_the_model_hears() {
        // decode_mono resamples only the source samples the model's window needs (plus 0.1 s):
        // its first `max_samples` must be those of the whole file resampled, at every common
        // rate, upsampling included.
        let max_samples = 16000 * 3;
        for from in [8000u32, 22050, 44100, 48000] {
            let n = from as usize * 5;
            let mut state = 1u32;
            let wave: Vec<f32> = (0..n)
                .map(|i| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    0.5 * (i as f32 * 0.01).sin() + (state >> 8) as f32 / (1u32 << 24) as f32 * 0.1 - 0.05
                })
                .collect();
            let pcm: Vec<i16> = wave.iter().map(|v| (v * 32767.0) as i16).collect();
            let early = decode_mono(&wav(&pcm, from, 1), 16000, max_samples, &AudioLimits::default()).unwrap();
            let whole = resample(&pcm.iter().map(|&v| v as f32 / 32768.0).collect::<Vec<_>>(), from, 16000).unwrap();
            assert_eq!(early.len(), max_samples);
            let worst = early.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-6, "{from} Hz: {worst}");
        }
    }

    #[test]
    fn resampling_keeps_length_and_tone() {
        // A 440 Hz tone at 22050 Hz, resampled to 16 kHz: ceil(n · 16000 / 22050) samples of
        // the same tone.
        let n = 22050;
        let tone: Vec<f32> = (0..n).map(|i| (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 22050.0).sin()).collect();
        let out = resample(&tone, 22050, 16000).unwrap();
        assert_eq!(out.len(), 16000);
        let worst = out[200..15800]
            .iter()
            .enumerate()
            .map(|(i, v)| (v - (2.0 * std::f32::consts::PI * 440.0 * (i + 200) as f32 / 16000.0).sin()).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-3, "{worst}");
    }
}
