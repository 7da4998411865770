//! The statistics a load-balancing step works from — per-object measured load and
//! per-PE speed, background load and leaving flag — and their versioned JSON dump
//! (the `+LBDump` of Charm++), so that a step can be replayed offline.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{LbError, Result};

/// The dump format version [`LbStats::dump`] writes and [`LbStats::load`] reads.
pub const FORMAT: u32 = 1;

/// A migratable object's identity: the collection it belongs to and its index key
/// in that collection. Ordered by collection, then index; ties in every strategy are
/// broken by this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjId {
    /// The collection (array) id.
    pub collection: u64,
    /// The element's index key within the collection.
    pub index: u128,
}

impl ObjId {
    /// The object `index` of collection `collection`.
    pub const fn new(collection: u64, index: u128) -> Self {
        Self { collection, index }
    }
}

impl fmt::Display for ObjId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.collection, self.index)
    }
}

/// One object's measurement over the last LB period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjStat {
    /// Which object.
    pub id: ObjId,
    /// The PE it lives on now (where `load` was measured).
    pub pe: u32,
    /// Seconds of work measured on its current PE.
    pub load: f64,
    /// Estimated serialized size, i.e. what migrating it would send.
    pub bytes: u64,
    /// Whether it may move; a non-migratable object stays where it is.
    pub migratable: bool,
}

/// One PE's measurement over the last LB period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeStat {
    /// The PE.
    pub pe: u32,
    /// Relative work rate, 1.0 = nominal; 0.5 does the same work in twice the time.
    /// Measured from the objects' own work, not from a table.
    pub speed: f64,
    /// Seconds of non-object load (runtime, communication, other tenants) on this PE.
    pub background: f64,
    /// Seconds this PE was idle.
    pub idle: f64,
    /// The PE is being evacuated: no object may be placed on it.
    pub leaving: bool,
}

/// Everything a strategy sees at one LB step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LbStats {
    /// The LB step number (for logs and dumps).
    pub step: u64,
    /// Every object taking part, in any order.
    pub objs: Vec<ObjStat>,
    /// Every PE, in any order.
    pub pes: Vec<PeStat>,
}

/// On-disk shape: `{"format":1,"step":..,"pes":[..],"objs":[..]}`.
#[derive(Serialize)]
struct DumpRef<'a> {
    format: u32,
    step: u64,
    pes: &'a [PeStat],
    objs: &'a [ObjStat],
}

#[derive(Deserialize)]
struct DumpOwned {
    step: u64,
    pes: Vec<PeStat>,
    objs: Vec<ObjStat>,
}

/// Read first, so a future format is refused by version, not by a field error.
#[derive(Deserialize)]
struct Header {
    format: u64,
}

impl LbStats {
    /// Checks that a strategy can run on these statistics: at least one PE, no
    /// duplicate ids, every object on a listed PE, finite non-negative loads and
    /// times, speeds > 0, at least one PE not leaving, and no non-migratable
    /// object on a leaving PE.
    pub fn validate(&self) -> Result<()> {
        if self.pes.is_empty() {
            return Err(LbError::NoPes);
        }
        let mut leaving = BTreeMap::new();
        for p in &self.pes {
            if leaving.insert(p.pe, p.leaving).is_some() {
                return Err(LbError::DuplicatePe(p.pe));
            }
            let bad = |field, value| LbError::BadPeStat {
                pe: p.pe,
                field,
                value,
            };
            if !(p.speed.is_finite() && p.speed > 0.0) {
                return Err(bad("speed", p.speed));
            }
            if !(p.background.is_finite() && p.background >= 0.0) {
                return Err(bad("background", p.background));
            }
            if !(p.idle.is_finite() && p.idle >= 0.0) {
                return Err(bad("idle", p.idle));
            }
        }
        if leaving.values().all(|&l| l) {
            return Err(LbError::AllLeaving);
        }
        let mut ids = BTreeSet::new();
        for o in &self.objs {
            if !ids.insert(o.id) {
                return Err(LbError::DuplicateObj(o.id));
            }
            let on_leaving = *leaving.get(&o.pe).ok_or(LbError::UnknownPe {
                obj: o.id,
                pe: o.pe,
            })?;
            if !(o.load.is_finite() && o.load >= 0.0) {
                return Err(LbError::BadLoad {
                    obj: o.id,
                    load: o.load,
                });
            }
            if on_leaving && !o.migratable {
                return Err(LbError::Pinned {
                    obj: o.id,
                    pe: o.pe,
                });
            }
        }
        Ok(())
    }

    /// The dump as one line of JSON (format [`FORMAT`]). Floats are written so that
    /// [`LbStats::from_json`] reads them back bit-exactly; a NaN (which
    /// [`validate`](Self::validate) refuses anyway) is written as `null` and will
    /// not load.
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string(&self.dump_ref())?)
    }

    /// Reads a dump written by [`to_json`](Self::to_json) or [`dump`](Self::dump).
    /// Does not validate: a replay reports bad statistics when it solves.
    pub fn from_json(text: &str) -> Result<Self> {
        Self::check_format(serde_json::from_str::<Header>(text)?)?;
        let d: DumpOwned = serde_json::from_str(text)?;
        Ok(Self {
            step: d.step,
            objs: d.objs,
            pes: d.pes,
        })
    }

    /// Writes the dump to `path` (replacing it).
    pub fn dump(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| LbError::Io {
            path: path.to_owned(),
            source,
        };
        let mut w = BufWriter::new(std::fs::File::create(path).map_err(io)?);
        serde_json::to_writer(&mut w, &self.dump_ref())?;
        w.write_all(b"\n").map_err(io)?;
        w.flush().map_err(io)
    }

    /// Reads a dump from `path`; see [`from_json`](Self::from_json).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| LbError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&text)
    }

    /// Reads a dump from any reader (e.g. stdin).
    pub fn read_from(mut reader: impl Read) -> Result<Self> {
        let mut text = String::new();
        reader
            .read_to_string(&mut text)
            .map_err(|source| LbError::Io {
                path: "<reader>".into(),
                source,
            })?;
        Self::from_json(&text)
    }

    fn dump_ref(&self) -> DumpRef<'_> {
        DumpRef {
            format: FORMAT,
            step: self.step,
            pes: &self.pes,
            objs: &self.objs,
        }
    }

    fn check_format(h: Header) -> Result<()> {
        if h.format != u64::from(FORMAT) {
            return Err(LbError::UnsupportedFormat { found: h.format });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LbStats {
        LbStats {
            step: 7,
            pes: vec![
                PeStat {
                    pe: 0,
                    speed: 1.0,
                    background: 0.125,
                    idle: 0.5,
                    leaving: false,
                },
                PeStat {
                    pe: 3,
                    speed: 0.1 + 0.2,
                    background: 0.0,
                    idle: 0.0,
                    leaving: true,
                },
            ],
            objs: vec![ObjStat {
                id: ObjId::new(u64::MAX, u128::MAX),
                pe: 3,
                load: std::f64::consts::PI / 7.0,
                bytes: 1 << 40,
                migratable: true,
            }],
        }
    }

    #[test]
    fn json_round_trips_bit_exactly_with_extreme_ids() {
        let s = sample();
        let text = s.to_json().unwrap();
        assert!(text.starts_with("{\"format\":1,"), "{text}");
        assert_eq!(LbStats::from_json(&text).unwrap(), s);
    }

    #[test]
    fn file_round_trip() {
        let path = std::env::temp_dir().join(format!(
            "ductile-lb-stats-{}-roundtrip.json",
            std::process::id()
        ));
        let s = sample();
        s.dump(&path).unwrap();
        let back = LbStats::load(&path).unwrap();
        let again = LbStats::read_from(std::fs::File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(back, s);
        assert_eq!(again, s);
    }

    #[test]
    fn refuses_other_formats_and_missing_files() {
        let text = sample()
            .to_json()
            .unwrap()
            .replace("\"format\":1", "\"format\":2");
        assert!(matches!(
            LbStats::from_json(&text),
            Err(LbError::UnsupportedFormat { found: 2 })
        ));
        assert!(matches!(
            LbStats::from_json("{\"step\":1}"),
            Err(LbError::Json(_))
        ));
        assert!(matches!(
            LbStats::from_json("not json"),
            Err(LbError::Json(_))
        ));
        let missing = std::env::temp_dir().join("ductile-lb-does-not-exist/x.json");
        assert!(matches!(LbStats::load(missing), Err(LbError::Io { .. })));
    }
}
