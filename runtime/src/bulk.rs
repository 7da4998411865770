//! Bulk numeric data that travels as contiguous bytes.
//!
//! serde encodes a `Vec<f64>` element by element; [`Bulk`] encodes its
//! contents as one byte string (little-endian, as the machine holds it), so a
//! ghost row or a pingpong buffer is one copy on the way out and one on the way
//! in. Inside a node it is passed by value like any message.

use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use serde::de::{Deserializer, Error as _};
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

struct BytesVisitor;
impl<'de> serde::de::Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a byte string")
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }
    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }
}

impl<'de, T: Pod> Deserialize<'de> for Bulk<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = d.deserialize_byte_buf(BytesVisitor)?;
        let size = std::mem::size_of::<T>().max(1);
        if bytes.len() % size != 0 {
            return Err(D::Error::custom(format!(
                "{} bytes is not a whole number of {}-byte values",
                bytes.len(),
                size
            )));
        }
        Ok(Bulk(bytemuck::pod_collect_to_vec(&bytes)))
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

    fn serde_bytes_like(b: &[u8]) -> Bulk<u8> {
        Bulk(b.to_vec())
    }
}
