//! The per-job secret and the challenge-response proof built from it.
//!
//! Every connection to the coordinator starts with a server nonce; the client
//! answers with `HMAC-SHA256(secret, context || nonce)`. The secret itself never
//! crosses the wire, and `Debug` never prints it.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Context string mixed into coordinator proofs, so a proof for another use of
/// the same secret cannot be replayed here.
pub const AUTH_CONTEXT: &[u8] = b"ductile/coordinator/v1";

type HmacSha256 = Hmac<Sha256>;

/// Why a secret could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Not 64 hex characters.
    #[error("a job secret is 64 hex characters (32 bytes); got {0} characters")]
    BadLength(usize),
    /// A non-hex character.
    #[error("the job secret is not valid hex: {0}")]
    BadHex(String),
}

/// A 32-byte per-job secret shared by the coordinator and the job's processes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A fresh random secret from the OS generator.
    pub fn generate() -> Self {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        Secret(bytes)
    }

    /// Wraps raw bytes (tests, or secrets from a key store).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Secret(bytes)
    }

    /// Parses 64 hex characters; surrounding whitespace (a trailing newline in a file) is ignored.
    pub fn from_hex(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(SecretError::BadLength(text.chars().count()));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|e| SecretError::BadHex(e.to_string()))?;
        Ok(Secret(bytes))
    }

    /// The secret as 64 lowercase hex characters (for `DUCTILE_SECRET` or a secret file).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn mac(&self, context: &[u8], nonce: &[u8; 32]) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail for 32 bytes.
        let mut mac =
            <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        mac.update(context);
        mac.update(nonce);
        mac
    }

    /// `HMAC-SHA256(secret, context || nonce)`.
    pub fn proof(&self, context: &[u8], nonce: &[u8; 32]) -> [u8; 32] {
        self.mac(context, nonce).finalize().into_bytes().into()
    }

    /// Checks a proof in constant time.
    pub fn verify(&self, context: &[u8], nonce: &[u8; 32], proof: &[u8; 32]) -> bool {
        self.mac(context, nonce).verify_slice(proof).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_proofs() {
        let s = Secret::generate();
        let t = Secret::from_hex(&format!("{}\n", s.to_hex())).expect("hex");
        assert_eq!(s, t);
        let nonce = [7u8; 32];
        let p = s.proof(AUTH_CONTEXT, &nonce);
        assert!(t.verify(AUTH_CONTEXT, &nonce, &p));
        assert!(!t.verify(b"other", &nonce, &p));
        assert!(!Secret::generate().verify(AUTH_CONTEXT, &nonce, &p));
    }

    #[test]
    fn bad_hex_and_debug() {
        assert_eq!(Secret::from_hex("abc"), Err(SecretError::BadLength(3)));
        assert!(matches!(
            Secret::from_hex(&"zz".repeat(32)),
            Err(SecretError::BadHex(_))
        ));
        let s = Secret::from_bytes([0xab; 32]);
        assert!(!format!("{s:?}").contains("ab"));
    }
}
