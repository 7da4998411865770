//! The host-staged form of a device buffer: what a [`DeviceBuffer`] becomes
//! when its chare migrates (and what it is restored from on the destination's
//! device). Plain bytes, no CUDA, so its tests run everywhere.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "DDVB"
//!      4     1  format version (1)
//!      5     1  route: 0 = host-staged, payload follows; 1 = device-direct (reserved)
//!      6     1  element kind (ElemKind as u8)
//!      7     1  element size in bytes (checked against the kind)
//!      8     8  element count, little-endian u64
//!     16     -  payload: count x size bytes, the elements in little-endian order
//! ```
//!
//! The route byte is the seam for GPUDirect: a transport that can move device
//! memory itself would send route 1 and a handle instead of the payload. No
//! transport does yet, so decoding refuses it with a clear error rather than
//! misreading it.
//!
//! [`DeviceBuffer`]: crate::gpu::DeviceBuffer

use thiserror::Error;

/// First bytes of every staged buffer.
pub const MAGIC: [u8; 4] = *b"DDVB";
/// The format version written, and the only one read.
pub const VERSION: u8 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 16;

// The payload is the host's memory as it is: little-endian hosts only (every
// platform CUDA supports).
#[cfg(target_endian = "big")]
compile_error!("the staged device-buffer format assumes a little-endian host");

/// How a buffer's contents travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Route {
    /// Copied to host memory on the source, carried in the message, copied
    /// to the destination's device on arrival.
    HostStaged = 0,
    /// Device to device (GPUDirect); reserved: no transport offers it yet.
    DeviceDirect = 1,
}

/// Element types a device buffer may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum ElemKind {
    U8 = 1,
    U32 = 2,
    U64 = 3,
    I32 = 4,
    I64 = 5,
    F32 = 6,
    F64 = 7,
}

impl ElemKind {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            ElemKind::U8 => 1,
            ElemKind::U32 | ElemKind::I32 | ElemKind::F32 => 4,
            ElemKind::U64 | ElemKind::I64 | ElemKind::F64 => 8,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => ElemKind::U8,
            2 => ElemKind::U32,
            3 => ElemKind::U64,
            4 => ElemKind::I32,
            5 => ElemKind::I64,
            6 => ElemKind::F32,
            7 => ElemKind::F64,
            _ => return None,
        })
    }
}

mod sealed {
    pub trait Sealed {}

    /// What CUDA needs of an element type, when it is built in.
    #[cfg(feature = "cuda")]
    pub trait Repr: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {}
    #[cfg(feature = "cuda")]
    impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> Repr for T {}
    #[cfg(not(feature = "cuda"))]
    pub trait Repr {}
    #[cfg(not(feature = "cuda"))]
    impl<T> Repr for T {}
}

/// A plain numeric type that device buffers hold and kernels take.
pub trait DeviceElem:
    sealed::Sealed + sealed::Repr + bytemuck::Pod + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// Its tag in the staged format.
    const KIND: ElemKind;
}

macro_rules! elems {
    ($($t:ty => $k:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceElem for $t { const KIND: ElemKind = ElemKind::$k; }
    )*};
}
elems!(u8 => U8, u32 => U32, u64 => U64, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// Why staged bytes were refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StagedError {
    /// Fewer bytes than the header, or than the header announces.
    #[error("staged device buffer is truncated: {need} bytes needed, {have} present")]
    Short {
        /// Bytes the header (or the header's count) requires.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// More bytes than the header announces.
    #[error("staged device buffer has {extra} bytes after its payload")]
    Trailing {
        /// Bytes beyond the payload.
        extra: usize,
    },
    /// Not a staged device buffer at all.
    #[error("not a staged device buffer (magic {found:02x?}, expected \"DDVB\")")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// Written by a newer (or older) format.
    #[error(
        "staged device buffer format version {0} is not supported (this build reads {VERSION})"
    )]
    Version(u8),
    /// A route this build cannot receive.
    #[error("staged device buffer uses route {0}, which no transport of this build supports (only host staging)")]
    Route(u8),
    /// An element kind this build does not know.
    #[error("staged device buffer has unknown element kind {0}")]
    UnknownKind(u8),
    /// The element size does not match the kind.
    #[error("staged device buffer declares {kind:?} elements of {size} bytes")]
    BadSize {
        /// The declared kind.
        kind: ElemKind,
        /// The declared size.
        size: u8,
    },
    /// A buffer of another element type.
    #[error("staged device buffer holds {found:?} elements, expected {expected:?}")]
    WrongKind {
        /// What the reader wants.
        expected: ElemKind,
        /// What the bytes hold.
        found: ElemKind,
    },
    /// The element count does not fit this machine.
    #[error("staged device buffer declares {0} elements, too many for this machine")]
    TooLarge(u64),
}

/// The header of a host-staged buffer of `count` elements of `kind`.
pub fn header(kind: ElemKind, count: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = Route::HostStaged as u8;
    h[6] = kind as u8;
    h[7] = kind.size() as u8;
    h[8..16].copy_from_slice(&(count as u64).to_le_bytes());
    h
}

/// Checks `bytes` as a host-staged buffer of `expected` elements and returns
/// its payload (exactly count x size bytes).
pub fn decode(bytes: &[u8], expected: ElemKind) -> Result<&[u8], StagedError> {
    if bytes.len() < HEADER_LEN {
        return Err(StagedError::Short {
            need: HEADER_LEN,
            have: bytes.len(),
        });
    }
    let magic: [u8; 4] = bytes[..4].try_into().expect("four bytes");
    if magic != MAGIC {
        return Err(StagedError::BadMagic { found: magic });
    }
    if bytes[4] != VERSION {
        return Err(StagedError::Version(bytes[4]));
    }
    if bytes[5] != Route::HostStaged as u8 {
        return Err(StagedError::Route(bytes[5]));
    }
    let kind = ElemKind::from_u8(bytes[6]).ok_or(StagedError::UnknownKind(bytes[6]))?;
    if bytes[7] as usize != kind.size() {
        return Err(StagedError::BadSize {
            kind,
            size: bytes[7],
        });
    }
    if kind != expected {
        return Err(StagedError::WrongKind {
            expected,
            found: kind,
        });
    }
    let count = u64::from_le_bytes(bytes[8..16].try_into().expect("eight bytes"));
    let len = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(kind.size()))
        .and_then(|n| n.checked_add(HEADER_LEN))
        .ok_or(StagedError::TooLarge(count))?;
    match bytes.len().cmp(&len) {
        std::cmp::Ordering::Less => Err(StagedError::Short {
            need: len,
            have: bytes.len(),
        }),
        std::cmp::Ordering::Greater => Err(StagedError::Trailing {
            extra: bytes.len() - len,
        }),
        std::cmp::Ordering::Equal => Ok(&bytes[HEADER_LEN..]),
    }
}

/// The staged form of `values` (what a device buffer holding them becomes).
pub fn encode<T: DeviceElem>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + std::mem::size_of_val(values));
    out.extend_from_slice(&header(T::KIND, values.len()));
    out.extend_from_slice(bytemuck::cast_slice(values));
    out
}

/// The values of a staged buffer of `T` (the host side of a restore).
pub fn decode_values<T: DeviceElem>(bytes: &[u8]) -> Result<Vec<T>, StagedError> {
    let payload = decode(bytes, T::KIND)?;
    // The payload may sit at any alignment inside a message: copy, don't cast.
    let mut out = vec![T::default(); payload.len() / T::KIND.size()];
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(payload);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn values_roundtrip_bit_for_bit(v in proptest::collection::vec(any::<u64>(), 0..300)) {
            let f: Vec<f64> = v.iter().map(|b| f64::from_bits(*b)).collect();
            let bytes = encode(&f);
            prop_assert_eq!(bytes.len(), HEADER_LEN + 8 * f.len());
            let back: Vec<f64> = decode_values(&bytes).unwrap();
            let bits: Vec<u64> = back.iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(bits, v);
        }

        #[test]
        fn every_truncation_is_refused(v in proptest::collection::vec(any::<i32>(), 1..50), cut in 0usize..1000) {
            let bytes = encode(&v);
            let cut = cut % bytes.len();
            let err = decode_values::<i32>(&bytes[..cut]).unwrap_err();
            let short = matches!(err, StagedError::Short { have, .. } if have == cut);
            prop_assert!(short, "{:?}", err);
        }
    }

    #[test]
    fn header_layout_is_as_documented() {
        let bytes = encode(&[1.5f32, -2.0]);
        assert_eq!(&bytes[..4], b"DDVB");
        assert_eq!(bytes[4], 1);
        assert_eq!(bytes[5], 0);
        assert_eq!(bytes[6], ElemKind::F32 as u8);
        assert_eq!(bytes[7], 4);
        assert_eq!(u64::from_le_bytes(bytes[8..16].try_into().unwrap()), 2);
        assert_eq!(&bytes[16..20], &1.5f32.to_le_bytes());
        assert_eq!(decode_values::<f32>(&bytes).unwrap(), vec![1.5, -2.0]);
    }

    #[test]
    fn empty_buffers_roundtrip() {
        let bytes = encode::<u8>(&[]);
        assert_eq!(bytes.len(), HEADER_LEN);
        assert!(decode_values::<u8>(&bytes).unwrap().is_empty());
    }

    #[test]
    fn bad_input_gets_a_clear_error() {
        let good = encode(&[7u64, 8, 9]);
        let with = |i: usize, b: u8| {
            let mut x = good.clone();
            x[i] = b;
            x
        };
        assert_eq!(
            decode_values::<u64>(&with(0, b'X')).unwrap_err(),
            StagedError::BadMagic { found: *b"XDVB" }
        );
        assert_eq!(
            decode_values::<u64>(&with(4, 2)).unwrap_err(),
            StagedError::Version(2)
        );
        assert_eq!(
            decode_values::<u64>(&with(5, Route::DeviceDirect as u8)).unwrap_err(),
            StagedError::Route(1)
        );
        assert_eq!(
            decode_values::<u64>(&with(6, 99)).unwrap_err(),
            StagedError::UnknownKind(99)
        );
        assert_eq!(
            decode_values::<u64>(&with(7, 4)).unwrap_err(),
            StagedError::BadSize {
                kind: ElemKind::U64,
                size: 4
            }
        );
        assert_eq!(
            decode_values::<f64>(&good).unwrap_err(),
            StagedError::WrongKind {
                expected: ElemKind::F64,
                found: ElemKind::U64
            }
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            decode_values::<u64>(&long).unwrap_err(),
            StagedError::Trailing { extra: 1 }
        );
        let mut huge = good.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            decode_values::<u64>(&huge).unwrap_err(),
            StagedError::TooLarge(u64::MAX)
        );
        // Messages are readable, and name what was wrong.
        let msg = decode_values::<u64>(&good[..10]).unwrap_err().to_string();
        assert!(msg.contains("truncated") && msg.contains("16"), "{msg}");
    }
}
