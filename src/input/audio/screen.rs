//! The lengths in an audio file's headers that symphonia 0.5 allocates before it checks them,
//! checked here first against the bytes the file really has.
//!
//! symphonia reads a length field and makes a buffer of that size, then reads into it: a 60-byte
//! file can ask for 4 GiB (a Vorbis comment in FLAC, OGG/Vorbis or Opus; a FLAC picture; an
//! ID3v2 frame; a RIFF INFO chunk), and a Vorbis setup header of a few bytes can ask for
//! terabytes (a codebook of 2^24 entries × 65,535 dimensions), which aborts the process when the
//! allocation fails. A WAV with a sample rate of 0 makes it divide by zero. The fuzzer
//! (`fuzz/`, target `media_headers`) found the first two; the rest were found by reading the
//! same readers. Every check here refuses only what the reader itself could not use: a length
//! larger than the bytes that follow it cannot be read whole, so the file is refused before
//! symphonia tries. Files that pass are handed to symphonia unchanged.
//!
//! The walk follows symphonia's probe: it scans for the first marker it knows (RIFF, fLaC,
//! OggS, ID3, an MPEG sync word), checks that element, and after an ID3v2 tag scans on, as the
//! probe does.

use super::AudioError;

/// How far the probe looks for a marker (symphonia's `Probe::PROBE_SEARCH_LIMIT`).
const PROBE_SEARCH_LIMIT: usize = 1 << 20;
/// The most memory a Vorbis setup header's codebooks may make the decoder allocate. The
/// codebooks libvorbis writes take well under 1 MB; a header past this was made to hurt.
const MAX_VORBIS_CODEBOOK_BYTES: u64 = 64 << 20;

/// The markers symphonia's probe registers for the formats this server enables (wav, flac,
/// ogg, mp1/2/3) and the ID3v2 metadata reader.
const MPEG_SYNC_SECOND_BYTES: [u8; 18] =
    [0xfe, 0xff, 0xf6, 0xf7, 0xe6, 0xe7, 0xfc, 0xfd, 0xf4, 0xf5, 0xe4, 0xe5, 0xfa, 0xfb, 0xf2, 0xf3, 0xe2, 0xe3];

fn refuse(what: String) -> AudioError {
    AudioError::Format(what)
}

/// Checks the container the probe will find in `bytes` (see the module comment).
pub fn container(bytes: &[u8]) -> Result<(), AudioError> {
    let mut from: usize = 0;
    loop {
        let end = bytes.len().min(from.saturating_add(PROBE_SEARCH_LIMIT));
        let Some(at) = (from..end).find(|&i| marker_at(&bytes[i..]).is_some()) else { return Ok(()) };
        let rest = &bytes[at..];
        match marker_at(rest) {
            Some(Marker::Id3) => match id3v2(rest)? {
                Some(tag_len) => from = at + tag_len,
                None => return Ok(()),
            },
            Some(Marker::Riff) => return riff(rest),
            Some(Marker::Flac) => return flac(rest),
            Some(Marker::Ogg) => return ogg(rest),
            Some(Marker::Mpeg) | None => return Ok(()),
        }
    }
}

enum Marker {
    Id3,
    Riff,
    Flac,
    Ogg,
    Mpeg,
}

fn marker_at(b: &[u8]) -> Option<Marker> {
    // The probe reads 16 bytes at a candidate before it compares markers.
    if b.len() < 16 {
        return None;
    }
    match b {
        [b'I', b'D', b'3', ..] => Some(Marker::Id3),
        [b'R', b'I', b'F', b'F', ..] => Some(Marker::Riff),
        [b'f', b'L', b'a', b'C', ..] => Some(Marker::Flac),
        [b'O', b'g', b'g', b'S', ..] => Some(Marker::Ogg),
        [0xff, second, ..] if MPEG_SYNC_SECOND_BYTES.contains(second) => Some(Marker::Mpeg),
        _ => None,
    }
}

fn u32_le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u32_be(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u24_be(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(3)?)?;
    Some(u32::from(s[0]) << 16 | u32::from(s[1]) << 8 | u32::from(s[2]))
}

fn syncsafe(b: &[u8], at: usize) -> Option<u32> {
    Some(b.get(at..at.checked_add(4)?)?.iter().fold(0u32, |v, &x| v << 7 | u32::from(x & 0x7f)))
}

/// RIFF/WAVE: every chunk before `data` must fit in the file (an INFO string is allocated at its
/// chunk's length), and the format's sample rate must not be 0. `data` itself may claim more
/// than is there: streaming writers leave its length unset, and the reader stops at the end.
fn riff(b: &[u8]) -> Result<(), AudioError> {
    if b.get(8..12) != Some(b"WAVE") {
        return Ok(());
    }
    let mut at = 12;
    while let (Some(id), Some(len)) = (b.get(at..at + 4), u32_le(b, at + 4)) {
        let body = at + 8;
        if id == b"data" {
            return Ok(());
        }
        let left = b.len() - body;
        if len as usize > left {
            return Err(refuse(format!(
                "the WAV chunk '{}' claims {len} bytes and the file has {left} after it",
                String::from_utf8_lossy(id)
            )));
        }
        if id == b"fmt " && u32_le(b, body + 4) == Some(0) {
            return Err(AudioError::Unsupported { what: "sample rate", value: 0, limit: "at most 192000 Hz" });
        }
        at = body + len as usize + (len as usize & 1);
    }
    Ok(())
}

/// Native FLAC: each metadata block must fit in the file, and the lengths inside a Vorbis
/// comment or a picture in the block.
fn flac(b: &[u8]) -> Result<(), AudioError> {
    let mut at = 4;
    loop {
        let (Some(&head), Some(len)) = (b.get(at), u24_be(b, at + 1)) else { return Ok(()) };
        let body = at + 4;
        let left = b.len() - body.min(b.len());
        if len as usize > left {
            return Err(refuse(format!("a FLAC metadata block claims {len} bytes and the file has {left} after it")));
        }
        let block = &b[body..body + len as usize];
        match head & 0x7f {
            4 => vorbis_comment(block, "a FLAC Vorbis comment")?,
            6 => flac_picture(block)?,
            _ => {}
        }
        if head & 0x80 != 0 {
            return Ok(());
        }
        at = body + len as usize;
    }
}

/// Walks a length-prefixed field at `at` of `b`; `None` once the bytes end (the reader stops
/// there too, with an error and no allocation past the end).
fn field(b: &[u8], at: usize, len: Option<u32>, what: &str) -> Result<Option<usize>, AudioError> {
    let Some(len) = len else { return Ok(None) };
    let start = at + 4;
    let left = b.len().saturating_sub(start);
    if len as usize > left {
        return Err(refuse(format!("{what} claims a field of {len} bytes and only {left} follow")));
    }
    Ok(Some(start + len as usize))
}

/// A Vorbis comment without framing (vendor, count, comments), as symphonia reads it for FLAC,
/// OGG/Vorbis and Opus; every length must fit in `b`.
fn vorbis_comment(b: &[u8], what: &str) -> Result<(), AudioError> {
    let Some(mut at) = field(b, 0, u32_le(b, 0), what)? else { return Ok(()) };
    let Some(count) = u32_le(b, at) else { return Ok(()) };
    at += 4;
    for _ in 0..count {
        match field(b, at, u32_le(b, at), what)? {
            Some(next) => at = next,
            None => return Ok(()),
        }
    }
    Ok(())
}

/// A FLAC picture block: its media type, description and data lengths must fit in the block.
fn flac_picture(b: &[u8]) -> Result<(), AudioError> {
    let what = "a FLAC picture";
    let Some(at) = field(b, 4, u32_be(b, 4), what)? else { return Ok(()) };
    let Some(at) = field(b, at, u32_be(b, at), what)? else { return Ok(()) };
    let at = at + 16;
    field(b, at, u32_be(b, at), what).map(|_| ())
}

/// An ID3v2 tag at the start of `b`: each frame must fit in the tag (symphonia allocates a
/// frame's body at its claimed size). Returns the tag's length for the scan to go on after it,
/// or `None` when the reader will stop at this tag anyway.
fn id3v2(b: &[u8]) -> Result<Option<usize>, AudioError> {
    let (version, flags) = (b[3], b[5]);
    let Some(size) = syncsafe(b, 6) else { return Ok(None) };
    if !(2..=4).contains(&version) || b[4] == 0xff || (version == 2 && flags & 0x40 != 0) {
        return Ok(None);
    }
    let tag_end = 10 + size as usize;
    let raw = &b[10..tag_end.min(b.len())];
    // Tag-wide unsynchronisation (before 2.4): the frames are read from the de-unsynchronised
    // bytes, which are never longer than the raw ones.
    let body: std::borrow::Cow<[u8]> = if flags & 0x80 != 0 && version < 4 {
        let mut out = Vec::with_capacity(raw.len());
        for (i, &x) in raw.iter().enumerate() {
            if !(x == 0 && i > 0 && raw[i - 1] == 0xff) {
                out.push(x);
            }
        }
        out.into()
    } else {
        raw.into()
    };
    let mut at = 0;
    if version >= 3 && flags & 0x40 != 0 {
        at = match version {
            3 => 4 + u32_be(&body, 0).unwrap_or(0) as usize,
            _ => syncsafe(&body, 0).unwrap_or(0) as usize,
        };
    }
    let header_len = if version == 2 { 6 } else { 10 };
    while at + header_len <= body.len() && body[at] != 0 {
        let len = match version {
            2 => u24_be(&body, at + 3),
            3 => u32_be(&body, at + 4),
            _ => syncsafe(&body, at + 4),
        }
        .unwrap_or(0) as usize;
        let left = body.len() - at - header_len;
        if len > left {
            return Err(refuse(format!("an ID3v2 frame claims {len} bytes and the tag has {left} after it")));
        }
        at += header_len + len;
    }
    Ok(Some(tag_end))
}

/// OGG: the pages are read as symphonia reads them (synchronised on `OggS`, CRC checked, a bad
/// page skipped) and each logical stream's bytes joined. At every place a packet may start, a
/// Vorbis comment header (`\x03vorbis`) or an Opus tags header (`OpusTags`) must have lengths
/// that fit in the stream's bytes after it. Checking every possible start, not only the ones
/// the reader will use, keeps the check true whatever the reader does with broken pages.
fn ogg(b: &[u8]) -> Result<(), AudioError> {
    let mut streams: Vec<(u32, Vec<u8>, Vec<usize>)> = Vec::new();
    let mut at = 0;
    while let Some(found) = b[at..].windows(4).position(|w| w == b"OggS") {
        let page = &b[at + found..];
        at += found + 1;
        let Some(&segments) = page.get(26) else { break };
        let Some(table) = page.get(27..27 + segments as usize) else { break };
        let body_len: usize = table.iter().map(|&s| s as usize).sum();
        let header_len = 27 + segments as usize;
        let Some(whole) = page.get(..header_len + body_len) else { break };
        if u32_le(whole, 22) != Some(ogg_crc(whole)) {
            continue;
        }
        at += whole.len() - 1;
        let serial = u32_le(whole, 14).unwrap_or(0);
        let index = match streams.iter().position(|s| s.0 == serial) {
            Some(i) => i,
            None => {
                streams.push((serial, Vec::new(), Vec::new()));
                streams.len() - 1
            }
        };
        let (_, bytes, starts) = &mut streams[index];
        starts.push(bytes.len());
        let mut offset = bytes.len();
        for &lace in table {
            offset += lace as usize;
            if lace < 255 {
                starts.push(offset);
            }
        }
        bytes.extend_from_slice(&whole[header_len..]);
    }
    for (_, bytes, starts) in &streams {
        for &start in starts {
            let packet = &bytes[start.min(bytes.len())..];
            if let Some(comment) = packet.strip_prefix(b"\x03vorbis") {
                vorbis_comment(comment, "an OGG Vorbis comment header")?;
            } else if let Some(comment) = packet.strip_prefix(b"OpusTags") {
                vorbis_comment(comment, "an Opus tags header")?;
            }
        }
    }
    Ok(())
}

/// OGG's page checksum: CRC-32 with polynomial 0x04c11db7, no reflection, initial value 0,
/// computed with the checksum field read as zero.
fn ogg_crc(page: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u32; 256];
        for (i, entry) in table.iter_mut().enumerate() {
            let mut r = (i as u32) << 24;
            for _ in 0..8 {
                r = if r & 0x8000_0000 != 0 { (r << 1) ^ 0x04c1_1db7 } else { r << 1 };
            }
            *entry = r;
        }
        table
    });
    page.iter().enumerate().fold(0u32, |crc, (i, &byte)| {
        let byte = if (22..26).contains(&i) { 0 } else { byte };
        (crc << 8) ^ table[((crc >> 24) as u8 ^ byte) as usize]
    })
}

/// The Vorbis decoder's setup (its `extra_data`: the identification header, then the setup
/// header): the codebooks it would build must fit in [`MAX_VORBIS_CODEBOOK_BYTES`]. symphonia
/// makes each codebook's tables at the declared entries × dimensions before it reads a value.
pub fn vorbis_setup(extra_data: &[u8]) -> Result<(), AudioError> {
    // The identification header is 30 bytes; the setup header opens with `\x05vorbis`.
    let Some(setup) = extra_data.get(30..).and_then(|s| s.strip_prefix(b"\x05vorbis")) else { return Ok(()) };
    let mut bits = LsbBits { bytes: setup, at: 0 };
    let Some(count) = bits.read(8) else { return Ok(()) };
    let mut total: u64 = 0;
    for _ in 0..=count {
        match codebook_cost(&mut bits)? {
            Some(cost) => total += cost,
            None => break,
        }
        if total > MAX_VORBIS_CODEBOOK_BYTES {
            return Err(refuse(format!(
                "the Vorbis setup header's codebooks would take {} MB; at most {} MB is decoded",
                total >> 20,
                MAX_VORBIS_CODEBOOK_BYTES >> 20
            )));
        }
    }
    Ok(())
}

/// Reads one codebook header as symphonia's `VorbisCodebook::read` does and returns what its
/// tables would take in bytes; `None` where the reader would stop (bad sync, end of data).
fn codebook_cost(bits: &mut LsbBits) -> Result<Option<u64>, AudioError> {
    let (Some(0x56_4342), Some(dimensions), Some(entries), Some(ordered)) = (bits.read(24), bits.read(16), bits.read(24), bits.read(1))
    else {
        return Ok(None);
    };
    if ordered == 0 {
        let Some(sparse) = bits.read(1) else { return Ok(None) };
        for _ in 0..entries {
            let used = if sparse == 1 { bits.read(1) } else { Some(1) };
            match used {
                Some(1) if bits.read(5).is_none() => return Ok(None),
                None => return Ok(None),
                _ => {}
            }
        }
    } else {
        if bits.read(5).is_none() {
            return Ok(None);
        }
        let mut current = 0u32;
        while current < entries {
            let Some(number) = bits.read(32 - (entries - current).leading_zeros()) else { return Ok(None) };
            current = current.saturating_add(number);
        }
        if current > entries {
            return Ok(None);
        }
    }
    // code lengths (1 byte), codewords and values (4 bytes each), the lookup tree (about 8).
    let mut cost = u64::from(entries) * 17;
    let Some(lookup) = bits.read(4) else { return Ok(None) };
    if lookup == 1 || lookup == 2 {
        if dimensions == 0 {
            return Err(refuse("a Vorbis codebook has a lookup table of 0 dimensions".into()));
        }
        let (Some(_), Some(_), Some(value_bits), Some(_)) = (bits.read(32), bits.read(32), bits.read(4), bits.read(1)) else {
            return Ok(None);
        };
        // f32 per entry and dimension; the multiplicands are read from the data, so they are
        // bounded by its length.
        cost += u64::from(entries) * u64::from(dimensions) * 4;
        let values = if lookup == 1 { lookup1_values(entries, dimensions) } else { u64::from(entries) * u64::from(dimensions) };
        if cost <= MAX_VORBIS_CODEBOOK_BYTES && !bits.skip(values * (u64::from(value_bits) + 1)) {
            return Ok(None);
        }
    } else if lookup != 0 {
        return Ok(None);
    }
    Ok(Some(cost))
}

/// The greatest `v` with `v^dimensions <= entries` (Vorbis I, 9.2.3).
fn lookup1_values(entries: u32, dimensions: u32) -> u64 {
    let mut v = (f64::from(entries)).powf(1.0 / f64::from(dimensions)).floor() as u64;
    let fits = |v: u64| v.checked_pow(dimensions).is_some_and(|p| p <= u64::from(entries));
    while v > 0 && !fits(v) {
        v -= 1;
    }
    while fits(v + 1) {
        v += 1;
    }
    v
}

/// Vorbis's bit order: least significant bit of each byte first.
struct LsbBits<'a> {
    bytes: &'a [u8],
    at: u64,
}

impl LsbBits<'_> {
    fn read(&mut self, n: u32) -> Option<u32> {
        let mut value = 0u32;
        for i in 0..n {
            let byte = *self.bytes.get((self.at >> 3) as usize)?;
            value |= u32::from(byte >> (self.at & 7) & 1) << i;
            self.at += 1;
        }
        Some(value)
    }

    fn skip(&mut self, n: u64) -> bool {
        self.at = self.at.saturating_add(n);
        self.at <= self.bytes.len() as u64 * 8
    }
}

#[cfg(test)]
mod tests;
