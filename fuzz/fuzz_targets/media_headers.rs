//! The checks a medium's bytes meet before any decoding (image, audio and video headers) and
//! the data URLs images come in: whatever the bytes, an answer (accepted or refused), never a
//! panic, a hang or an allocation the header claims.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolserve::input::{audio, image, video};

fuzz_target!(|data: &[u8]| {
    let _ = image::check_header(data, &image::ImageLimits::default());
    let _ = audio::decode::check_header(data, 16_000, 16_000 * 30, &audio::AudioLimits::default());
    let _ = video::check_header(data, &video::VideoLimits::default());
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = image::decode_data_url(text);
    }
});
