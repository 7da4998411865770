//! Reduction values and reducers.
//!
//! Partial results travel up the spanning tree through PEs that may host no
//! contributor, so combining must not need the contributor's Rust type: a
//! contribution is turned into a [`Value`] (a closed set of primitive scalars
//! and vectors) and reducers operate on values. Custom reducers combine the
//! postcard encoding of the user's type through a function registered by name.
//!
//! Integer sums wrap (two's complement), so they are exact and independent of
//! combining order. Float sums depend on the order partial results meet; use
//! min/max, integers, or a custom reducer over an ordered collection where bit
//! reproducibility across shapes matters (Jacobi2D's checksum is an integer sum).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ids::fnv1a;

/// A built-in or custom reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reducer {
    /// Sum (wrapping for integers); element-wise for vectors.
    Sum,
    /// Product (wrapping for integers); element-wise for vectors.
    Product,
    /// Minimum; element-wise for vectors.
    Min,
    /// Maximum; element-wise for vectors.
    Max,
    /// Logical and (booleans) or bitwise and (integers).
    And,
    /// Logical or (booleans) or bitwise or (integers).
    Or,
    /// Bitwise exclusive or (integers, booleans).
    Xor,
    /// A reducer registered with [`Registry::reducer`], named by the hash of its name.
    Custom(u64),
}

impl Reducer {
    /// The custom reducer registered under `name`.
    pub const fn custom(name: &str) -> Reducer {
        Reducer::Custom(fnv1a(name.as_bytes()))
    }
}

/// A reducible value in type-erased form.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Value {
    Unit,
    Bool(bool),
    I32(i32),
    I64(i64),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    VBool(Vec<bool>),
    VI32(Vec<i32>),
    VI64(Vec<i64>),
    VU32(Vec<u32>),
    VU64(Vec<u64>),
    VF32(Vec<f32>),
    VF64(Vec<f64>),
    /// A custom type's postcard encoding.
    Bytes(Vec<u8>),
}

/// Why two values could not be combined.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReduceError {
    /// The reducer does not apply to this kind of value.
    #[error("reducer {0:?} does not apply to {1}")]
    Unsupported(Reducer, &'static str),
    /// Contributions of different kinds met.
    #[error("contributions of different types met: {0} and {1}")]
    Mismatch(&'static str, &'static str),
    /// Vector contributions of different lengths met.
    #[error("vector contributions of different lengths met: {0} and {1}")]
    Length(usize, usize),
    /// No custom reducer has that id.
    #[error("no custom reducer with id {0:#x} is registered")]
    UnknownCustom(u64),
    /// A custom reducer's input or output did not decode.
    #[error("custom reducer failed: {0}")]
    Custom(String),
}

/// A type that can be contributed to a reduction and delivered as its result.
///
/// `Default` is needed to type-check callbacks (see [`crate::Callback`]).
pub trait Reducible: Serialize + DeserializeOwned + Default + Clone + Send + 'static {
    /// Converts into the type-erased form.
    fn into_value(self) -> Value;
}

macro_rules! reducible {
    ($($t:ty => $v:ident, $vv:ident);*) => {$(
        impl Reducible for $t { fn into_value(self) -> Value { Value::$v(self) } }
        impl Reducible for Vec<$t> { fn into_value(self) -> Value { Value::$vv(self) } }
    )*};
}
reducible!(bool => Bool, VBool; i32 => I32, VI32; i64 => I64, VI64; u32 => U32, VU32; u64 => U64, VU64; f32 => F32, VF32; f64 => F64, VF64);

impl Reducible for () {
    fn into_value(self) -> Value {
        Value::Unit
    }
}

impl Value {
    /// Short name of the variant, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Unit => "()",
            Value::Bool(_) => "bool",
            Value::I32(_) => "i32",
            Value::I64(_) => "i64",
            Value::U32(_) => "u32",
            Value::U64(_) => "u64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::VBool(_) => "Vec<bool>",
            Value::VI32(_) => "Vec<i32>",
            Value::VI64(_) => "Vec<i64>",
            Value::VU32(_) => "Vec<u32>",
            Value::VU64(_) => "Vec<u64>",
            Value::VF32(_) => "Vec<f32>",
            Value::VF64(_) => "Vec<f64>",
            Value::Bytes(_) => "custom",
        }
    }

    /// The postcard encoding of the Rust value this represents: what a callback
    /// appends to its message prefix.
    pub fn encode_payload(&self) -> Vec<u8> {
        let enc = match self {
            Value::Unit => Ok(Vec::new()),
            Value::Bool(v) => postcard::to_allocvec(v),
            Value::I32(v) => postcard::to_allocvec(v),
            Value::I64(v) => postcard::to_allocvec(v),
            Value::U32(v) => postcard::to_allocvec(v),
            Value::U64(v) => postcard::to_allocvec(v),
            Value::F32(v) => postcard::to_allocvec(v),
            Value::F64(v) => postcard::to_allocvec(v),
            Value::VBool(v) => postcard::to_allocvec(v),
            Value::VI32(v) => postcard::to_allocvec(v),
            Value::VI64(v) => postcard::to_allocvec(v),
            Value::VU32(v) => postcard::to_allocvec(v),
            Value::VU64(v) => postcard::to_allocvec(v),
            Value::VF32(v) => postcard::to_allocvec(v),
            Value::VF64(v) => postcard::to_allocvec(v),
            Value::Bytes(b) => return b.clone(),
        };
        enc.expect("encoding a primitive into a Vec cannot fail")
    }
}

trait Num: Copy + PartialOrd {
    /// Whether the value is a float NaN (never true for integers and booleans).
    fn is_nan(self) -> bool {
        false
    }
    fn sum(self, o: Self) -> Self;
    fn prod(self, o: Self) -> Self;
    fn bits(self, _o: Self, _op: Reducer) -> Option<Self> {
        None
    }
}
macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn sum(self, o: Self) -> Self { self.wrapping_add(o) }
            fn prod(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn bits(self, o: Self, op: Reducer) -> Option<Self> {
                match op { Reducer::And => Some(self & o), Reducer::Or => Some(self | o), Reducer::Xor => Some(self ^ o), _ => None }
            }
        }
    )*};
}
int_num!(i32, i64, u32, u64);
macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            fn sum(self, o: Self) -> Self { self + o }
            fn prod(self, o: Self) -> Self { self * o }
        }
    )*};
}
float_num!(f32, f64);
impl Num for bool {
    fn sum(self, o: Self) -> Self {
        self | o
    }
    fn prod(self, o: Self) -> Self {
        self & o
    }
    fn bits(self, o: Self, op: Reducer) -> Option<Self> {
        match op {
            Reducer::And => Some(self & o),
            Reducer::Or => Some(self | o),
            Reducer::Xor => Some(self ^ o),
            _ => None,
        }
    }
}

fn scalar<T: Num>(a: T, b: T, op: Reducer, kind: &'static str) -> Result<T, ReduceError> {
    Ok(match op {
        Reducer::Sum => a.sum(b),
        Reducer::Product => a.prod(b),
        // NaN-aware: a NaN never wins, so min/max stay order-independent unless all are NaN.
        Reducer::Min => {
            if b < a || a.is_nan() {
                b
            } else {
                a
            }
        }
        Reducer::Max => {
            if b > a || a.is_nan() {
                b
            } else {
                a
            }
        }
        Reducer::And | Reducer::Or | Reducer::Xor => {
            a.bits(b, op).ok_or(ReduceError::Unsupported(op, kind))?
        }
        Reducer::Custom(_) => return Err(ReduceError::Unsupported(op, kind)),
    })
}

fn vector<T: Num>(
    mut a: Vec<T>,
    b: Vec<T>,
    op: Reducer,
    kind: &'static str,
) -> Result<Vec<T>, ReduceError> {
    if a.len() != b.len() {
        return Err(ReduceError::Length(a.len(), b.len()));
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = scalar(*x, y, op, kind)?;
    }
    Ok(a)
}

/// Where [`combine`] finds custom reducers: the [`Registry`](crate::Registry)
/// (a trait, so that reductions sit below the registry in the layers).
pub trait CustomReducers {
    /// Combines two encoded values with the custom reducer `id`.
    fn custom_reduce(&self, id: u64, a: &[u8], b: &[u8]) -> Result<Vec<u8>, ReduceError>;
}

/// Combines two partial results. `registry` resolves custom reducers.
pub fn combine(
    a: Value,
    b: Value,
    op: Reducer,
    registry: &dyn CustomReducers,
) -> Result<Value, ReduceError> {
    use Value::*;
    let (ka, kb) = (a.kind(), b.kind());
    Ok(match (a, b) {
        (Bytes(x), Bytes(y)) => match op {
            Reducer::Custom(id) => Bytes(registry.custom_reduce(id, &x, &y)?),
            _ => return Err(ReduceError::Unsupported(op, "custom")),
        },
        (_, _) if matches!(op, Reducer::Custom(_)) => return Err(ReduceError::Unsupported(op, ka)),
        (Unit, Unit) => Unit,
        (Bool(x), Bool(y)) => Bool(scalar(x, y, op, ka)?),
        (I32(x), I32(y)) => I32(scalar(x, y, op, ka)?),
        (I64(x), I64(y)) => I64(scalar(x, y, op, ka)?),
        (U32(x), U32(y)) => U32(scalar(x, y, op, ka)?),
        (U64(x), U64(y)) => U64(scalar(x, y, op, ka)?),
        (F32(x), F32(y)) => F32(scalar(x, y, op, ka)?),
        (F64(x), F64(y)) => F64(scalar(x, y, op, ka)?),
        (VBool(x), VBool(y)) => VBool(vector(x, y, op, ka)?),
        (VI32(x), VI32(y)) => VI32(vector(x, y, op, ka)?),
        (VI64(x), VI64(y)) => VI64(vector(x, y, op, ka)?),
        (VU32(x), VU32(y)) => VU32(vector(x, y, op, ka)?),
        (VU64(x), VU64(y)) => VU64(vector(x, y, op, ka)?),
        (VF32(x), VF32(y)) => VF32(vector(x, y, op, ka)?),
        (VF64(x), VF64(y)) => VF64(vector(x, y, op, ka)?),
        _ => return Err(ReduceError::Mismatch(ka, kb)),
    })
}

/// A contribution of a custom type, for [`Reducer::Custom`] reductions.
pub fn custom_value<T: Serialize>(v: &T) -> Value {
    Value::Bytes(postcard::to_allocvec(v).expect("encoding into a Vec cannot fail"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use proptest::prelude::*;

    fn fold(vals: &[Value], op: Reducer) -> Value {
        let reg = Registry::new();
        vals.iter()
            .cloned()
            .reduce(|a, b| combine(a, b, op, &reg).unwrap())
            .unwrap()
    }

    proptest! {
        /// Integer reductions do not depend on the order or grouping of contributions.
        #[test]
        fn integer_reducers_are_order_independent(mut xs in proptest::collection::vec(any::<i64>(), 1..40), seed: u64) {
            for op in [Reducer::Sum, Reducer::Product, Reducer::Min, Reducer::Max, Reducer::And, Reducer::Or, Reducer::Xor] {
                let a = fold(&xs.iter().map(|&x| Value::I64(x)).collect::<Vec<_>>(), op);
                let n = xs.len();
                xs.rotate_left((seed as usize) % n);
                xs.reverse();
                let b = fold(&xs.iter().map(|&x| Value::I64(x)).collect::<Vec<_>>(), op);
                prop_assert_eq!(a, b);
            }
        }

        /// Element-wise vector max equals the per-position max.
        #[test]
        fn vector_max_is_elementwise(rows in proptest::collection::vec(proptest::collection::vec(-1e6f64..1e6, 5), 1..10)) {
            let got = fold(&rows.iter().cloned().map(Value::VF64).collect::<Vec<_>>(), Reducer::Max);
            let want: Vec<f64> = (0..5).map(|i| rows.iter().map(|r| r[i]).fold(f64::MIN, f64::max)).collect();
            prop_assert_eq!(got, Value::VF64(want));
        }
    }

    #[test]
    fn wrapping_sum_and_errors() {
        let reg = Registry::new();
        assert_eq!(
            combine(Value::U64(u64::MAX), Value::U64(2), Reducer::Sum, &reg),
            Ok(Value::U64(1))
        );
        assert_eq!(
            combine(Value::F64(1.0), Value::F64(2.5), Reducer::Sum, &reg),
            Ok(Value::F64(3.5))
        );
        assert_eq!(
            combine(Value::Bool(true), Value::Bool(false), Reducer::And, &reg),
            Ok(Value::Bool(false))
        );
        assert!(matches!(
            combine(Value::F64(1.0), Value::F64(2.0), Reducer::Xor, &reg),
            Err(ReduceError::Unsupported(..))
        ));
        assert!(matches!(
            combine(Value::F64(1.0), Value::I64(2), Reducer::Sum, &reg),
            Err(ReduceError::Mismatch(..))
        ));
        assert!(matches!(
            combine(
                Value::VI32(vec![1]),
                Value::VI32(vec![1, 2]),
                Reducer::Sum,
                &reg
            ),
            Err(ReduceError::Length(1, 2))
        ));
        assert!(matches!(
            combine(
                Value::Bytes(vec![]),
                Value::Bytes(vec![]),
                Reducer::custom("nope"),
                &reg
            ),
            Err(ReduceError::UnknownCustom(_))
        ));
    }

    #[test]
    fn max_ignores_nan_unless_alone() {
        let reg = Registry::new();
        assert_eq!(
            combine(Value::F64(f64::NAN), Value::F64(1.0), Reducer::Max, &reg),
            Ok(Value::F64(1.0))
        );
        assert_eq!(
            combine(Value::F64(1.0), Value::F64(f64::NAN), Reducer::Max, &reg),
            Ok(Value::F64(1.0))
        );
    }

    #[test]
    fn payload_matches_postcard_of_the_rust_value() {
        assert_eq!(
            Value::F64(2.5).encode_payload(),
            postcard::to_allocvec(&2.5f64).unwrap()
        );
        assert_eq!(
            Value::VU64(vec![1, 300]).encode_payload(),
            postcard::to_allocvec(&vec![1u64, 300]).unwrap()
        );
    }
}
