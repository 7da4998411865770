//! The example programs' arguments: clap definitions checked before a node
//! joins its job ([`parse_or_exit`]), parsed again by the main chare
//! ([`parse_main`]), the options every benchmark driver shares
//! ([`BenchArgs`]) and the value parsers they have in common.
//!
//! A node's command line holds the runtime's own `+flags` (and its
//! `--newcomer` / `--coordinator` launch flags) besides the program's; the
//! runtime's option parser ([`ductile::options::parse`]) splits them, and
//! only the program's go to clap.

/// The program's own arguments from this process's command line, the
/// runtime's flags taken out; `None` when the runtime's flags do not parse
/// (the runtime then reports that itself when the node starts).
pub fn program_args() -> Option<Vec<String>> {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    ductile::options::parse(argv).ok().map(|(_, rest)| rest)
}

/// Parses `args` (the program's own) as `P`, with `name` as the program name.
pub fn try_parse<P: clap::Parser>(name: &str, args: &[String]) -> Result<P, clap::Error> {
    P::try_parse_from(std::iter::once(name.to_owned()).chain(args.iter().cloned()))
}

/// Parses the program's arguments with clap before the node joins its job:
/// `--help` prints the help with the defaults and exits 0; an unknown flag or
/// a bad value is refused with clap's message ("did you mean ...") and exit
/// code 2. Under `ductile run` only launch member 0 prints (every node
/// refuses the same arguments); the others exit with the same code quietly.
pub fn parse_or_exit<P: clap::Parser>(name: &str) -> P {
    let args = program_args().unwrap_or_default();
    match try_parse::<P>(name, &args) {
        Ok(parsed) => parsed,
        Err(err) => {
            let speaker = std::env::var("DUCTILE_LAUNCH_INDEX")
                .map_or(std::env::var_os("DUCTILE_ROLE").is_none(), |i| i == "0");
            if speaker {
                let _ = err.print();
            }
            std::process::exit(err.exit_code())
        }
    }
}

/// Parses a chare's `Init` arguments (the program's own, as the runtime
/// passes them to the main chare) as `P`; on an error prints clap's message
/// and exits with its code. `main` checked the same arguments before the
/// node joined, so this fails only if the two disagree.
pub fn parse_main<P: clap::Parser>(name: &str, args: &[String]) -> P {
    try_parse::<P>(name, args).unwrap_or_else(|err| {
        let _ = err.print();
        std::process::exit(err.exit_code())
    })
}

/// A clap value parser for counts that must be at least 1 (`--reps`, `--iters`).
pub fn at_least_one<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + From<u8>,
{
    let value: T = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number"))?;
    if value < T::from(1) {
        return Err("must be at least 1".to_owned());
    }
    Ok(value)
}

/// A clap value parser for a finite amount that may be zero but not
/// negative (`pingpong --gap-us`).
pub fn non_negative(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a number of at least 0")),
    }
}

/// The options every benchmark driver (`bench_core`, `bench_rescale`,
/// `bench_lb`) shares: how many jobs per case, the quick smoke mode, the
/// bound on one child job, and where the JSON goes. Flattened into each
/// driver's own clap struct.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct BenchArgs {
    /// Jobs per case (the tables show their median, min and max)
    /// [default: 5, or 1 with --quick].
    #[arg(long, value_name = "N", value_parser = at_least_one::<usize>)]
    pub reps: Option<usize>,
    /// A smoke run: smaller problems, one rep; checks the harness, not the figures.
    #[arg(long)]
    pub quick: bool,
    /// Seconds one child job may run before it is killed and the bench fails.
    #[arg(long = "child-timeout", value_name = "SECS")]
    pub child_timeout_s: Option<u64>,
    /// Where the JSON goes [default: target/bench/<bench>.json].
    #[arg(long, value_name = "PATH")]
    pub out: Option<std::path::PathBuf>,
}

impl BenchArgs {
    /// `--reps`, else 1 with `--quick`, else 5.
    pub fn reps(&self) -> usize {
        self.reps.unwrap_or(if self.quick { 1 } else { 5 })
    }

    /// `--child-timeout`, else the driver's default.
    pub fn child_timeout_s(&self, default: u64) -> u64 {
        self.child_timeout_s.unwrap_or(default)
    }

    /// `value` when given, else the quick or the full default.
    pub fn pick<T>(&self, value: Option<T>, quick: T, full: T) -> T {
        value.unwrap_or(if self.quick { quick } else { full })
    }
}

/// Parses `N` or `AxB` into a pair (`N` means `NxN`).
pub fn pair(text: &str) -> Result<(u32, u32), String> {
    let parse = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("`{text}` is not N or AxB"))
    };
    match text.split_once('x') {
        Some((a, b)) => Ok((parse(a)?, parse(b)?)),
        None => {
            let n = parse(text)?;
            Ok((n, n))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Bench {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pairs() {
        assert_eq!(pair("64x32"), Ok((64, 32)));
        assert_eq!(pair("8"), Ok((8, 8)));
        assert!(pair("8y").is_err());
    }

    #[test]
    fn bench_options_default_by_mode_and_refuse_zero_reps_and_unknown_flags() {
        let full: Bench = try_parse("b", &[]).unwrap();
        assert_eq!(full.bench.reps(), 5);
        assert_eq!(full.bench.pick(None, 1, 2), 2);
        assert_eq!(full.bench.child_timeout_s(300), 300);
        let quick: Bench = try_parse("b", &strings(&["--quick", "--child-timeout=7"])).unwrap();
        assert_eq!(quick.bench.reps(), 1);
        assert_eq!(quick.bench.pick(None, 1, 2), 1);
        assert_eq!(quick.bench.pick(Some(9), 1, 2), 9);
        assert_eq!(quick.bench.child_timeout_s(300), 7);
        let zero = try_parse::<Bench>("b", &strings(&["--reps", "0"])).unwrap_err();
        assert_eq!(zero.exit_code(), 2);
        assert!(zero.to_string().contains("at least 1"), "{zero}");
        let typo = try_parse::<Bench>("b", &strings(&["--rep", "3"])).unwrap_err();
        assert_eq!(typo.exit_code(), 2);
        assert!(typo.to_string().contains("--reps"), "did you mean: {typo}");
        let help = try_parse::<Bench>("b", &strings(&["--help"])).unwrap_err();
        assert_eq!(help.exit_code(), 0);
    }
}
