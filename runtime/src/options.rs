//! Runtime options given on a program's command line, Charm++ style: every
//! argument starting with `+` is the runtime's, and is removed before the
//! program's main chare sees its arguments.
//!
//! | option | meaning |
//! |---|---|
//! | `+lb NAME` | load-balancing strategy for `at_sync` steps (`Greedy`, `GreedyRefine`, `Refine`, `Rotate`, `Null`, and the `...RateAware` variants); default `Null` |
//! | `+lb-params K=V,...` | strategy parameters, e.g. `tolerance=1.1` |
//! | `+lb-rescale NAME` | strategy of the steps a rescale runs (evacuation, populating newcomers); default `Contiguous` (one run of consecutive elements per PE: keeps neighbours together) |
//! | `+lb-restore on\|off` | a job restored from a checkpoint (`DUCTILE_RESTORE`) first runs the step the checkpoint interrupted: `on` (default) balances it with `+lb-rescale`'s strategy, `off` resumes the elements where the restore put them (array elements round-robin by their old PE), the papers' restart without rebalancing |
//! | `--newcomer`, `--coordinator ADDR` | join a running job as a newcomer (same as `DUCTILE_ROLE=newcomer`, `DUCTILE_COORDINATOR`); the secret still comes from `DUCTILE_SECRET`/`DUCTILE_SECRET_FILE` |
//! | `+lb-dump DIR` | write each step's statistics to `DIR/lb-<coll>-<step>.json` (and the plan the strategy made to `...plan.json`) for offline replay |
//! | `+lb-report` | print one `lb step=...` line per step on PE 0's stdout |
//! | `+lb-smoothing A` | weight of the newest measurement in the loads and speeds a steady-state step balances (an exponential average over steps; 1: none); default 0.5 |
//! | `+lb-min-gain G` | a steady-state step migrates only when its plan shortens the predicted makespan by more than this fraction; default 0.05 (0: any gain) |
//! | `+lb-period SECS` | periodic balancing: an `at_sync` step only balances when SECS have passed since the last one that did (others resume at once) |
//! | `+pe-affinity[=on\|off\|auto]` | pin PE `i` of a node to the `i`-th CPU it may use; default `auto`: only when the node has exactly a CPU per PE (a dedicated cpuset); bare `+pe-affinity` is `on` |
//! | `+pe-speed PE:F,...` | emulate slower PEs: PE `PE` does `F` times the work per second (0 < F <= 1) |
//! | `+ft-every K` | fault tolerance: at every K-th `at_sync` sync point every PE keeps an in-memory checkpoint of its chares and sends a copy to a buddy PE on the next node; a node other than node 0 lost without notice is then recovered live (docs/elasticity.md, "Node loss without notice"); default 0, off |
//! | `+link-delay-us MAX` | emulate an uneven network: each frame from another node waits a random 0..MAX µs before delivery (order per link kept), so messages on different paths overtake each other; for tests |
//!
//! Values may follow as the next argument or after `=`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::lb::{self, strategy::Strategy, Params};
use crate::topo::Pe;

/// Parsed runtime options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The strategy `at_sync` steps use.
    pub strategy: Arc<dyn Strategy>,
    /// Where to dump statistics, if anywhere.
    pub lb_dump: Option<PathBuf>,
    /// Print a line per LB step.
    pub lb_report: bool,
    /// Balance at most once per this period; `at_sync` steps in between resume at once.
    pub lb_period: Option<std::time::Duration>,
    /// Emulated speed of each listed PE.
    pub pe_speed: HashMap<Pe, f64>,
    /// The strategy of the steps a rescale runs (evacuating departing PEs,
    /// populating newcomers): it must move objects, so never `Null`.
    pub rescale_strategy: Arc<dyn Strategy>,
    /// `--newcomer`: join a running job (same as `DUCTILE_ROLE=newcomer`).
    pub newcomer: bool,
    /// `--coordinator ADDR`: the job's coordinator (same as `DUCTILE_COORDINATOR`).
    pub coordinator: Option<String>,
    /// `+link-delay-us MAX`: the longest emulated delay of a frame from
    /// another node (zero: none).
    pub link_delay: std::time::Duration,
    /// `+pe-affinity`: when PE threads are pinned to cores.
    pub pe_affinity: crate::affinity::Affinity,
    /// `+lb-smoothing A`: weight of the newest measurement (see [`lb::steady`]).
    pub lb_smoothing: f64,
    /// `+lb-min-gain G`: the makespan fraction a plan must gain to be carried out.
    pub lb_min_gain: f64,
    /// `+lb-restore on|off`: whether a restored job's first step balances
    /// (with [`Options::rescale_strategy`]) or resumes the restore's placement.
    pub lb_restore: bool,
    /// `+ft-every K`: take a buddy checkpoint at every K-th sync point and
    /// recover from the loss of a node (0: off).
    pub ft_every: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            strategy: Arc::from(lb::by_name("Null", Params::default()).expect("Null exists")),
            lb_dump: None,
            lb_report: false,
            lb_period: None,
            pe_speed: HashMap::new(),
            rescale_strategy: Arc::from(
                lb::by_name("Contiguous", Params::default()).expect("Contiguous exists"),
            ),
            newcomer: false,
            coordinator: None,
            link_delay: std::time::Duration::ZERO,
            pe_affinity: crate::affinity::Affinity::Auto,
            lb_smoothing: lb::steady::DEFAULT_SMOOTHING,
            lb_min_gain: lb::steady::DEFAULT_MIN_GAIN,
            lb_restore: true,
            ft_every: 0,
        }
    }
}

/// Splits `args` into the runtime's options and the program's arguments.
pub fn parse(args: Vec<String>) -> Result<(Options, Vec<String>), String> {
    let mut opts = Options::default();
    let mut rest = Vec::new();
    let mut name = String::from("Null");
    let mut params = String::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        // The two launch flags of a newcomer started by hand; the secret
        // still comes from the environment (never on a command line).
        if a == "--newcomer" {
            opts.newcomer = true;
            continue;
        }
        if let Some(addr) = a.strip_prefix("--coordinator=") {
            opts.coordinator = Some(addr.to_string());
            continue;
        }
        if a == "--coordinator" {
            opts.coordinator = Some(it.next().ok_or("--coordinator needs an address")?);
            continue;
        }
        let Some(flag) = a.strip_prefix('+') else {
            rest.push(a);
            continue;
        };
        let (key, inline) = match flag.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (flag.to_string(), None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("+{key} needs {what}"))
        };
        match key.as_str() {
            "lb" => name = value("a strategy name")?,
            "lb-params" => params = value("KEY=VALUE[,KEY=VALUE]")?,
            "lb-dump" => opts.lb_dump = Some(PathBuf::from(value("a directory")?)),
            "lb-report" => opts.lb_report = true,
            "lb-period" => {
                let v = value("seconds")?;
                let secs: f64 = v.parse().ok().filter(|s: &f64| s.is_finite() && *s >= 0.0).ok_or_else(|| format!("+lb-period: `{v}` is not a number of seconds"))?;
                opts.lb_period = Some(std::time::Duration::from_secs_f64(secs));
            }
            "pe-speed" => opts.pe_speed = parse_speeds(&value("PE:FACTOR[,PE:FACTOR]")?)?,
            "link-delay-us" => {
                let v = value("microseconds")?;
                let us: u64 = v.parse().map_err(|_| format!("+link-delay-us: `{v}` is not a whole number of microseconds"))?;
                opts.link_delay = std::time::Duration::from_micros(us);
            }
            "pe-affinity" => {
                opts.pe_affinity = match &inline {
                    Some(v) => v.parse()?,
                    None => crate::affinity::Affinity::On,
                };
            }
            "lb-smoothing" => {
                let v = value("a weight in (0, 1]")?;
                opts.lb_smoothing = v.parse().ok().filter(|a: &f64| *a > 0.0 && *a <= 1.0).ok_or_else(|| format!("+lb-smoothing: `{v}` is not a weight in (0, 1]"))?;
            }
            "lb-min-gain" => {
                let v = value("a fraction")?;
                opts.lb_min_gain = v.parse().ok().filter(|g: &f64| g.is_finite() && *g >= 0.0 && *g < 1.0).ok_or_else(|| format!("+lb-min-gain: `{v}` is not a fraction in [0, 1)"))?;
            }
            "lb-rescale" => {
                let name = value("a strategy name")?;
                if name == "Null" {
                    return Err("+lb-rescale: Null cannot populate newcomers; choose a strategy that moves objects".into());
                }
                opts.rescale_strategy = Arc::from(lb::by_name(&name, Params::default()).map_err(|e| e.to_string())?);
            }
            "lb-restore" => {
                let v = value("on or off")?;
                opts.lb_restore = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("+lb-restore: `{v}` is not on or off")),
                };
            }
            "ft-every" => {
                let v = value("a number of sync points")?;
                opts.ft_every = v.parse().map_err(|_| format!("+ft-every: `{v}` is not a whole number of sync points (0: off)"))?;
            }
            other => {
                return Err(format!("unknown runtime option +{other} (known: +lb, +lb-params, +lb-dump, +lb-report, +lb-period, +lb-smoothing, +lb-min-gain, +lb-rescale, +lb-restore, +ft-every, +pe-affinity, +pe-speed, +link-delay-us)"))
            }
        }
    }
    let params = Params::parse(&params).map_err(|e| e.to_string())?;
    opts.strategy = Arc::from(lb::by_name(&name, params).map_err(|e| e.to_string())?);
    Ok((opts, rest))
}

fn parse_speeds(text: &str) -> Result<HashMap<Pe, f64>, String> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let (pe, f) = item
                .split_once(':')
                .ok_or_else(|| format!("+pe-speed: `{item}` is not PE:FACTOR"))?;
            let pe: Pe = pe
                .trim()
                .parse()
                .map_err(|_| format!("+pe-speed: `{pe}` is not a PE number"))?;
            let f: f64 = f
                .trim()
                .parse()
                .map_err(|_| format!("+pe-speed: `{f}` is not a number"))?;
            if !(f > 0.0 && f <= 1.0) {
                return Err(format!(
                    "+pe-speed: factor {f} for PE {pe} must be in (0, 1]"
                ));
            }
            Ok((pe, f))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn newcomer_flags_are_taken_out_of_the_programs_arguments() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (o, rest) = parse(args(&[
            "--newcomer",
            "--iters",
            "5",
            "--coordinator",
            "10.0.0.1:7000",
        ]))
        .unwrap();
        assert!(o.newcomer);
        assert_eq!(o.coordinator.as_deref(), Some("10.0.0.1:7000"));
        assert_eq!(rest, args(&["--iters", "5"]));
        let (o, _) = parse(args(&["--coordinator=h:1"])).unwrap();
        assert_eq!((o.newcomer, o.coordinator.as_deref()), (false, Some("h:1")));
        assert!(parse(args(&["--coordinator"])).is_err());
    }

    #[test]
    fn runtime_options_are_taken_out_of_the_program_arguments() {
        let (o, rest) = parse(args(&[
            "--grid",
            "64",
            "+lb",
            "GreedyRefine",
            "+pe-speed=1:0.5,3:0.25",
            "+lb-report",
            "x",
        ]))
        .unwrap();
        assert_eq!(rest, args(&["--grid", "64", "x"]));
        assert_eq!(o.strategy.name(), "GreedyRefine");
        assert_eq!(o.pe_speed[&1], 0.5);
        assert_eq!(o.pe_speed[&3], 0.25);
        assert!(o.lb_report);
        let (o, _) = parse(args(&["+lb-period", "2.5"])).unwrap();
        assert_eq!(o.lb_period, Some(std::time::Duration::from_millis(2500)));
        assert!(parse(args(&["+lb-period", "soon"])).is_err());
        let (o, _) = parse(args(&["+link-delay-us=1500"])).unwrap();
        assert_eq!(o.link_delay, std::time::Duration::from_micros(1500));
        assert!(parse(args(&["+link-delay-us", "-3"])).is_err());
        assert!(Options::default().lb_restore);
        let (o, rest) = parse(args(&["+lb-restore", "off", "--iters", "3"])).unwrap();
        assert!(!o.lb_restore);
        assert_eq!(rest, args(&["--iters", "3"]));
        let (o, _) = parse(args(&["+lb-restore=on"])).unwrap();
        assert!(o.lb_restore);
        assert!(parse(args(&["+lb-restore", "maybe"]))
            .unwrap_err()
            .contains("on or off"));
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        assert!(parse(args(&["+lb", "Nope"]))
            .unwrap_err()
            .contains("GreedyRefine"));
        assert!(parse(args(&["+pe-speed", "1:2"]))
            .unwrap_err()
            .contains("(0, 1]"));
        assert!(parse(args(&["+frobnicate"]))
            .unwrap_err()
            .contains("unknown runtime option"));
        assert!(parse(args(&["+lb"])).unwrap_err().contains("needs"));
        assert_eq!(parse(args(&["+ft-every", "5"])).unwrap().0.ft_every, 5);
        assert_eq!(parse(args(&["+ft-every=3"])).unwrap().0.ft_every, 3);
        assert_eq!(parse(args(&[])).unwrap().0.ft_every, 0, "off by default");
        assert!(parse(args(&["+ft-every", "-1"])).unwrap_err().contains("+ft-every"));
        assert!(parse(args(&["+lb-params", "tolerance=0.5", "+lb", "Refine"])).is_err());
    }
}
