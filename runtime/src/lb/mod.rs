//! Measurement-based load balancing: per-object and per-PE statistics, strategies
//! that turn them into a placement, and best-possible bounds to judge a placement.
//!
//! Everything here is a pure function of an [`LbStats`] snapshot: no scheduler, no
//! clock, no messages. The runtime measures, calls [`Strategy::solve`] at an LB step
//! and migrates what [`Assignment::migrations`] lists; tools and tests replay a dumped
//! snapshot ([`LbStats::load`]) into the same strategy and get exactly the same plan.
//!
//! ```
//! use ductile::lb::{self, CostModel, LbStats, ObjId, ObjStat, Params, PeStat};
//!
//! let pe = |pe, speed| PeStat { pe, speed, background: 0.0, idle: 0.0, leaving: false };
//! let obj = |i: u128, pe, load| ObjStat { id: ObjId::new(0, i), pe, load, bytes: 64, migratable: true };
//! let stats = LbStats {
//!     step: 1,
//!     pes: vec![pe(0, 1.0), pe(1, 0.5)],
//!     objs: (0..4).map(|i| obj(i, (i % 2) as u32, if i % 2 == 0 { 1.0 } else { 2.0 })).collect(),
//! };
//! let plan = lb::by_name("GreedyRefineRateAware", Params::default())?.solve(&stats)?;
//! assert_eq!(plan.migrations(&stats).len(), 1);
//! let ratio = plan.max_avg_ratio(&stats, CostModel::RateAware)?;
//! let best = lb::optimal::best(&stats, CostModel::RateAware)?;
//! assert!(ratio <= best.ratio() * 1.05);
//! # Ok::<(), lb::LbError>(())
//! ```
//!
//! See `docs/load-balancing.md` for the strategies, the rate-aware cost model and the
//! dump format.

pub mod contiguous;
pub mod optimal;
pub mod stats;
pub mod steady;
pub mod strategy;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use contiguous::Contiguous;
pub use stats::{LbStats, ObjId, ObjStat, PeStat};
pub use strategy::{
    Assignment, CostModel, Greedy, GreedyRefine, Migration, Null, Placement, Refine, Rotate,
    Strategy,
};

/// What can go wrong when checking statistics, choosing a strategy, solving or
/// reading a dump.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LbError {
    /// `by_name` was given a name no strategy has.
    #[error("unknown load balancer `{name}`; valid names: {valid}")]
    UnknownStrategy {
        /// The name asked for.
        name: String,
        /// Every valid name, comma-separated.
        valid: String,
    },
    /// A strategy parameter is unknown or out of range.
    #[error("bad load-balancer parameter `{key}`: {reason}")]
    BadParam {
        /// The parameter's name.
        key: String,
        /// Why it was refused.
        reason: String,
    },
    /// The statistics list no PE.
    #[error("load-balancer statistics list no PE")]
    NoPes,
    /// Every PE is leaving, so there is nowhere to put objects.
    #[error("every PE is leaving: nowhere to place objects")]
    AllLeaving,
    /// A PE id appears twice.
    #[error("PE {0} appears twice in the statistics")]
    DuplicatePe(u32),
    /// An object id appears twice.
    #[error("object {0} appears twice in the statistics")]
    DuplicateObj(ObjId),
    /// An object claims to live on a PE the statistics do not list.
    #[error("object {obj} is on PE {pe}, which the statistics do not list")]
    UnknownPe {
        /// The object.
        obj: ObjId,
        /// The PE it names.
        pe: u32,
    },
    /// An object's load is NaN, infinite or negative.
    #[error("object {obj} has load {load}; loads must be finite and >= 0")]
    BadLoad {
        /// The object.
        obj: ObjId,
        /// The offending value.
        load: f64,
    },
    /// A PE's speed is not finite and > 0, or its background/idle time is not
    /// finite and >= 0.
    #[error("PE {pe} has {field} {value}; speed must be finite and > 0, times finite and >= 0")]
    BadPeStat {
        /// The PE.
        pe: u32,
        /// `speed`, `background` or `idle`.
        field: &'static str,
        /// The offending value.
        value: f64,
    },
    /// A non-migratable object sits on a leaving PE: it cannot be evacuated.
    #[error("object {obj} is not migratable but its PE {pe} is leaving")]
    Pinned {
        /// The object.
        obj: ObjId,
        /// Its (leaving) PE.
        pe: u32,
    },
    /// An assignment and the statistics it is evaluated against disagree.
    #[error("assignment does not match the statistics: {0}")]
    PlanMismatch(String),
    /// Reading or writing a dump failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The dump file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A dump is not valid JSON of the expected shape.
    #[error("load-balancer dump: {0}")]
    Json(#[from] serde_json::Error),
    /// A dump has a format version this build cannot read.
    #[error(
        "load-balancer dump has format {found}; this build reads format {}",
        stats::FORMAT
    )]
    UnsupportedFormat {
        /// The version found in the file.
        found: u64,
    },
}

/// Results of this module.
pub type Result<T, E = LbError> = std::result::Result<T, E>;

/// Every name [`by_name`] accepts.
pub const STRATEGIES: &[&str] = &[
    "Greedy",
    "GreedyRateAware",
    "GreedyRefine",
    "GreedyRefineRateAware",
    "Refine",
    "RefineRateAware",
    "Contiguous",
    "ContiguousRateAware",
    "Rotate",
    "Null",
];

/// Strategy parameters; each strategy reads the ones it uses and ignores the rest.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// How far above the best a PE may be before objects leave it (`>= 1`).
    /// GreedyRefine keeps an object home while that keeps the maximum load within
    /// `tolerance` x Greedy's maximum; Refine moves objects off PEs above
    /// `tolerance` x the average. Default 1.05.
    pub tolerance: f64,
}

impl Default for Params {
    fn default() -> Self {
        Self { tolerance: 1.05 }
    }
}

impl Params {
    /// Parses `key=value[,key=value...]` as given on a command line, e.g.
    /// `tolerance=1.1`; an empty string gives the defaults.
    pub fn parse(text: &str) -> Result<Self> {
        let mut params = Self::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| LbError::BadParam {
                key: item.to_owned(),
                reason: "expected key=value".into(),
            })?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "tolerance" => {
                    params.tolerance = value.parse().map_err(|e| LbError::BadParam {
                        key: key.to_owned(),
                        reason: format!("`{value}`: {e}"),
                    })?;
                }
                _ => {
                    return Err(LbError::BadParam {
                        key: key.to_owned(),
                        reason: "unknown parameter; known: tolerance".into(),
                    })
                }
            }
        }
        params.validate()?;
        Ok(params)
    }

    /// Checks every parameter's range.
    pub fn validate(&self) -> Result<()> {
        if !(self.tolerance.is_finite() && self.tolerance >= 1.0) {
            return Err(LbError::BadParam {
                key: "tolerance".into(),
                reason: format!("{} is not a finite number >= 1", self.tolerance),
            });
        }
        Ok(())
    }
}

/// The strategy called `name` (one of [`STRATEGIES`]), configured by `params`.
///
/// Names ending in `RateAware` use [`CostModel::RateAware`]; the others
/// [`CostModel::Uniform`].
pub fn by_name(name: &str, params: Params) -> Result<Box<dyn Strategy>> {
    params.validate()?;
    let tolerance = params.tolerance;
    let (uniform, rate_aware) = (CostModel::Uniform, CostModel::RateAware);
    Ok(match name {
        "Greedy" => Box::new(Greedy { model: uniform }),
        "GreedyRateAware" => Box::new(Greedy { model: rate_aware }),
        "GreedyRefine" => Box::new(GreedyRefine {
            model: uniform,
            tolerance,
        }),
        "GreedyRefineRateAware" => Box::new(GreedyRefine {
            model: rate_aware,
            tolerance,
        }),
        "Refine" => Box::new(Refine {
            model: uniform,
            tolerance,
        }),
        "RefineRateAware" => Box::new(Refine {
            model: rate_aware,
            tolerance,
        }),
        "Contiguous" => Box::new(Contiguous { model: uniform }),
        "ContiguousRateAware" => Box::new(Contiguous { model: rate_aware }),
        "Rotate" => Box::new(Rotate),
        "Null" => Box::new(Null),
        _ => {
            return Err(LbError::UnknownStrategy {
                name: name.to_owned(),
                valid: STRATEGIES.join(", "),
            })
        }
    })
}
