//! The example programs' arguments: clap definitions checked before a node
//! joins its job ([`parse_or_exit`]), and tiny `--flag value` helpers for the
//! benchmark drivers.
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

/// Finds `--name value` (or `--name=value`) in `args`.
pub fn value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let flag = format!("--{name}");
    let prefix = format!("--{name}=");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == flag {
            return it.next().map(String::as_str);
        }
        if let Some(v) = a.strip_prefix(&prefix) {
            return Some(v);
        }
    }
    None
}

/// Parses `--name value` as `T`, with a default; a malformed value is an error message.
pub fn parse<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, String> {
    match value(args, name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("--{name}: cannot parse `{v}`")),
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

/// Whether `--name` is present.
pub fn flag(args: &[String], name: &str) -> bool {
    let flag = format!("--{name}");
    args.contains(&flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flags() {
        let a: Vec<String> = ["--grid", "64x32", "--iters=5", "--quiet"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(pair(value(&a, "grid").unwrap()), Ok((64, 32)));
        assert_eq!(parse(&a, "iters", 1u64), Ok(5));
        assert_eq!(parse(&a, "missing", 7u64), Ok(7));
        assert!(flag(&a, "quiet"));
        assert_eq!(pair("8"), Ok((8, 8)));
        assert!(pair("8y").is_err());
    }
}
