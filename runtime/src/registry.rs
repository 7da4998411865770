//! The registry: every chare type, readonly and custom reducer a program uses,
//! identified by stable names.
//!
//! Each node builds the registry by running the program's registration
//! function, whatever path brought it up (launch, survivor re-entry, newcomer).
//! Identifiers are hashes of names, never registration order, and the
//! registry's fingerprint covers names and Rust type names, so a node running
//! a different build is refused when it joins.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::chare::{Chare, IndexKey};
use crate::collection::{linear_of, make_store, Store};
use crate::gpu::{GpuModule, GpuSpec};
use crate::msg::CollId;
use crate::readonly::Readonly;
use crate::reduce::ReduceError;

/// The stable name hash, kept here under its old path for programs.
pub use crate::ids::fnv1a;

pub(crate) type StoreFactory = fn(CollId) -> Box<dyn Store>;
pub(crate) type LinearFn = fn(IndexKey, IndexKey) -> Option<u64>;
type CustomFn = Box<dyn Fn(&[u8], &[u8]) -> Result<Vec<u8>, ReduceError> + Send + Sync>;
pub(crate) type ReadonlyDecode = fn(&[u8]) -> Result<Arc<dyn Any + Send + Sync>, postcard::Error>;
pub(crate) type ReadonlyEncode = fn(&(dyn Any + Send + Sync)) -> Vec<u8>;

pub(crate) struct ChareEntry {
    pub name: &'static str,
    pub make: StoreFactory,
    pub linear: LinearFn,
    signature: String,
}

pub(crate) struct ReadonlyEntry {
    pub name: &'static str,
    pub decode: ReadonlyDecode,
    pub encode: ReadonlyEncode,
    signature: String,
}

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two registrations hash to the same id (same name, or an FNV collision).
    #[error(
        "{kind} `{name}` collides with `{other}` (same stable id {id:#018x}); give it another name"
    )]
    Collision {
        /// What was registered.
        kind: &'static str,
        /// The new name.
        name: &'static str,
        /// The name already holding the id.
        other: &'static str,
        /// The id.
        id: u64,
    },
}

/// Registrations of one program.
#[derive(Default)]
pub struct Registry {
    pub(crate) chares: BTreeMap<u64, ChareEntry>,
    pub(crate) readonlies: BTreeMap<u64, ReadonlyEntry>,
    customs: BTreeMap<u64, (&'static str, String, CustomFn)>,
    pub(crate) main_type: Option<u64>,
    /// What the program asks of GPUs (`None`: nothing).
    pub(crate) gpu: Option<GpuSpec>,
    errors: Vec<RegistryError>,
}

impl crate::reduce::CustomReducers for Registry {
    fn custom_reduce(&self, id: u64, a: &[u8], b: &[u8]) -> Result<Vec<u8>, ReduceError> {
        Registry::custom_reduce(self, id, a, b)
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a chare type (array element, group or nodegroup member).
    pub fn chare<C: Chare>(&mut self) -> &mut Self {
        let id = fnv1a(C::NAME.as_bytes());
        let signature = format!(
            "chare {} index={} init={} msg={}",
            C::NAME,
            std::any::type_name::<C::Index>(),
            std::any::type_name::<C::Init>(),
            std::any::type_name::<C::Msg>()
        );
        match self.chares.get(&id) {
            Some(e) if e.signature == signature => {}
            Some(e) => self.errors.push(RegistryError::Collision {
                kind: "chare",
                name: C::NAME,
                other: e.name,
                id,
            }),
            None => {
                self.chares.insert(
                    id,
                    ChareEntry {
                        name: C::NAME,
                        make: make_store::<C>,
                        linear: linear_of::<C::Index>,
                        signature,
                    },
                );
            }
        }
        self
    }

    /// Registers the main chare type: constructed once, on PE 0, with the
    /// program's arguments, at launch only (never on a newcomer).
    pub fn main<M: Chare<Index = (), Init = Vec<String>>>(&mut self) -> &mut Self {
        self.chare::<M>();
        self.main_type = Some(fnv1a(M::NAME.as_bytes()));
        self
    }

    /// Registers a readonly global.
    pub fn readonly<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        &mut self,
        ro: &'static Readonly<T>,
    ) -> &mut Self {
        let signature = format!("readonly {} type={}", ro.name(), std::any::type_name::<T>());
        match self.readonlies.get(&ro.id()) {
            Some(e) if e.signature == signature => {}
            Some(e) => self.errors.push(RegistryError::Collision {
                kind: "readonly",
                name: ro.name(),
                other: e.name,
                id: ro.id(),
            }),
            None => {
                self.readonlies.insert(
                    ro.id(),
                    ReadonlyEntry {
                        name: ro.name(),
                        decode: Readonly::<T>::decode,
                        encode: Readonly::<T>::encode,
                        signature,
                    },
                );
            }
        }
        self
    }

    /// Registers a custom reducer over `T`, used as [`crate::Reducer::custom`]`(name)`.
    /// `combine` must be associative and commutative.
    pub fn reducer<T: Serialize + DeserializeOwned + 'static>(
        &mut self,
        name: &'static str,
        combine: fn(T, T) -> T,
    ) -> &mut Self {
        let id = fnv1a(name.as_bytes());
        let signature = format!("reducer {name} type={}", std::any::type_name::<T>());
        if let Some((other, sig, _)) = self.customs.get(&id) {
            if *sig != signature {
                self.errors.push(RegistryError::Collision {
                    kind: "reducer",
                    name,
                    other,
                    id,
                });
            }
            return self;
        }
        let f: CustomFn = Box::new(move |a, b| {
            let a: T =
                postcard::from_bytes(a).map_err(|e| ReduceError::Custom(format!("{name}: {e}")))?;
            let b: T =
                postcard::from_bytes(b).map_err(|e| ReduceError::Custom(format!("{name}: {e}")))?;
            postcard::to_allocvec(&combine(a, b))
                .map_err(|e| ReduceError::Custom(format!("{name}: {e}")))
        });
        self.customs.insert(id, (name, signature, f));
        self
    }

    /// Asks for GPUs: every node creates its CUDA contexts and one stream
    /// per PE at start ([`crate::gpu`]), and fails at start where it cannot.
    pub fn gpus(&mut self) -> &mut Self {
        self.gpu.get_or_insert_with(GpuSpec::default);
        self
    }

    /// Registers a CUDA module (and asks for GPUs): every node compiles it
    /// with NVRTC and loads it at start; PEs launch its kernels through
    /// [`crate::gpu::PeGpu`].
    pub fn gpu_module(&mut self, module: GpuModule) -> &mut Self {
        let spec = self.gpu.get_or_insert_with(GpuSpec::default);
        match spec.modules.iter().find(|m| m.name == module.name) {
            Some(m) if m.signature() == module.signature() => {}
            Some(m) => self.errors.push(RegistryError::Collision {
                kind: "gpu module",
                name: module.name,
                other: m.name,
                id: fnv1a(module.name.as_bytes()),
            }),
            None => spec.modules.push(module),
        }
        self
    }

    /// Whether the program asked for GPUs.
    pub fn uses_gpus(&self) -> bool {
        self.gpu.is_some()
    }

    pub(crate) fn custom_reduce(
        &self,
        id: u64,
        a: &[u8],
        b: &[u8],
    ) -> Result<Vec<u8>, ReduceError> {
        let (_, _, f) = self
            .customs
            .get(&id)
            .ok_or(ReduceError::UnknownCustom(id))?;
        f(a, b)
    }

    /// Registration errors (name collisions), if any.
    pub fn errors(&self) -> &[RegistryError] {
        &self.errors
    }

    /// A hash of every registration's name and Rust types. Nodes of one job must agree on it.
    pub fn fingerprint(&self) -> u64 {
        let mut all = String::new();
        for e in self.chares.values() {
            all.push_str(&e.signature);
            all.push('\n');
        }
        for e in self.readonlies.values() {
            all.push_str(&e.signature);
            all.push('\n');
        }
        for (_, sig, _) in self.customs.values() {
            all.push_str(sig);
            all.push('\n');
        }
        if let Some(m) = self.main_type {
            all.push_str(&format!("main {m:x}"));
        }
        // A node without GPUs (or with other kernels) cannot join a GPU job.
        if let Some(gpu) = &self.gpu {
            all.push_str("\ngpus");
            for m in &gpu.modules {
                all.push('\n');
                all.push_str(&m.signature());
            }
        }
        fnv1a(all.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable() {
        // Reference values of FNV-1a 64.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn gpus_change_the_fingerprint_and_module_names_collide() {
        use crate::gpu::Param;
        let plain = Registry::new().fingerprint();
        let mut g = Registry::new();
        g.gpus();
        assert!(g.uses_gpus() && !Registry::new().uses_gpus());
        assert_ne!(plain, g.fingerprint());
        let m = GpuModule::new("m", "src").kernel("k", &[Param::I32]);
        g.gpu_module(m.clone()).gpu_module(m);
        assert!(g.errors().is_empty(), "the same module twice is one module");
        let with_module = g.fingerprint();
        assert_ne!(with_module, Registry::new().gpus().fingerprint());
        g.gpu_module(GpuModule::new("m", "other src"));
        assert_eq!(g.errors().len(), 1);
        assert!(g.errors()[0].to_string().contains("gpu module `m`"));
    }

    #[test]
    fn reducer_name_collision_is_reported_and_fingerprint_covers_types() {
        let mut a = Registry::new();
        a.reducer::<u64>("r", |x, y| x + y);
        let fa = a.fingerprint();
        a.reducer::<i32>("r", |x, y| x + y);
        assert_eq!(a.errors().len(), 1);
        let mut b = Registry::new();
        b.reducer::<i64>("r", |x, y| x + y);
        assert_ne!(fa, b.fingerprint());
        assert_eq!(
            a.custom_reduce(
                fnv1a(b"r"),
                &postcard::to_allocvec(&2u64).unwrap(),
                &postcard::to_allocvec(&3u64).unwrap()
            )
            .unwrap(),
            postcard::to_allocvec(&5u64).unwrap()
        );
    }
}
