//! Readonly globals: set by the main chare's constructor on PE 0, broadcast
//! before any other message is delivered, then visible on every PE (and
//! adopted by every newcomer).
//!
//! Declare one as a `static`, register it, set it in main, read it anywhere:
//! ```ignore
//! static GRID: Readonly<GridSpec> = Readonly::new("jacobi2d.grid");
//! reg.readonly(&GRID);
//! GRID.set(ctx, spec);           // main's constructor only
//! let spec = GRID.get(ctx);      // any entry method, any PE
//! ```

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ids::fnv1a;
use crate::port::PeCtx;

/// A handle to a readonly global of type `T`, named stably.
pub struct Readonly<T> {
    name: &'static str,
    id: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Readonly<T> {
    /// Declares a readonly named `name` (the name is its identity on the wire).
    pub const fn new(name: &'static str) -> Self {
        Readonly {
            name,
            id: fnv1a(name.as_bytes()),
            _t: PhantomData,
        }
    }

    /// The stable name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Sets the value. Only the main chare's constructor may do this.
    ///
    /// # Panics
    /// Anywhere else: readonly data must reach every PE before any other
    /// message, which only holds for values set before main returns.
    pub fn set(&self, ctx: &mut PeCtx<'_>, value: T) {
        ctx.set_readonly(self.id, self.name, Arc::new(value));
    }

    /// The value.
    ///
    /// # Panics
    /// If the value was never set by main or the readonly was not registered.
    pub fn get<'a>(&self, ctx: &'a PeCtx<'_>) -> &'a T {
        ctx.readonly_value(self.id)
            .and_then(|v| v.downcast_ref::<T>())
            .unwrap_or_else(|| {
                panic!(
                    "readonly `{}` was not registered or not set by main",
                    self.name
                )
            })
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Arc<dyn Any + Send + Sync>, postcard::Error> {
        Ok(Arc::new(postcard::from_bytes::<T>(bytes)?))
    }

    pub(crate) fn encode(v: &(dyn Any + Send + Sync)) -> Vec<u8> {
        let v = v
            .downcast_ref::<T>()
            .expect("readonly table holds the registered type");
        postcard::to_allocvec(v).expect("encoding into a Vec cannot fail")
    }
}
