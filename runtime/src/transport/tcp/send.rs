//! The send side: one outgoing connection per peer, and the frame writer.

use std::io::{self, IoSlice, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Mutex;

use super::MAX_FRAME;
use crate::transport::{FrameWrite, Tag};

/// An outgoing connection to the peer with uid `uid` (endpoints are kept
/// by uid across views and re-indexed by node id).
pub(super) struct Endpoint {
    pub(super) uid: u64,
    pub(super) stream: Mutex<TcpStream>,
    /// The same socket, outside the lock: [`Endpoint::cut`] shuts it down
    /// while a writer blocked on it holds `stream`.
    cutter: TcpStream,
}

impl Endpoint {
    /// An endpoint over `stream`, connected to the peer with uid `uid`.
    pub(super) fn new(uid: u64, stream: TcpStream) -> io::Result<Endpoint> {
        Ok(Endpoint {
            uid,
            cutter: stream.try_clone()?,
            stream: Mutex::new(stream),
        })
    }

    /// Shuts the connection down at once, without waiting for a writer:
    /// one blocked on a peer that stopped reading fails (EPIPE) instead.
    pub(super) fn cut(&self) {
        let _ = self.cutter.shutdown(Shutdown::Both);
    }
}

/// Writes one frame, `[u32 LE length][u64 LE tag][parts...]`, with one
/// `writev` where the socket takes it all (no gather copy).
pub(super) fn write_frame(s: &mut TcpStream, tag: Tag, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let head = frame_head(tag, len)?;
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
    slices.push(IoSlice::new(&head));
    slices.extend(
        parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| IoSlice::new(p)),
    );
    write_all(s, &mut slices)
}

/// Writes one frame of `len` bytes whose body `fill` writes in pieces,
/// each piece with one `writev` (the frame head goes with the first).
/// A frame that `fill` could not finish, or finished at another length,
/// leaves the stream unusable: it is shut down, so the peer sees the
/// connection end mid-frame (a lost peer) rather than misread bytes.
pub(super) fn write_frame_with(
    s: &mut TcpStream,
    tag: Tag,
    len: usize,
    fill: &mut dyn FnMut(&mut FrameWrite<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let head = frame_head(tag, len)?;
    let mut head_sent = false;
    let mut written = 0usize;
    let filled = fill(&mut |parts: &[&[u8]]| {
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
        if !head_sent {
            slices.push(IoSlice::new(&head));
        }
        for p in parts.iter().filter(|p| !p.is_empty()) {
            written += p.len();
            slices.push(IoSlice::new(p));
        }
        if written > len {
            return Err(io::Error::other(format!(
                "the frame overran its announced {len} bytes"
            )));
        }
        write_all(s, &mut slices)?;
        head_sent = true;
        Ok(())
    });
    let r = filled.and_then(|()| {
        if written != len {
            return Err(io::Error::other(format!(
                "{written} bytes written where {len} were announced"
            )));
        }
        if !head_sent {
            write_all(s, &mut [IoSlice::new(&head)])?;
        }
        Ok(())
    });
    if r.is_err() && (head_sent || written > 0) {
        let _ = s.shutdown(Shutdown::Both);
    }
    r
}

/// `[u32 LE length][u64 LE tag]`; refuses a length over [`MAX_FRAME`].
fn frame_head(tag: Tag, len: usize) -> io::Result<[u8; 12]> {
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
    Ok(head)
}

fn write_all(s: &mut TcpStream, slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    let mut bufs = slices;
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
