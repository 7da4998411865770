//! The programming model: chares, their indices and their messages.
//!
//! A chare is a plain Rust value with a message enum (its entry methods), a
//! constructor argument type and an index type. State must be serde
//! (de)serialisable: serde is to Ductile what PUP is to Charm++ — the one
//! description used for migration, checkpoints and newcomer adoption.
//! Entry methods are plain `&mut self` methods, not `async`, so a chare's state
//! is always a value that can be packed between two messages.

use std::fmt::Debug;
use std::hash::Hash;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ctx::Ctx;

pub use crate::msg::{IndexKey, Message};

/// An index into a chare array.
///
/// Implemented for `()` (singletons), `u32`, `u64`, `i32`, `i64`, and pairs and
/// triples of `u32`/`i32`. A user-defined index implements the two key
/// conversions (it must fit in 128 bits, injectively).
pub trait ArrayIndex:
    Copy + Eq + Ord + Hash + Debug + Send + Sync + Serialize + DeserializeOwned + 'static
{
    /// The routing key of this index.
    fn to_key(&self) -> IndexKey;
    /// The index of a routing key; `None` if the key does not encode an index of this type.
    fn from_key(key: IndexKey) -> Option<Self>;

    /// Dense rectangular ranges, for bulk construction (see [`BulkIndex`]):
    /// number of indices in the range `dims`. Index types without ranges keep the default.
    fn count(_dims: &Self) -> u64 {
        0
    }
    /// Row-major position of `self` inside `dims`, or `None` if outside (or no ranges).
    fn linear(&self, _dims: &Self) -> Option<u64> {
        None
    }
    /// The index at row-major position `lin` of `dims`.
    ///
    /// # Panics
    /// For index types without ranges.
    fn from_linear(_lin: u64, _dims: &Self) -> Self {
        panic!("{} has no dense ranges", std::any::type_name::<Self>())
    }
}

/// Marker for index types with dense rectangular ranges, which bulk
/// construction needs: they implement [`ArrayIndex::count`],
/// [`ArrayIndex::linear`] and [`ArrayIndex::from_linear`].
///
/// `dims` is the extent in each dimension: `(4, 3)` means the 12 indices
/// `(0..4, 0..3)`, numbered in row-major order.
pub trait BulkIndex: ArrayIndex {}

impl ArrayIndex for () {
    fn to_key(&self) -> IndexKey {
        0
    }
    fn from_key(key: IndexKey) -> Option<Self> {
        (key == 0).then_some(())
    }
    fn count(_: &Self) -> u64 {
        1
    }
    fn linear(&self, _: &Self) -> Option<u64> {
        Some(0)
    }
    fn from_linear(_: u64, _: &Self) -> Self {}
}
impl BulkIndex for () {}

macro_rules! scalar_index {
    ($($t:ty => $u:ty),*) => {$(
        impl ArrayIndex for $t {
            fn to_key(&self) -> IndexKey { *self as $u as IndexKey }
            fn from_key(key: IndexKey) -> Option<Self> {
                <$u>::try_from(key).ok().map(|v| v as $t)
            }
            fn count(dims: &Self) -> u64 { *dims as u64 }
            fn linear(&self, dims: &Self) -> Option<u64> {
                (*self >= 0 as $t && *self < *dims).then(|| *self as u64)
            }
            fn from_linear(lin: u64, _: &Self) -> Self { lin as $t }
        }
        impl BulkIndex for $t {}
    )*};
}
scalar_index!(u32 => u32, i32 => u32, u64 => u64, i64 => u64);

macro_rules! tuple_index {
    ($($t:ty),*) => {$(
        impl ArrayIndex for ($t, $t) {
            fn to_key(&self) -> IndexKey { ((self.0 as u32 as u128) << 32) | self.1 as u32 as u128 }
            fn from_key(key: IndexKey) -> Option<Self> {
                (key >> 64 == 0).then(|| ((key >> 32) as u32 as $t, key as u32 as $t))
            }
            fn count(d: &Self) -> u64 { d.0 as u64 * d.1 as u64 }
            fn linear(&self, d: &Self) -> Option<u64> {
                let inside = self.0 >= 0 as $t && self.1 >= 0 as $t && self.0 < d.0 && self.1 < d.1;
                inside.then(|| self.0 as u64 * d.1 as u64 + self.1 as u64)
            }
            fn from_linear(lin: u64, d: &Self) -> Self {
                ((lin / d.1 as u64) as $t, (lin % d.1 as u64) as $t)
            }
        }
        impl BulkIndex for ($t, $t) {}
        impl ArrayIndex for ($t, $t, $t) {
            fn to_key(&self) -> IndexKey {
                ((self.0 as u32 as u128) << 64) | ((self.1 as u32 as u128) << 32) | self.2 as u32 as u128
            }
            fn from_key(key: IndexKey) -> Option<Self> {
                (key >> 96 == 0).then(|| ((key >> 64) as u32 as $t, (key >> 32) as u32 as $t, key as u32 as $t))
            }
            fn count(d: &Self) -> u64 { d.0 as u64 * d.1 as u64 * d.2 as u64 }
            fn linear(&self, d: &Self) -> Option<u64> {
                let zero = 0 as $t;
                let inside = self.0 >= zero && self.1 >= zero && self.2 >= zero
                    && self.0 < d.0 && self.1 < d.1 && self.2 < d.2;
                inside.then(|| (self.0 as u64 * d.1 as u64 + self.1 as u64) * d.2 as u64 + self.2 as u64)
            }
            fn from_linear(lin: u64, d: &Self) -> Self {
                let plane = d.1 as u64 * d.2 as u64;
                ((lin / plane) as $t, ((lin % plane) / d.2 as u64) as $t, (lin % d.2 as u64) as $t)
            }
        }
        impl BulkIndex for ($t, $t, $t) {}
    )*};
}
tuple_index!(u32, i32);

/// A migratable object with entry methods.
///
/// ```ignore
/// #[derive(Serialize, Deserialize)]
/// struct Counter { hits: u64 }
/// #[derive(Clone, Serialize, Deserialize)]
/// enum CounterMsg { Hit, Report }
///
/// impl Chare for Counter {
///     const NAME: &'static str = "example::Counter";
///     type Index = u32;
///     type Init = ();
///     type Msg = CounterMsg;
///     fn new(_: (), _: &mut Ctx<'_, Self>) -> Self { Counter { hits: 0 } }
///     fn handle(&mut self, msg: CounterMsg, ctx: &mut Ctx<'_, Self>) {
///         match msg {
///             CounterMsg::Hit => self.hits += 1,
///             CounterMsg::Report => ctx.contribute(self.hits, Reducer::Sum, Callback::ignore()),
///         }
///     }
/// }
/// ```
pub trait Chare: Serialize + DeserializeOwned + Send + Sized + 'static {
    /// Stable name: the chare type's identity on the wire. Two nodes agree on a
    /// type exactly when they agree on its name (and the registry fingerprint
    /// checks the rest), so never derive it from registration order.
    const NAME: &'static str;
    /// Index type (use `()` for groups, nodegroups and the main chare).
    type Index: ArrayIndex;
    /// Constructor argument, sent to every PE that constructs elements.
    type Init: Message;
    /// The entry methods, as one enum.
    type Msg: Message;

    /// Constructs an element (or group member) on its PE.
    fn new(init: Self::Init, ctx: &mut Ctx<'_, Self>) -> Self;
    /// Runs one entry method.
    fn handle(&mut self, msg: Self::Msg, ctx: &mut Ctx<'_, Self>);
    /// Called after a load-balancing step that this element joined with [`Ctx::at_sync`].
    fn resume_from_sync(&mut self, _ctx: &mut Ctx<'_, Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip<I: ArrayIndex>(i: I) {
        assert_eq!(I::from_key(i.to_key()), Some(i));
    }

    proptest! {
        #[test]
        fn keys_roundtrip(a: i32, b: i32, c: i32, u: u64, s: i64) {
            roundtrip(a); roundtrip(u); roundtrip(s); roundtrip(a as u32);
            roundtrip((a, b)); roundtrip((a, b, c)); roundtrip((a as u32, b as u32, c as u32));
        }

        #[test]
        fn linear_roundtrip(d0 in 1u32..30, d1 in 1u32..30, d2 in 1u32..30, pick: u64) {
            let d = (d0, d1, d2);
            let lin = pick % <(u32, u32, u32)>::count(&d);
            let idx = <(u32, u32, u32)>::from_linear(lin, &d);
            prop_assert_eq!(idx.linear(&d), Some(lin));
            let d2d = (d0 as i32, d1 as i32);
            let lin2 = pick % <(i32, i32)>::count(&d2d);
            prop_assert_eq!(<(i32, i32)>::from_linear(lin2, &d2d).linear(&d2d), Some(lin2));
        }
    }

    #[test]
    fn outside_dims_has_no_position() {
        assert_eq!((5u32, 0u32).linear(&(5, 5)), None);
        assert_eq!((-1i32, 0i32).linear(&(5, 5)), None);
        assert_eq!(7i64.linear(&7), None);
    }

    #[test]
    fn distinct_indices_have_distinct_keys() {
        assert_ne!((1i32, 2i32).to_key(), (2i32, 1i32).to_key());
        assert_ne!((0u32, 1u32, 0u32).to_key(), (0u32, 0u32, 1u32).to_key());
    }
}
