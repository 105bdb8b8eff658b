//! Audio decoded, not only its header checked: the first second at 16 kHz of whatever the bytes
//! hold, through the screen, symphonia's demuxers and codecs and the resampler. An answer or
//! an error, never a panic, a hang or an allocation a header claims.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolserve::input::audio;

fuzz_target!(|data: &[u8]| {
    let _ = audio::decode::decode_mono(data, 16_000, 16_000, &audio::AudioLimits::default());
});
