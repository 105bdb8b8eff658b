use super::*;

fn wav(rate: u32, extra_chunk: Option<(&[u8; 4], u32, usize)>) -> Vec<u8> {
    let mut b = b"RIFF\0\0\0\0WAVEfmt ".to_vec();
    b.extend(16u32.to_le_bytes());
    b.extend(1u16.to_le_bytes()); // PCM
    b.extend(1u16.to_le_bytes()); // mono
    b.extend(rate.to_le_bytes());
    b.extend((rate * 2).to_le_bytes());
    b.extend(2u16.to_le_bytes());
    b.extend(16u16.to_le_bytes());
    if let Some((id, claimed, present)) = extra_chunk {
        b.extend(id);
        b.extend(claimed.to_le_bytes());
        b.extend(vec![b'x'; present]);
    }
    b.extend(b"data");
    b.extend(u32::MAX.to_le_bytes());
    b.extend([0u8; 64]);
    b
}

#[test]
fn wav_with_sound_headers_passes_and_a_zero_rate_is_refused() {
    assert!(container(&wav(16_000, Some((b"LIST", 4, 4)))).is_ok());
    assert!(matches!(container(&wav(0, None)), Err(AudioError::Unsupported { what: "sample rate", value: 0, .. })));
}

#[test]
fn wav_chunk_longer_than_the_file_is_refused() {
    let e = container(&wav(16_000, Some((b"LIST", 3_000_000_000, 8)))).unwrap_err();
    assert!(e.to_string().contains("'LIST' claims 3000000000 bytes"), "{e}");
}

#[test]
fn the_fuzzers_wav_with_rate_0_is_refused() {
    let bytes = include_bytes!("../../../../fuzz/regressions/wav_sample_rate_0_panics.wav");
    assert!(container(bytes).is_err());
}

#[test]
fn the_fuzzers_flac_comment_claiming_3_gb_is_refused() {
    let bytes = include_bytes!("../../../../fuzz/regressions/flac_comment_claims_3_gb.flac");
    // Its comment block claims 2 MB of a 336-byte file (and the comment in it 3.2 GB).
    let e = container(bytes).unwrap_err();
    assert!(e.to_string().contains("FLAC metadata block claims"), "{e}");
}

fn comment(vendor: &[u8], comments: &[(u32, &[u8])]) -> Vec<u8> {
    let mut b = (vendor.len() as u32).to_le_bytes().to_vec();
    b.extend(vendor);
    b.extend((comments.len() as u32).to_le_bytes());
    for (len, text) in comments {
        b.extend(len.to_le_bytes());
        b.extend(*text);
    }
    b
}

fn flac_with(block_type: u8, block: &[u8]) -> Vec<u8> {
    let mut b = b"fLaC".to_vec();
    b.push(0); // STREAMINFO, not last
    b.extend(&34u32.to_be_bytes()[1..]);
    b.extend([0u8; 34]);
    b.push(0x80 | block_type);
    b.extend(&(block.len() as u32).to_be_bytes()[1..]);
    b.extend(block);
    b.extend([0xff, 0xf8, 0, 0]);
    b
}

#[test]
fn flac_comments_and_pictures_are_walked() {
    assert!(container(&flac_with(4, &comment(b"lavf", &[(5, b"A=bcd")]))).is_ok());
    assert!(container(&flac_with(4, &comment(b"lavf", &[(u32::MAX, b"A=bcd")]))).is_err());
    let mut picture = 3u32.to_be_bytes().to_vec();
    picture.extend(9u32.to_be_bytes());
    picture.extend(b"image/png");
    picture.extend(0u32.to_be_bytes());
    picture.extend([0u8; 16]);
    picture.extend(4u32.to_be_bytes());
    picture.extend([1, 2, 3, 4]);
    assert!(container(&flac_with(6, &picture)).is_ok());
    let n = picture.len();
    picture[n - 8..n - 4].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    assert!(container(&flac_with(6, &picture)).is_err());
}

fn ogg_page(serial: u32, sequence: u32, packets: &[&[u8]]) -> Vec<u8> {
    let mut table = Vec::new();
    let mut body: Vec<u8> = Vec::new();
    for p in packets {
        table.extend(std::iter::repeat_n(255u8, p.len() / 255));
        table.push((p.len() % 255) as u8);
        body.extend(*p);
    }
    let mut page = b"OggS\0\x02".to_vec();
    page.extend(0u64.to_le_bytes());
    page.extend(serial.to_le_bytes());
    page.extend(sequence.to_le_bytes());
    page.extend(0u32.to_le_bytes());
    page.push(table.len() as u8);
    page.extend(table);
    page.extend(body);
    let crc = ogg_crc(&page);
    page[22..26].copy_from_slice(&crc.to_le_bytes());
    page
}

#[test]
fn ogg_crc_matches_a_known_page() {
    // Any page whose stored CRC we computed must verify; a flipped byte must not.
    let page = ogg_page(7, 0, &[b"hello"]);
    assert_eq!(u32_le(&page, 22), Some(ogg_crc(&page)));
    let mut bad = page.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert_ne!(u32_le(&bad, 22), Some(ogg_crc(&bad)));
}

#[test]
fn ogg_comment_headers_are_checked_in_their_streams() {
    let ident = b"\x01vorbis-identification-header".as_slice();
    let mut good = b"\x03vorbis".to_vec();
    good.extend(comment(b"Xiph", &[(7, b"TITLE=x")]));
    let mut file = ogg_page(1, 0, &[ident]);
    file.extend(ogg_page(1, 1, &[&good]));
    assert!(container(&file).is_ok());

    let mut hostile = b"OpusTags".to_vec();
    hostile.extend(comment(b"Xiph", &[(3_000_000_000, b"A=b")]));
    let mut file = ogg_page(2, 0, &[b"OpusHead-and-some-more-bytes"]);
    file.extend(ogg_page(2, 1, &[&hostile]));
    assert!(container(&file).unwrap_err().to_string().contains("Opus tags header"));

    // A page whose CRC fails is skipped by the reader, and so here.
    let mut file = ogg_page(2, 0, &[b"OpusHead-and-some-more-bytes"]);
    let mut broken = ogg_page(2, 1, &[&hostile]);
    broken[30] ^= 0xff;
    file.extend(broken);
    assert!(container(&file).is_ok());
}

#[test]
fn id3v2_frames_must_fit_in_the_tag() {
    let mut tag = b"ID3\x03\0\0".to_vec();
    let mut frames = b"TIT2".to_vec();
    frames.extend(5u32.to_be_bytes());
    frames.extend([0, 0, 0, b'a', b'b', b'c', b'd']);
    frames.extend([0u8; 10]);
    tag.extend([0, 0, 0, frames.len() as u8]);
    tag.extend(&frames);
    tag.extend([0xff, 0xfb, 0x90, 0x64]);
    tag.extend([0u8; 32]);
    assert!(container(&tag).is_ok());
    tag[14..18].copy_from_slice(&0xf000_0000u32.to_be_bytes());
    assert!(container(&tag).unwrap_err().to_string().contains("ID3v2 frame claims"));
}

/// Writes `value` in `n` bits, least significant first.
fn put(bits: &mut Vec<bool>, value: u64, n: u32) {
    bits.extend((0..n).map(|i| value >> i & 1 == 1));
}

fn setup_with_codebook(dimensions: u64, entries: u64) -> Vec<u8> {
    let mut bits = Vec::new();
    put(&mut bits, 0, 8); // one codebook
    put(&mut bits, 0x56_4342, 24);
    put(&mut bits, dimensions, 16);
    put(&mut bits, entries, 24);
    put(&mut bits, 1, 1); // ordered
    put(&mut bits, 0, 5); // first length
    put(&mut bits, entries, 32 - (entries as u32).leading_zeros()); // all entries at once
    put(&mut bits, 1, 4); // lookup type 1
    put(&mut bits, 0, 32 + 32);
    put(&mut bits, 0, 4 + 1);
    put(&mut bits, 0, 64); // a value or two
    let mut extra = vec![0u8; 30];
    extra.extend(b"\x05vorbis");
    extra.extend(bits.chunks(8).map(|c| c.iter().enumerate().fold(0u8, |b, (i, &on)| b | (u8::from(on) << i))));
    extra
}

#[test]
fn vorbis_codebooks_that_would_take_terabytes_are_refused() {
    assert!(vorbis_setup(&setup_with_codebook(2, 256)).is_ok());
    let e = vorbis_setup(&setup_with_codebook(65_535, (1 << 24) - 1)).unwrap_err();
    assert!(e.to_string().contains("codebooks would take"), "{e}");
    assert!(vorbis_setup(&setup_with_codebook(0, 16)).is_err());
}

#[test]
fn lookup1_values_is_the_integer_root() {
    assert_eq!(lookup1_values(256, 2), 16);
    assert_eq!(lookup1_values(255, 2), 15);
    assert_eq!(lookup1_values(81, 4), 3);
    assert_eq!(lookup1_values(1 << 24, 65_535), 1);
}
