//! Tiny `--flag value` parsing for the example programs (they take their
//! arguments from the runtime, so no CLI framework is involved).

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
