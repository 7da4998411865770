//! The send side: one outgoing connection per peer, and the frame writer.

use std::io::{self, IoSlice, Write};
use std::net::TcpStream;
use std::sync::Mutex;

use super::MAX_FRAME;
use crate::transport::Tag;

/// An outgoing connection to the peer with uid `uid` (endpoints are kept
/// by uid across views and re-indexed by node id).
pub(super) struct Endpoint {
    pub(super) uid: u64,
    pub(super) stream: Mutex<TcpStream>,
}

/// Writes one frame, `[u32 LE length][u64 LE tag][parts...]`, with one
/// `writev` where the socket takes it all (no gather copy).
pub(super) fn write_frame(s: &mut TcpStream, tag: Tag, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len)
        .ok()
        .filter(|&l| (l as usize) <= MAX_FRAME)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
            )
        })?;
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&len.to_le_bytes());
    head[4..].copy_from_slice(&tag.0.to_le_bytes());
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
    slices.push(IoSlice::new(&head));
    slices.extend(
        parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| IoSlice::new(p)),
    );
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
