//! The frames poolserve and a plugin process exchange over the process's stdin and stdout: a
//! JSON header and binary arrays beside it, so that vectors cross as their bytes, not as JSON
//! lists. Layout (little-endian): `u32` header length, `u32` array count, the header's UTF-8
//! JSON, then each array as a `u64` length and its bytes.

use super::PluginError;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest header or array a plugin may send back; a bigger length means a broken process.
const MAX_PART: u64 = 1 << 31;

pub struct Frame {
    pub header: Value,
    pub arrays: Vec<Vec<u8>>,
}

impl Frame {
    pub fn json(header: Value) -> Frame {
        Frame { header, arrays: Vec::new() }
    }
}

pub async fn write(stream: &mut (impl AsyncWrite + Unpin), frame: &Frame) -> Result<(), PluginError> {
    let header = serde_json::to_vec(&frame.header).map_err(|e| PluginError::Protocol(e.to_string()))?;
    let mut bytes = Vec::with_capacity(8 + header.len() + frame.arrays.iter().map(|a| 8 + a.len()).sum::<usize>());
    bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&(frame.arrays.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&header);
    for array in &frame.arrays {
        bytes.extend_from_slice(&(array.len() as u64).to_le_bytes());
        bytes.extend_from_slice(array);
    }
    stream.write_all(&bytes).await.map_err(PluginError::Gone)?;
    stream.flush().await.map_err(PluginError::Gone)
}

pub async fn read(stream: &mut (impl AsyncRead + Unpin)) -> Result<Frame, PluginError> {
    let mut head = [0u8; 8];
    stream.read_exact(&mut head).await.map_err(PluginError::Gone)?;
    let header_len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as u64;
    let count = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let header = read_part(stream, header_len).await?;
    let header = serde_json::from_slice(&header).map_err(|e| PluginError::Protocol(format!("a header that is not JSON: {e}")))?;
    let mut arrays = Vec::new();
    for _ in 0..count {
        let mut len = [0u8; 8];
        stream.read_exact(&mut len).await.map_err(PluginError::Gone)?;
        arrays.push(read_part(stream, u64::from_le_bytes(len)).await?);
    }
    Ok(Frame { header, arrays })
}

async fn read_part(stream: &mut (impl AsyncRead + Unpin), len: u64) -> Result<Vec<u8>, PluginError> {
    if len > MAX_PART {
        return Err(PluginError::Protocol(format!("a part of {len} bytes")));
    }
    let mut part = vec![0u8; len as usize];
    stream.read_exact(&mut part).await.map_err(PluginError::Gone)?;
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let frame = Frame { header: serde_json::json!({"op": "post_process"}), arrays: vec![vec![1, 2, 3], vec![]] };
        let mut bytes = Vec::new();
        write(&mut bytes, &frame).await.unwrap();
        let back = read(&mut bytes.as_slice()).await.unwrap();
        assert_eq!(back.header, frame.header);
        assert_eq!(back.arrays, frame.arrays);
        assert!(matches!(read(&mut &bytes[..5]).await, Err(PluginError::Gone(_))));
    }
}
