//! Bulk numeric data that travels as contiguous bytes.
//!
//! serde encodes a `Vec<f64>` element by element; [`Bulk`] encodes its
//! contents as one byte string (little-endian, as the machine holds it).
//! Sent to another node, that string is written from the vector's own
//! memory (`msg::write_frame`; no copy over TCP); received, it is copied
//! once, straight into the new vector, or taken without a copy when `T`'s
//! alignment is 1 and the deserializer owns the buffer: a frame whose one
//! large string it is (`msg::large`), or an owned byte buffer. Inside a
//! node a `Bulk` is passed by value like any message.

use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use serde::de::Deserializer;
use serde::{Deserialize, Serialize, Serializer};

/// A vector of plain numbers serialised as raw bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bulk<T: Pod>(pub Vec<T>);

impl<T: Pod> Bulk<T> {
    /// Wraps a vector.
    pub fn new(v: Vec<T>) -> Self {
        Bulk(v)
    }
    /// Unwraps the vector.
    pub fn into_inner(self) -> Vec<T> {
        self.0
    }
}

impl<T: Pod> Deref for Bulk<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}
impl<T: Pod> DerefMut for Bulk<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T: Pod> Serialize for Bulk<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytemuck::cast_slice(&self.0))
    }
}

/// Decodes a byte string into the values, in as few copies as the
/// deserializer allows: an owned buffer of a type with byte alignment
/// becomes the vector itself (no copy); otherwise the bytes are copied
/// once, straight into the vector (alignment fallback).
struct BulkVisitor<T>(std::marker::PhantomData<T>);

impl<T: Pod> BulkVisitor<T> {
    fn check<E: serde::de::Error>(len: usize) -> Result<(), E> {
        let size = std::mem::size_of::<T>().max(1);
        if !len.is_multiple_of(size) {
            return Err(E::custom(format!(
                "{len} bytes is not a whole number of {size}-byte values"
            )));
        }
        Ok(())
    }
}

impl<'de, T: Pod> serde::de::Visitor<'de> for BulkVisitor<T> {
    type Value = Vec<T>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a byte string")
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<T>, E> {
        if v.is_empty() {
            // Read empty from a frame that hands its memory over instead.
            if let Some(owned) = crate::msg::offered() {
                return self.visit_byte_buf(owned);
            }
        }
        Self::check(v.len())?;
        if std::mem::size_of::<T>() == 0 {
            return Ok(Vec::new());
        }
        Ok(bytemuck::pod_collect_to_vec(v))
    }
    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<T>, E> {
        Self::check(v.len())?;
        match bytemuck::allocation::try_cast_vec(v) {
            Ok(owned) => Ok(owned),
            Err((_, v)) => self.visit_bytes(&v),
        }
    }
}

impl<'de, T: Pod> Deserialize<'de> for Bulk<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_byte_buf(BulkVisitor(std::marker::PhantomData))
            .map(Bulk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_and_rejects_torn_input() {
        let v = Bulk(vec![1.5f64, -0.0, f64::MAX]);
        let bytes = postcard::to_allocvec(&v).unwrap();
        assert_eq!(bytes.len(), 1 + 24);
        assert_eq!(postcard::from_bytes::<Bulk<f64>>(&bytes).unwrap(), v);
        let torn = postcard::to_allocvec(&serde_bytes_like(&[0u8; 7])).unwrap();
        assert!(postcard::from_bytes::<Bulk<f64>>(&torn).is_err());
    }

    #[test]
    fn an_owned_byte_buffer_becomes_the_vector_without_a_copy() {
        use serde::de::Visitor;
        let buf: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let (addr, want) = (buf.as_ptr() as usize, buf.clone());
        let got = BulkVisitor::<u8>(std::marker::PhantomData)
            .visit_byte_buf::<serde::de::value::Error>(buf)
            .unwrap();
        assert_eq!(got.as_ptr() as usize, addr, "taken, not copied");
        assert_eq!(got, want);
    }

    #[test]
    fn a_buffer_of_another_alignment_is_copied_once_into_place() {
        use serde::de::Visitor;
        let vals: Vec<f64> = (0..1000).map(|i| i as f64 / 3.0).collect();
        let bytes: Vec<u8> = bytemuck::cast_slice(&vals).to_vec();
        let got = BulkVisitor::<f64>(std::marker::PhantomData)
            .visit_byte_buf::<serde::de::value::Error>(bytes.clone())
            .unwrap();
        assert_eq!(got, vals);
        // Unaligned borrowed bytes (inside a frame, after its header) too.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        let got = BulkVisitor::<f64>(std::marker::PhantomData)
            .visit_bytes::<serde::de::value::Error>(&shifted[1..])
            .unwrap();
        assert_eq!(got, vals);
        let torn = BulkVisitor::<f64>(std::marker::PhantomData)
            .visit_byte_buf::<serde::de::value::Error>(bytes[..9].to_vec())
            .unwrap_err();
        assert!(torn.to_string().contains("whole number"), "{torn}");
    }

    fn serde_bytes_like(b: &[u8]) -> Bulk<u8> {
        Bulk(b.to_vec())
    }
}
