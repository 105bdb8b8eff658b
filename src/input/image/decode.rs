//! Image bytes to RGB: the accepted formats (PNG, JPEG, WebP) decoded with a pixel limit read
//! from the header before any pixel is, converted to 8-bit RGB as Pillow converts; and the
//! `data:` URLs that carry images inline.

use super::{ImageError, ImageInfo, ImageLimits, MAX_ASPECT};
use ::image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};
use std::io::Cursor;

/// What the header says, checked: the format, a JPEG's end marker, the pixel limit and the
/// aspect ratio ([`super::check_header`]); nothing is decoded. A request's images all pass this
/// before the first of them runs, so a bad one late in a long request fails it at once.
pub(super) fn header(bytes: &[u8], limits: &ImageLimits) -> Result<ImageInfo, ImageError> {
    let (reader, name) = open(bytes, limits)?;
    guarded(move || {
        let decoder = reader.into_decoder().map_err(undecodable)?;
        checked_info(&decoder, name, limits)
    })
}

pub(super) fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<(DynamicImage, ImageInfo), ImageError> {
    let (reader, name) = open(bytes, limits)?;
    guarded(move || {
        let decoder = reader.into_decoder().map_err(undecodable)?;
        let info = checked_info(&decoder, name, limits)?;
        Ok((DynamicImage::from_decoder(decoder).map_err(undecodable)?, info))
    })
}

/// A reader over an image's bytes.
type Reader<'a> = ImageReader<Cursor<&'a [u8]>>;

/// A reader for an accepted format (and the format's name), with the decoder's allocation
/// limit set.
fn open<'a>(bytes: &'a [u8], limits: &ImageLimits) -> Result<(Reader<'a>, &'static str), ImageError> {
    let format = ::image::guess_format(bytes).map_err(|_| ImageError::UnsupportedFormat)?;
    let name = match format {
        ImageFormat::Png => "png",
        ImageFormat::Jpeg => "jpeg",
        ImageFormat::WebP => "webp",
        _ => return Err(ImageError::UnsupportedFormat),
    };
    // zune-jpeg fills a truncated scan with grey where libjpeg (Pillow) fails: require an EOI after the last
    // SOS (entropy-coded data cannot contain FF D9, a thumbnail's EOI comes before the first SOS).
    let last = |m: [u8; 2]| bytes.windows(2).rposition(|w| w == m);
    if format == ImageFormat::Jpeg && last([0xFF, 0xD9]) < last([0xFF, 0xDA]).or(Some(0)) {
        return Err(ImageError::Undecodable("truncated JPEG (no end-of-image marker after the scan)".into()));
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    // Worst case is 16-bit RGBA (8 bytes a pixel) plus decoder working memory.
    let mut decoder_limits = Limits::default();
    decoder_limits.max_alloc = Some(limits.max_pixels.saturating_mul(8).saturating_add(64 << 20));
    reader.limits(decoder_limits);
    Ok((reader, name))
}

/// The header's size against the limits, before any pixel is decoded.
fn checked_info(decoder: &impl ImageDecoder, format: &'static str, limits: &ImageLimits) -> Result<ImageInfo, ImageError> {
    let (width, height) = decoder.dimensions();
    if width as u64 * height as u64 > limits.max_pixels {
        return Err(ImageError::TooLarge { width, height, max_pixels: limits.max_pixels });
    }
    if width == 0 || height == 0 {
        return Err(ImageError::Undecodable("the image has no pixels".into()));
    }
    let (long, short) = (width.max(height) as usize, width.min(height) as usize);
    if long > short.saturating_mul(MAX_ASPECT) {
        return Err(ImageError::AspectRatio { width, height });
    }
    let ct = decoder.original_color_type();
    let bit_depth = (ct.bits_per_pixel() / u16::from(ct.channel_count().max(1))) as u8;
    Ok(ImageInfo { width, height, format, bit_depth })
}

fn undecodable(e: ::image::ImageError) -> ImageError {
    ImageError::Undecodable(e.to_string())
}

/// Decoders parse hostile bytes; a bug there must become an error, not a dead worker.
fn guarded<T>(work: impl FnOnce() -> Result<T, ImageError> + std::panic::UnwindSafe) -> Result<T, ImageError> {
    std::panic::catch_unwind(work).unwrap_or_else(|_| Err(ImageError::Undecodable("the decoder failed".into())))
}

/// transformers' `convert_to_rgb` under Pillow: alpha composited over opaque white with `AlphaComposite.c`'s
/// integer math, gray replicated, 16-bit reduced the way Pillow's modes do (see the module doc).
pub(super) fn to_rgb(img: DynamicImage) -> Vec<u8> {
    rgb_with(img, |[r, g, b, a]| {
        [r, g, b].map(|c| {
            let a = a as u32;
            let t = c as u32 * (a * 128) + 255 * ((255 - a) * 128) + (0x80 << 7);
            if a == 0 {
                255
            } else {
                ((((t >> 8) + t) >> 8) >> 7) as u8
            }
        })
    })
}

/// Pillow's `Image.convert("RGB")`: the alpha channel dropped, the colours kept (gray
/// replicated, 16-bit reduced as [`to_rgb`] reduces it).
pub(super) fn without_alpha(img: DynamicImage) -> Vec<u8> {
    rgb_with(img, |[r, g, b, _]| [r, g, b])
}

/// The image as 8-bit RGB, each pixel with an alpha channel made RGB by `with_alpha`.
fn rgb_with(img: DynamicImage, with_alpha: impl Fn([u8; 4]) -> [u8; 3]) -> Vec<u8> {
    let over = |px: &mut dyn Iterator<Item = [u8; 4]>| px.flat_map(&with_alpha).collect::<Vec<u8>>();
    let hi = |v: u16| (v >> 8) as u8;
    match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageLuma8(b) => b.as_raw().iter().flat_map(|&v| [v; 3]).collect(),
        DynamicImage::ImageRgba8(b) => over(&mut b.as_raw().chunks_exact(4).map(|p| [p[0], p[1], p[2], p[3]])),
        DynamicImage::ImageLumaA8(b) => over(&mut b.as_raw().chunks_exact(2).map(|p| [p[0], p[0], p[0], p[1]])),
        DynamicImage::ImageRgb16(b) => b.as_raw().iter().map(|&v| hi(v)).collect(),
        DynamicImage::ImageLuma16(b) => b.as_raw().iter().flat_map(|&v| [v.min(255) as u8; 3]).collect(),
        DynamicImage::ImageRgba16(b) => over(&mut b.as_raw().chunks_exact(4).map(|p| [hi(p[0]), hi(p[1]), hi(p[2]), hi(p[3])])),
        DynamicImage::ImageLumaA16(b) => over(&mut b.as_raw().chunks_exact(2).map(|p| [hi(p[0]), hi(p[0]), hi(p[0]), hi(p[1])])),
        // Float images come from none of the accepted formats.
        other => other.to_rgb8().into_raw(),
    }
}

/// The bytes of a `data:[<image type>];base64,<data>` URL (the API's and the batch
/// commands' inline images). Only base64 image data is taken.
pub fn decode_data_url(url: &str) -> Result<Vec<u8>, ImageError> {
    use base64::Engine as _;
    let invalid = |message: &str| ImageError::DataUrl(format!("Invalid data URL: {message}"));
    let rest = url.strip_prefix("data:").ok_or_else(|| invalid("it must start with `data:`"))?;
    let (meta, data) = rest.split_once(',').ok_or_else(|| invalid("no `,` before the data"))?;
    let Some(media_type) = meta.strip_suffix(";base64") else {
        return Err(invalid("the image must be base64-encoded (data:image/png;base64,…)"));
    };
    if !(media_type.is_empty() || media_type.starts_with("image/")) {
        return Err(invalid(&format!("media type `{media_type}` is not an image")));
    }
    // Some clients wrap long base64 lines.
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| invalid(&format!("the base64 data does not decode ({e})")))
}
