//! Rescale planning, as the library exposes it: what a shrink/expand
//! request means for PE numbering. The rescale itself lives in the
//! runtime's `rescale/` folder (docs/runtime.md, "The rescale layer"); this
//! module keeps the public names where programs and tools found them.

pub use crate::rescale::plan::{plan, Renumbering, RescaleError, RescaleRequest};
