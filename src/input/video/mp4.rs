//! The part of an MP4 (ISO BMFF) file a video needs, read with every size and count checked
//! against the bytes that hold it: the first H.264 video track's sample entry (`avc1`, its
//! `avcC` parameter sets), its frame size (`tkhd`), timescale (`mdhd`), and its sample table
//! (`stts`, `stsz`, `stsc`, `stco`/`co64`) as byte ranges in decode order.
//!
//! Why not a demuxer crate: the one that fits (re_mp4) loops forever on a box whose size is
//! under its own header (found by this module's fuzz test), and builds a table entry for every
//! sample a 20-byte `stsz` declares; a server reading untrusted uploads needs a reader that
//! cannot do either. This one reads only what is listed above and refuses the rest:
//! fragmented files (`moof`), and parameter sets carried in the stream (`avc3`).

use std::ops::Range;

/// Why a file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mp4Error {
    /// What is wrong with it, for the client's 400.
    Invalid(String),
    /// Its sample table declares more frames than the caller allows.
    TooManySamples(u64),
}

impl From<String> for Mp4Error {
    fn from(message: String) -> Self {
        Mp4Error::Invalid(message)
    }
}

impl From<&str> for Mp4Error {
    fn from(message: &str) -> Self {
        Mp4Error::Invalid(message.to_string())
    }
}

/// One box: its type and its body (the bytes after its header).
struct Mp4Box<'a> {
    kind: [u8; 4],
    body: &'a [u8],
}

/// The boxes of `data`, in order; a box that does not fit its parent, or whose size is under
/// its header, is an error (a size of 0 runs to the end of `data`, as the format says).
fn boxes(data: &[u8]) -> impl Iterator<Item = Result<Mp4Box<'_>, Mp4Error>> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= data.len() {
            return None;
        }
        let rest = &data[at..];
        let item = (|| {
            let head = rest.get(..8).ok_or(Mp4Error::from("a box header is cut short"))?;
            let size32 = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as u64;
            let kind = [head[4], head[5], head[6], head[7]];
            let (header, size) = match size32 {
                0 => (8, rest.len() as u64),
                1 => {
                    let large = rest.get(8..16).ok_or(Mp4Error::from("a box header is cut short"))?;
                    let mut b = [0u8; 8];
                    b.copy_from_slice(large);
                    (16, u64::from_be_bytes(b))
                }
                s => (8, s),
            };
            if size < header as u64 || size > rest.len() as u64 {
                return Err(Mp4Error::from(format!("the `{}` box's size ({size}) does not fit the file", String::from_utf8_lossy(&kind))));
            }
            let size = size as usize;
            Ok((Mp4Box { kind, body: &rest[header..size] }, size))
        })();
        match item {
            Ok((b, size)) => {
                at += size;
                Some(Ok(b))
            }
            Err(e) => {
                at = data.len();
                Some(Err(e))
            }
        }
    })
}

/// The first child of `data` of type `kind`.
fn child<'a>(data: &'a [u8], kind: &[u8; 4]) -> Result<Option<&'a [u8]>, Mp4Error> {
    for b in boxes(data) {
        let b = b?;
        if &b.kind == kind {
            return Ok(Some(b.body));
        }
    }
    Ok(None)
}

fn need<'a>(data: &'a [u8], kind: &[u8; 4]) -> Result<&'a [u8], Mp4Error> {
    child(data, kind)?.ok_or_else(|| Mp4Error::from(format!("it has no `{}` box", String::from_utf8_lossy(kind))))
}

/// Big-endian integers at an offset, checked.
fn u8_at(d: &[u8], at: usize) -> Result<u8, Mp4Error> {
    d.get(at).copied().ok_or_else(|| Mp4Error::from("a box is cut short"))
}
fn bytes_at<const N: usize>(d: &[u8], at: usize) -> Result<[u8; N], Mp4Error> {
    let mut out = [0u8; N];
    out.copy_from_slice(d.get(at..at.checked_add(N).ok_or("a box is cut short")?).ok_or("a box is cut short")?);
    Ok(out)
}
fn u16_at(d: &[u8], at: usize) -> Result<u16, Mp4Error> {
    bytes_at(d, at).map(u16::from_be_bytes)
}
fn u32_at(d: &[u8], at: usize) -> Result<u32, Mp4Error> {
    bytes_at(d, at).map(u32::from_be_bytes)
}
fn u64_at(d: &[u8], at: usize) -> Result<u64, Mp4Error> {
    bytes_at(d, at).map(u64::from_be_bytes)
}

/// A full box's table: its entry count (after version and flags), checked against the bytes
/// left for `entry` bytes each.
fn table(body: &[u8], skip: usize, entry: usize) -> Result<(usize, &[u8]), Mp4Error> {
    let count = u32_at(body, skip)? as usize;
    let rest = body.get(skip + 4..).ok_or("a box is cut short")?;
    if entry > 0 && count > rest.len() / entry {
        return Err("a sample table declares more entries than it holds".into());
    }
    Ok((count, rest))
}

/// An H.264 track as the decoder needs it.
#[derive(Debug)]
pub struct AvcTrack {
    pub width: usize,
    pub height: usize,
    pub timescale: u64,
    /// Σ of the samples' durations, in `timescale` units.
    pub duration: u64,
    /// Bytes of each NAL unit's length prefix.
    pub length_size: usize,
    pub sps: Vec<Vec<u8>>,
    pub pps: Vec<Vec<u8>>,
    /// Each sample's bytes in the file, in decode order.
    pub samples: Vec<Range<usize>>,
}

/// Reads the file's first H.264 video track; `max_samples` bounds the table built.
pub fn avc_track(file: &[u8], max_samples: u64) -> Result<AvcTrack, Mp4Error> {
    if !matches!(file.get(4..8), Some(b"ftyp" | b"moov" | b"free" | b"skip" | b"wide" | b"mdat")) {
        return Err("not an MP4 file".into());
    }
    let mut moov = None;
    for b in boxes(file) {
        let b = b?;
        match &b.kind {
            b"moov" if moov.is_none() => moov = Some(b.body),
            b"moof" => return Err("it is a fragmented MP4, which this server does not read; remux it (ffmpeg -movflags +faststart)".into()),
            _ => {}
        }
    }
    let moov = moov.ok_or(Mp4Error::from("it has no `moov` box (truncated, or not an MP4 file)"))?;
    let mut other_video = false;
    for trak in boxes(moov) {
        let trak = trak?;
        if &trak.kind != b"trak" {
            continue;
        }
        let mdia = need(trak.body, b"mdia")?;
        let hdlr = need(mdia, b"hdlr")?;
        if hdlr.get(8..12) != Some(b"vide") {
            continue;
        }
        let stbl = need(need(mdia, b"minf")?, b"stbl")?;
        let stsd = need(stbl, b"stsd")?;
        let entry =
            boxes(stsd.get(8..).ok_or("a box is cut short")?).next().ok_or(Mp4Error::from("its video track has no sample entry"))??;
        match &entry.kind {
            b"avc1" => {}
            b"avc3" => {
                return Err("its H.264 track carries its parameter sets in the stream (avc3), which this server does not read".into())
            }
            _ => {
                other_video = true;
                continue;
            }
        }
        return read_avc(trak.body, mdia, stbl, entry.body, file.len(), max_samples);
    }
    Err(Mp4Error::from(if other_video {
        "it holds no H.264 (AVC) video track; other codecs are not decoded"
    } else {
        "it has no video track"
    }))
}

fn read_avc(trak: &[u8], mdia: &[u8], stbl: &[u8], avc1: &[u8], file_len: usize, max_samples: u64) -> Result<AvcTrack, Mp4Error> {
    let tkhd = need(trak, b"tkhd")?;
    // Width and height are the last two 16.16 fields of either version.
    let (width, height) = match u8_at(tkhd, 0)? {
        0 => (u32_at(tkhd, 76)? >> 16, u32_at(tkhd, 80)? >> 16),
        _ => (u32_at(tkhd, 88)? >> 16, u32_at(tkhd, 92)? >> 16),
    };
    let mdhd = need(mdia, b"mdhd")?;
    let timescale = match u8_at(mdhd, 0)? {
        0 => u32_at(mdhd, 12)?,
        _ => u32_at(mdhd, 20)?,
    } as u64;
    // The visual sample entry's 78 bytes, then its boxes.
    let avcc = need(avc1.get(78..).ok_or(Mp4Error::from("the H.264 sample entry is cut short"))?, b"avcC")?;
    let length_size = (u8_at(avcc, 4)? & 3) as usize + 1;
    let mut at = 5;
    let sets = |at: &mut usize, mask: u8| -> Result<Vec<Vec<u8>>, Mp4Error> {
        let n = u8_at(avcc, *at)? & mask;
        *at += 1;
        (0..n)
            .map(|_| {
                let len = u16_at(avcc, *at)? as usize;
                let nal = avcc.get(*at + 2..*at + 2 + len).ok_or(Mp4Error::from("the avcC box is cut short"))?.to_vec();
                *at += 2 + len;
                Ok(nal)
            })
            .collect()
    };
    let sps = sets(&mut at, 0x1f)?;
    let pps = sets(&mut at, 0xff)?;
    // Sample sizes.
    let stsz = need(stbl, b"stsz")?;
    let (fixed, count) = (u32_at(stsz, 4)? as u64, u32_at(stsz, 8)? as u64);
    if count > max_samples {
        return Err(Mp4Error::TooManySamples(count));
    }
    let count = count as usize;
    let sizes: Vec<u64> = if fixed != 0 {
        vec![fixed; count]
    } else {
        let (n, rest) = table(stsz, 8, 4)?;
        if n != count {
            return Err("its sample size table is inconsistent".into());
        }
        (0..n).map(|i| u32_at(rest, 4 * i).map(u64::from)).collect::<Result<_, _>>()?
    };
    // Durations.
    let (runs, rest) = table(need(stbl, b"stts")?, 4, 8)?;
    let (mut covered, mut duration) = (0u64, 0u64);
    for i in 0..runs {
        let (n, delta) = (u32_at(rest, 8 * i)? as u64, u32_at(rest, 8 * i + 4)? as u64);
        covered = covered.saturating_add(n);
        duration = duration.saturating_add(n.saturating_mul(delta));
    }
    if covered != count as u64 {
        return Err("its time table does not cover its frames".into());
    }
    // Chunks: their offsets, and how many samples each holds.
    let offsets: Vec<u64> = match (child(stbl, b"stco")?, child(stbl, b"co64")?) {
        (Some(stco), _) => {
            let (n, rest) = table(stco, 4, 4)?;
            (0..n).map(|i| u32_at(rest, 4 * i).map(u64::from)).collect::<Result<_, _>>()?
        }
        (None, Some(co64)) => {
            let (n, rest) = table(co64, 4, 8)?;
            (0..n).map(|i| u64_at(rest, 8 * i)).collect::<Result<_, _>>()?
        }
        (None, None) => return Err("it has no chunk offset table".into()),
    };
    let (runs, rest) = table(need(stbl, b"stsc")?, 4, 12)?;
    let stsc: Vec<(u64, u64)> =
        (0..runs).map(|i| Ok((u32_at(rest, 12 * i)? as u64, u32_at(rest, 12 * i + 4)? as u64))).collect::<Result<_, Mp4Error>>()?;
    let mut samples = Vec::with_capacity(count);
    let mut next = sizes.iter();
    'chunks: for (chunk, &offset) in offsets.iter().enumerate() {
        let chunk = chunk as u64 + 1;
        // The run whose first chunk is the last at or before this one.
        let per_chunk = stsc.iter().rev().find(|(first, _)| *first <= chunk).map_or(0, |r| r.1);
        let mut at = offset;
        for _ in 0..per_chunk {
            let Some(&size) = next.next() else { break 'chunks };
            let end = at
                .checked_add(size)
                .filter(|&e| e <= file_len as u64)
                .ok_or(Mp4Error::from("a frame lies past the end of the file (truncated?)"))?;
            samples.push(at as usize..end as usize);
            at = end;
        }
    }
    if samples.len() != count {
        return Err("its chunk tables do not hold all its frames".into());
    }
    Ok(AvcTrack { width: width as usize, height: height as usize, timescale, duration, length_size, sps, pps, samples })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_under_their_header_or_past_their_parent_are_errors() {
        // A box of size 3: the loop that re_mp4 entered forever.
        let mut file = b"\0\0\0\x10ftypisom\0\0\0\0".to_vec();
        file.extend_from_slice(b"\0\0\0\x03moov");
        assert!(avc_track(&file, 10).is_err());
        let mut file = b"\0\0\0\x10ftypisom\0\0\0\0".to_vec();
        file.extend_from_slice(b"\0\0\x10\x00moov\0\0");
        assert!(matches!(avc_track(&file, 10), Err(Mp4Error::Invalid(m)) if m.contains("does not fit")));
        assert!(avc_track(b"\0\0\0\x01ftyp\0\0\0\0\0\0\0\x04", 10).is_err());
    }
}
