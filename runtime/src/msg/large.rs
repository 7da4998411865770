//! Large byte strings out of line: how a frame lays them out, and the
//! postcard flavors that size, read and hand them over.
//!
//! A frame from another node is
//! `[large strings][header][body's small fields][footer]`. Each byte string
//! of the body of [`GATHER_MIN`] bytes or more (a `Bulk`'s contents, a
//! migrant's packed state) is written first, in the order the body holds
//! them, from its own memory. The small fields follow, each large string's
//! length in its place and its bytes missing; the footer says where each
//! string belongs among the small fields and how long it is.
//!
//! So the first large string starts at the frame's first byte. A receiver
//! that owns a frame with one such string truncates the frame to it and
//! hands the allocation to the `Bulk<u8>` that decodes it ([`offered`]):
//! a migrant's state or a message's `Bulk<u8>` body is received into the
//! memory the chare keeps, with no copy after the transport's read.
//!
//! Footer: for each string, its offset among the body's small fields and
//! its length, then the whole frame's length, all as little-endian u64,
//! then the strings' count as one byte. The length makes a torn frame
//! an error rather than one read from the wrong place.

use std::cell::RefCell;
use std::sync::Arc;

use postcard::de_flavors::Flavor as DeFlavor;
use postcard::ser_flavors::Flavor as SerFlavor;
use postcard::Error;
use serde::Deserialize;

/// A byte string at least this long is written out of line, from its own
/// memory, rather than gathered among the small fields.
pub(crate) const GATHER_MIN: usize = 4096;

/// At most this many strings of a body go out of line (the footer counts
/// them in one byte); the rest are gathered among the small fields.
pub(crate) const MAX_LARGE: usize = 255;

const ENTRY: usize = 16;

/// Whether a byte string of `len` bytes goes out of line, `count` having
/// gone before it: the one rule the writer and the sizing both follow.
pub(crate) fn out_of_line(len: usize, count: usize) -> bool {
    len >= GATHER_MIN && count < MAX_LARGE
}

/// One large string of a received body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Large {
    /// Where it belongs: the frame offset of the small field that follows it.
    pub at: usize,
    /// Where its bytes start in the frame.
    pub from: usize,
    pub len: usize,
}

/// The footer's length for `count` strings.
pub(crate) fn footer_len(count: usize) -> usize {
    count * ENTRY + 9
}

/// Appends the footer of a frame of `frame_len` bytes in all: each
/// string's offset among the body's small fields and its length, in order.
pub(crate) fn write_footer(
    out: &mut Vec<u8>,
    strings: impl ExactSizeIterator<Item = (usize, usize)>,
    frame_len: usize,
) {
    let count = strings.len();
    assert!(
        count <= MAX_LARGE,
        "{count} large strings do not fit a footer"
    );
    for (at, len) in strings {
        out.extend_from_slice(&(at as u64).to_le_bytes());
        out.extend_from_slice(&(len as u64).to_le_bytes());
    }
    out.extend_from_slice(&(frame_len as u64).to_le_bytes());
    out.push(count as u8);
}

/// What a frame's footer says: the strings' offsets among the body's small
/// fields and their lengths, and where the footer starts.
pub(crate) struct Footer {
    strings: Vec<(usize, usize)>,
    /// The strings' bytes, all together, from the frame's start.
    pub total: usize,
    /// The frame's length without the footer.
    pub end: usize,
}

/// Reads the footer of `frame`; an error when it does not fit the frame.
pub(crate) fn read_footer(frame: &[u8]) -> Result<Footer, Error> {
    let count = usize::from(*frame.last().ok_or(Error::DeserializeUnexpectedEnd)?);
    let end = frame
        .len()
        .checked_sub(footer_len(count))
        .ok_or(Error::DeserializeUnexpectedEnd)?;
    let word = |i: usize| {
        let w = u64::from_le_bytes(frame[i..i + 8].try_into().expect("8 bytes"));
        usize::try_from(w).map_err(|_| Error::DeserializeBadEncoding)
    };
    if word(end + count * ENTRY)? != frame.len() {
        return Err(Error::DeserializeUnexpectedEnd);
    }
    let mut strings = Vec::with_capacity(count);
    let mut total = 0usize;
    for e in (end..end + count * ENTRY).step_by(ENTRY) {
        let (at, len) = (word(e)?, word(e + 8)?);
        if len < GATHER_MIN || strings.last().is_some_and(|&(prev, _)| at < prev) {
            return Err(Error::DeserializeBadEncoding);
        }
        total = total
            .checked_add(len)
            .ok_or(Error::DeserializeBadEncoding)?;
        strings.push((at, len));
    }
    if total > end {
        return Err(Error::DeserializeUnexpectedEnd);
    }
    Ok(Footer {
        strings,
        total,
        end,
    })
}

impl Footer {
    /// The strings' places once the body's small fields are known to start
    /// at `body` and end at `end`; an error for a place outside them.
    pub(crate) fn place(&self, body: usize) -> Result<Vec<Large>, Error> {
        let mut from = 0;
        self.strings
            .iter()
            .map(|&(at, len)| {
                let at = body.checked_add(at).filter(|&a| a <= self.end);
                let l = Large {
                    at: at.ok_or(Error::DeserializeBadEncoding)?,
                    from,
                    len,
                };
                from += len;
                Ok(l)
            })
            .collect()
    }
}

/// Sizes an encoding the way [`super::Gather`] writes it: its bytes, and
/// how many strings go out of line.
#[derive(Default)]
pub(crate) struct Sizing {
    pub len: usize,
    pub large: usize,
}

impl SerFlavor for &mut Sizing {
    type Output = ();
    fn try_push(&mut self, _: u8) -> postcard::Result<()> {
        self.len += 1;
        Ok(())
    }
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.len += data.len();
        if out_of_line(data.len(), self.large) {
            self.large += 1;
        }
        Ok(())
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

thread_local! {
    /// A received string's own allocation, offered to the `Bulk` being
    /// decoded from it this instant.
    static OFFERED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Takes the allocation the frame's reader offers for the byte string just
/// read (empty as read: its bytes are here). A `Bulk` calls this when it
/// reads an empty string; it is `None` everywhere else.
pub(crate) fn offered() -> Option<Vec<u8>> {
    OFFERED.with(|o| o.borrow_mut().take())
}

/// Reads a body whose large strings lie out of line: small fields from
/// `small`, each large string, in turn, from `strings` when the reader
/// reaches its place.
struct Split<'de> {
    small: &'de [u8],
    /// The frame offset of `small[0]`.
    base: usize,
    /// Read so far from `small`.
    read: usize,
    large: &'de [Large],
    next: usize,
    /// The frame's bytes the strings index.
    strings: &'de [u8],
    /// The first string's own allocation, to offer to a `Bulk` instead of
    /// its bytes from `strings`.
    owned: Option<Vec<u8>>,
    /// An offer is out: the next access takes it back unless it was taken.
    offering: bool,
    /// The allocation offered and not taken.
    unclaimed: Option<Vec<u8>>,
}

/// Where a reading stopped.
struct Read {
    /// The frame offset of the next small field.
    at: usize,
    /// Strings read.
    next: usize,
    unclaimed: Option<Vec<u8>>,
}

impl<'de> Split<'de> {
    /// Reads `small`, which starts at frame offset `base`, and the strings
    /// `large` from `strings`.
    fn new(small: &'de [u8], base: usize, large: &'de [Large], strings: &'de [u8]) -> Self {
        Split {
            small,
            base,
            read: 0,
            large,
            next: 0,
            strings,
            owned: None,
            offering: false,
            unclaimed: None,
        }
    }

    /// An offer still open when the reader goes on was not for a `Bulk`.
    #[inline]
    fn settle(&mut self) {
        if std::mem::take(&mut self.offering) {
            self.unclaimed = offered();
        }
    }
}

impl<'de> DeFlavor<'de> for Split<'de> {
    type Remainder = Read;
    type Source = &'de [u8];

    fn pop(&mut self) -> postcard::Result<u8> {
        self.settle();
        let b = *self
            .small
            .get(self.read)
            .ok_or(Error::DeserializeUnexpectedEnd)?;
        self.read += 1;
        Ok(b)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.small.len() - self.read)
    }

    fn try_take_n(&mut self, ct: usize) -> postcard::Result<&'de [u8]> {
        self.settle();
        if let Some(l) = self.large.get(self.next) {
            if l.at == self.base + self.read && l.len == ct {
                self.next += 1;
                if let Some(v) = self.owned.take() {
                    OFFERED.with(|o| *o.borrow_mut() = Some(v));
                    self.offering = true;
                    return Ok(&[]);
                }
                return self
                    .strings
                    .get(l.from..l.from + l.len)
                    .ok_or(Error::DeserializeUnexpectedEnd);
            }
        }
        let end = self
            .read
            .checked_add(ct)
            .ok_or(Error::DeserializeUnexpectedEnd)?;
        let s = self
            .small
            .get(self.read..end)
            .ok_or(Error::DeserializeUnexpectedEnd)?;
        self.read = end;
        Ok(s)
    }

    fn finalize(mut self) -> postcard::Result<Read> {
        self.settle();
        Ok(Read {
            at: self.base + self.read,
            next: self.next,
            unclaimed: self.unclaimed.take().or(self.owned.take()),
        })
    }
}

/// Reads a `T` through `split`.
fn run<'de, T: Deserialize<'de>>(split: Split<'de>) -> postcard::Result<(T, Read)> {
    let mut de = postcard::Deserializer::from_flavor(split);
    let v = T::deserialize(&mut de);
    // An error may leave an offer open: close it either way.
    let rest = de.finalize();
    Ok((v?, rest?))
}

/// Reads a `T` from the frame `bytes` at offset `from` on, its large
/// strings borrowed from the frame: the value, the offset after it, and
/// whether every string from `from` on was read.
fn read_at<'de, T: Deserialize<'de>>(
    bytes: &'de [u8],
    from: usize,
    large: &'de [Large],
) -> postcard::Result<(T, usize, bool)> {
    let large = &large[large.partition_point(|l| l.at < from)..];
    let small = bytes.get(from..).ok_or(Error::DeserializeUnexpectedEnd)?;
    if large.is_empty() {
        // All small fields (nearly every message): postcard's own reader.
        let (v, rest) = postcard::take_from_bytes(small)?;
        return Ok((v, bytes.len() - rest.len(), true));
    }
    let (v, r) = run(Split::new(small, from, large, bytes))?;
    Ok((v, r.at, r.next == large.len()))
}

/// Reads a `T` from the frame `bytes` at offset `from` on, among the body's
/// small fields; its large strings are borrowed from the frame. Returns the
/// offset after it.
pub(crate) fn take_shared<'de, T: Deserialize<'de>>(
    bytes: &'de [u8],
    from: usize,
    large: &'de [Large],
) -> postcard::Result<(T, usize)> {
    read_at(bytes, from, large).map(|(v, at, _)| (v, at))
}

/// Reads the whole body `bytes[offset..]`: every large string must be read
/// where the footer put it.
fn decode_shared<'de, T: Deserialize<'de>>(
    bytes: &'de [u8],
    offset: usize,
    large: &'de [Large],
) -> postcard::Result<T> {
    match read_at(bytes, offset, large)? {
        (v, _, true) => Ok(v),
        _ => Err(Error::DeserializeBadEncoding),
    }
}

/// Reads the whole body `bytes[offset..]` of a frame nobody else holds.
/// When its one large string is at least as long as its small fields, the
/// frame's allocation becomes that string's (the small fields copied out
/// first): a `Bulk<u8>` reading it takes it without a copy, any other
/// reader gets its bytes as usual.
pub(crate) fn decode_owned<T: serde::de::DeserializeOwned>(
    bytes: Arc<Vec<u8>>,
    offset: usize,
    large: &[Large],
) -> postcard::Result<T> {
    let frame = match large {
        [one] if one.from == 0 && bytes.len().saturating_sub(offset) <= one.len => {
            Arc::try_unwrap(bytes)
        }
        _ => Err(bytes),
    };
    let mut frame = match frame {
        Ok(frame) => frame,
        Err(bytes) => return decode_shared(&bytes, offset, large),
    };
    let small = frame
        .get(offset..)
        .ok_or(Error::DeserializeUnexpectedEnd)?
        .to_vec();
    frame.truncate(large[0].len);
    let split = Split {
        owned: Some(frame),
        ..Split::new(&small, offset, large, &[])
    };
    let (v, mut r) = run::<T>(split)?;
    let Some(string) = r.unclaimed.take() else {
        return all_read(v, &r, 1);
    };
    // The string went to a reader other than a `Bulk`, as an empty one:
    // read again, the string borrowed.
    drop(v);
    let (v, r) = run::<T>(Split::new(&small, offset, large, &string))?;
    all_read(v, &r, 1)
}

/// `v`, if the reading that gave it read all `count` strings.
fn all_read<T>(v: T, r: &Read, count: usize) -> postcard::Result<T> {
    if r.next == count {
        Ok(v)
    } else {
        Err(Error::DeserializeBadEncoding)
    }
}
