//! Stable identifiers: the name hash every handler, collection type,
//! readonly and custom reducer id is derived from, identical on every node
//! whatever path it took to start (launch, survivor, newcomer). A leaf:
//! it imports nothing from the crate, so anything may use it.

/// FNV-1a, 64-bit: the stable name hash behind every identifier.
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::fnv1a;

    #[test]
    fn known_values_of_fnv1a_64() {
        // The published FNV-1a 64-bit test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
