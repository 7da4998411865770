//! How every Ductile binary sets up its logs: `tracing` to stderr, filtered
//! by `DUCTILE_LOG`, as text for people or as one JSON object per line for
//! log collectors (`--log-format json` or `DUCTILE_LOG_FORMAT=json`), with
//! the fields of the enclosing spans (a rescale's `epoch`, an LB `step`) in
//! every line.

use std::str::FromStr;

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

use crate::contract::ENV_LOG;

/// The log format's environment variable: `text` (default) or `json`.
pub const ENV_LOG_FORMAT: &str = "DUCTILE_LOG_FORMAT";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; spans as `name{field=value}:` prefixes.
    #[default]
    Text,
    /// One JSON object per line, with the current span and the list of
    /// enclosing spans and their fields.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "{ENV_LOG_FORMAT}={other}: the log format is `text` or `json`"
            )),
        }
    }
}

impl LogFormat {
    /// The name `DUCTILE_LOG_FORMAT` and `--log-format` take.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }

    /// The format `DUCTILE_LOG_FORMAT` names (text when unset).
    pub fn from_env() -> Result<LogFormat, String> {
        std::env::var(ENV_LOG_FORMAT)
            .map(|v| v.parse())
            .unwrap_or(Ok(LogFormat::Text))
    }
}

/// What a binary wants from its logs besides the format.
#[derive(Clone, Copy, Debug)]
pub struct LogSetup {
    /// The filter when `DUCTILE_LOG` is unset (`info`, `warn`...).
    pub default_filter: &'static str,
    /// Text lines name the module that logged.
    pub target: bool,
    /// A line when an enabled span closes, with its time (a rescale's
    /// stages at `DUCTILE_LOG=ductile=debug`).
    pub span_close: bool,
}

/// Installs the stderr subscriber; does nothing if one is installed.
pub fn init(setup: LogSetup, format: LogFormat) {
    let filter = EnvFilter::try_from_env(ENV_LOG)
        .unwrap_or_else(|_| EnvFilter::new(setup.default_filter));
    let spans = if setup.span_close {
        FmtSpan::CLOSE
    } else {
        FmtSpan::NONE
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_span_events(spans)
        .with_target(setup.target);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

/// [`init`] with the format of `DUCTILE_LOG_FORMAT`; a value that is
/// neither format is reported and text is used.
pub fn init_from_env(setup: LogSetup) {
    let format = LogFormat::from_env();
    init(setup, format.clone().unwrap_or_default());
    if let Err(e) = format {
        tracing::warn!("{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_anything_else_is_refused_by_name() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!(" JSON ".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert_eq!("".parse::<LogFormat>(), Ok(LogFormat::Text));
        let e = "yaml".parse::<LogFormat>().unwrap_err();
        assert!(e.contains("DUCTILE_LOG_FORMAT=yaml"), "{e}");
    }
}
