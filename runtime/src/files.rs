//! Files other processes read while this one runs.

use std::path::Path;

/// Writes `bytes` to `path` so that a reader sees the old file or the whole
/// new one, never a part: written beside it, then renamed over it.
pub(crate) fn write_atomically(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
