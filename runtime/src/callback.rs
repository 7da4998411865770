//! Typed callbacks: where the result of a reduction (or quiescence) goes.
//!
//! A callback names a target (an element, a whole array, a group member, the
//! main chare) and the entry method that receives the value, given as the
//! message enum's tuple-variant constructor: `Callback::main(MainMsg::Done)`.
//! The compiler checks that the variant takes the reduced type.
//!
//! Callbacks must travel to the reduction's root on any node, where the
//! contributor's types may not be at hand, so the constructor is not stored:
//! at creation the variant's encoding prefix is recorded (postcard writes a
//! newtype variant as its tag followed by the value), and the root delivers
//! `prefix ++ postcard(value)`, which decodes as `Variant(value)` at the
//! target. Creation rejects constructors that are not of that shape.

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use crate::chare::{ArrayIndex, Chare};
use crate::msg::MAIN_COLL;
use crate::port::PeCtx;
use crate::proxy::{ArrayProxy, ElementProxy, GroupProxy};
use crate::reduce::Reducible;
use crate::topo::Pe;

pub use crate::msg::CallbackSpec;
pub(crate) use crate::msg::Target;

/// Where a value of type `T` is delivered.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Callback<T> {
    pub(crate) spec: CallbackSpec,
    #[serde(skip)]
    _t: PhantomData<fn(T)>,
}

impl<T> Clone for Callback<T> {
    fn clone(&self) -> Self {
        Callback {
            spec: self.spec.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for Callback<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Callback({:?})", self.spec.target)
    }
}

/// The encoding prefix of `ctor`'s variant.
///
/// # Panics
/// If `ctor(v)` does not encode as some fixed prefix followed by `v`'s
/// encoding: the constructor must be a tuple variant holding exactly the value.
fn variant_prefix<T: Reducible, M: Serialize>(ctor: fn(T) -> M) -> Vec<u8> {
    let value = postcard::to_allocvec(&T::default()).expect("encoding into a Vec cannot fail");
    let whole =
        postcard::to_allocvec(&ctor(T::default())).expect("encoding into a Vec cannot fail");
    assert!(
        whole.len() >= value.len() && whole.ends_with(&value),
        "callback constructor for {} must be a one-field tuple variant holding the value (like `Msg::Done`)",
        std::any::type_name::<M>()
    );
    whole[..whole.len() - value.len()].to_vec()
}

impl<T: Reducible> Callback<T> {
    /// A callback that drops the value.
    pub fn ignore() -> Self {
        Callback {
            spec: CallbackSpec {
                target: Target::Ignore,
                prefix: Vec::new(),
            },
            _t: PhantomData,
        }
    }

    /// Delivers to one array element through entry `ctor`.
    pub fn element<C: Chare>(to: ElementProxy<C>, ctor: fn(T) -> C::Msg) -> Self {
        Self::with(
            Target::Element {
                coll: to.coll,
                key: to.index.to_key(),
            },
            variant_prefix(ctor),
        )
    }

    /// Delivers to every element of an array through entry `ctor`.
    pub fn broadcast<C: Chare>(to: ArrayProxy<C>, ctor: fn(T) -> C::Msg) -> Self {
        Self::with(Target::Broadcast { coll: to.coll }, variant_prefix(ctor))
    }

    /// Delivers to every member of a group through entry `ctor`.
    pub fn group_broadcast<C: Chare>(to: GroupProxy<C>, ctor: fn(T) -> C::Msg) -> Self {
        Self::with(Target::Broadcast { coll: to.coll }, variant_prefix(ctor))
    }

    /// Delivers to one group member through entry `ctor`.
    pub fn member<C: Chare>(to: GroupProxy<C>, pe: Pe, ctor: fn(T) -> C::Msg) -> Self {
        Self::with(Target::Member { coll: to.coll, pe }, variant_prefix(ctor))
    }

    /// Delivers to the main chare through entry `ctor`.
    pub fn main<M: Chare<Index = ()>>(ctor: fn(T) -> M::Msg) -> Self {
        Self::with(
            Target::Element {
                coll: MAIN_COLL,
                key: ().to_key(),
            },
            variant_prefix(ctor),
        )
    }

    fn with(target: Target, prefix: Vec<u8>) -> Self {
        Callback {
            spec: CallbackSpec { target, prefix },
            _t: PhantomData,
        }
    }
}

impl<'a> PeCtx<'a> {
    /// Calls `callback` with the job's new PE count after every rescale, once
    /// the job runs at its new size (Charm++'s resume-after-shrink/expand).
    pub fn on_rescale(&mut self, callback: Callback<u32>) {
        self.on_rescale_spec(callback.spec);
    }

    /// Calls `callback` once no application message is queued or in flight
    /// anywhere in the job (Charm++'s quiescence detection).
    pub fn start_quiescence(&mut self, callback: Callback<()>) {
        self.start_quiescence_spec(callback.spec);
    }

    /// Calls `callback` once `delay` has passed, from this PE. An idle PE
    /// sleeps until then (or until a message comes); the timer is this
    /// PE's: it is kept across a rescale (a callback that names a PE
    /// number names it in the new numbering) and not saved by a checkpoint.
    pub fn after(&mut self, delay: std::time::Duration, callback: Callback<()>) {
        self.after_spec(delay, callback.spec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    enum M {
        A(u64),
        B(f64),
        C(Vec<i32>),
        Two(u64, u64),
    }

    #[test]
    fn prefix_plus_value_decodes_as_the_variant() {
        let p = variant_prefix::<f64, M>(M::B);
        let mut bytes = p.clone();
        bytes.extend(postcard::to_allocvec(&2.75f64).unwrap());
        assert_eq!(postcard::from_bytes::<M>(&bytes).unwrap(), M::B(2.75));
        let p = variant_prefix::<Vec<i32>, M>(M::C);
        let mut bytes = p;
        bytes.extend(postcard::to_allocvec(&vec![1, -2, 3]).unwrap());
        assert_eq!(
            postcard::from_bytes::<M>(&bytes).unwrap(),
            M::C(vec![1, -2, 3])
        );
        let p = variant_prefix::<u64, M>(M::A);
        assert_eq!(
            postcard::from_bytes::<M>(
                &[p.as_slice(), &postcard::to_allocvec(&9u64).unwrap()].concat()
            )
            .unwrap(),
            M::A(9)
        );
    }

    #[test]
    #[should_panic(expected = "one-field tuple variant")]
    fn constructors_that_add_fields_are_rejected() {
        variant_prefix::<u64, M>(|v| M::Two(v, 7));
    }
}
