//! Logging setup: `tracing` to stderr, as text for people or JSON lines for machines.

use std::fmt;
use std::io::IsTerminal;
use std::str::FromStr;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format `{other}`; use `text` or `json`"
            )),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("invalid log level `{level}`: {reason} (use error, warn, info, debug, trace or a tracing filter such as `dxdp=debug`)")]
pub struct LogLevelError {
    level: String,
    reason: String,
}

/// The plain levels.
pub const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a log level or filter and builds it. A bare word must be a level: tracing would take
/// any other word (`verbose`) as a target name and silence every dxdp log line.
pub fn filter(level: &str) -> Result<EnvFilter, LogLevelError> {
    let err = |reason: String| LogLevelError {
        level: level.to_string(),
        reason,
    };
    let text = level.trim();
    let is_filter = text.contains(['=', ',', '[', ':']);
    if !is_filter && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(text)) {
        return Err(err(format!("`{text}` is not a level")));
    }
    EnvFilter::builder()
        .parse(text)
        .map_err(|e| err(e.to_string()))
}

/// Installs the global subscriber writing to stderr. Calling it twice keeps the first one.
pub fn init(format: LogFormat, level: &str) -> Result<(), LogLevelError> {
    let filter = filter(level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(colour(std::io::stderr().is_terminal()));
    // try_init fails only when a subscriber is already installed, which is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}

/// Whether to colour output: only on a terminal, and never when `NO_COLOR` is set to anything
/// but the empty string (https://no-color.org).
pub fn colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_filters_are_checked() {
        let table = [
            ("info", true),
            ("WARN", true),
            ("off", true),
            ("dxdp=debug", true),
            ("warn,dxdp=trace", true),
            ("dxdp::plugin=debug", true),
            ("verbose", false),
            ("", false),
            ("dxdp=loud", false),
        ];
        for (level, ok) in table {
            assert_eq!(filter(level).is_ok(), ok, "{level:?}");
        }
    }

    #[test]
    fn no_colour_off_a_terminal() {
        assert!(!colour(false));
    }
}
