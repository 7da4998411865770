//! Keeping freed memory for the next buddy checkpoint (`+ft-every`).
//!
//! A checkpoint moves every chare's state through buffers of hundreds of
//! KiB to tens of MiB (the packed copies, the frame a buddy keeps). With
//! glibc's defaults each such buffer is fresh memory:
//! one above the mmap threshold is mapped and unmapped again, one below it
//! lands at the top of a heap that `free` trims back to the kernel, so the
//! next checkpoint pays a page fault per 4 KiB once more. Measured on
//! Jacobi2D 2048² (docs/elasticity.md, "Keeping freed memory"), keeping it
//! took the checkpoints' overhead from +21% to +16%. With fault tolerance on, a node
//! therefore asks glibc to serve large blocks from its heaps, to keep what
//! is freed, and to grow in steps of [`TOP_PAD`]. The node's memory then
//! stays at its peak (what its checkpoints needed at once) instead of
//! going back down between checkpoints; a job without `+ft-every` keeps
//! glibc's defaults. Settings the user made through glibc's own
//! environment variables (`MALLOC_TRIM_THRESHOLD_`, ...) win: then nothing
//! is changed.
#![allow(unsafe_code)]

/// Blocks up to this size come from the heaps, not from their own mapping
/// (glibc's limit for the setting is `HEAP_MAX_SIZE / 2`, 32 MiB on 64-bit).
pub(crate) const MMAP_THRESHOLD: usize = 32 << 20;
/// Free memory at the top of a heap kept before any is given back.
pub(crate) const TRIM_THRESHOLD: usize = 1 << 30;
/// How much more than asked a heap grows by.
pub(crate) const TOP_PAD: usize = 64 << 20;

/// glibc's environment variables for the settings this module makes.
const USER_SETTINGS: [&str; 4] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
];

/// What a node with buddy checkpoints does about glibc's settings.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Keep freed memory (the settings above).
    Keep,
    /// The user set `var`: leave glibc as configured.
    UserSet(&'static str),
}

/// The decision, given how environment variables are looked up.
pub(crate) fn decide(var: impl Fn(&str) -> Option<String>) -> Decision {
    match USER_SETTINGS.into_iter().find(|v| var(v).is_some()) {
        Some(v) => Decision::UserSet(v),
        None => Decision::Keep,
    }
}

/// Applies the settings; false when glibc refused one (or this is not
/// glibc, where nothing is done).
pub(crate) fn keep_freed_memory() -> bool {
    #[cfg(target_env = "gnu")]
    {
        let settings = [
            (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (libc::M_TOP_PAD, TOP_PAD),
        ];
        settings.into_iter().all(|(param, value)| {
            let value = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
            // SAFETY: mallopt takes plain integers and is thread-safe; a
            // value glibc refuses makes it return 0 and change nothing.
            unsafe { libc::mallopt(param, value) == 1 }
        })
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_s_own_malloc_settings_win() {
        assert_eq!(decide(|_| None), Decision::Keep);
        let set = |name: &'static str| move |v: &str| (v == name).then(|| "1".to_owned());
        for name in USER_SETTINGS {
            assert_eq!(decide(set(name)), Decision::UserSet(name));
        }
        assert_eq!(
            decide(|v| (v == "MALLOC_ARENA_MAX").then(String::new)),
            Decision::Keep
        );
    }

    /// glibc accepts every value (its limits: the mmap threshold at most
    /// 32 MiB on 64-bit, the others any int).
    #[test]
    #[cfg(target_env = "gnu")]
    fn glibc_accepts_the_settings() {
        assert!(keep_freed_memory());
    }
}
