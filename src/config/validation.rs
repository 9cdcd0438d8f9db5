//! `validation`: the in-cluster validation Jobs (docs/validation.md, "In the cluster"): whether
//! the daemon runs them, how often, how long one may take, the image and the host directory
//! where the daemon places its `dxdp.exe` for them. Node-wide, top level only; each run reads
//! the configuration in force, so a reload applies at the next run.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use dxdp_core::quote::quote;

use super::schema::inline_schema;
use super::values::DurationText;

/// The default time between scheduled runs: a day.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// The default limit of one run: 20 minutes (the first pull of a Server Core image takes long).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// The default host directory of the `dxdp.exe` copies.
pub(crate) const DEFAULT_HOST_DIR: &str = r"C:\var\lib\dxdp\validation";

/// `validation` as written in the file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ValidationFile {
    /// Run validation Jobs on this node (needs the API server and RBAC for Jobs).
    pub(crate) enabled: Option<bool>,
    /// Time between scheduled runs (also after registration and after a driver change).
    pub(crate) interval: Option<IntervalText>,
    /// How long one run may take before it is `unknown` (the Job's deadline).
    pub(crate) timeout: Option<TimeoutText>,
    /// The image of the validation pod; empty: Server Core matching the host's build.
    pub(crate) image: Option<ImageText>,
    /// The host directory where the daemon places its dxdp.exe for the Job (mounted read-only).
    pub(crate) host_dir: Option<HostDirText>,
    /// The startup taint (`startupTaint`) also waits for a passed validation.
    pub(crate) gate: Option<bool>,
}

/// `validation.image`, checked: `None` when empty.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(crate) struct ImageText(pub(crate) Option<String>);

inline_schema!(ImageText, {"description": "the validation pod's image; empty: mcr.microsoft.com/windows/servercore matching the host's build", "type": "string"});

impl TryFrom<String> for ImageText {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        check_image(&s).map(ImageText)
    }
}

/// `validation.hostDir`, checked: an absolute path (the default when empty).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(crate) struct HostDirText(pub(crate) String);

inline_schema!(HostDirText, {"description": "an absolute host directory; empty: C:\\var\\lib\\dxdp\\validation", "type": "string"});

impl TryFrom<String> for HostDirText {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        check_host_dir(&s).map(HostDirText)
    }
}

/// The effective `validation` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validation {
    /// Run validation Jobs.
    pub(crate) enabled: bool,
    /// Time between scheduled runs.
    pub(crate) interval: Duration,
    /// The limit of one run.
    pub(crate) timeout: Duration,
    /// The image; `None`: `mcr.microsoft.com/windows/servercore:<ltsc>` matching the host.
    pub(crate) image: Option<String>,
    /// Where the daemon places its `dxdp.exe`.
    pub(crate) host_dir: String,
    /// `validation.gate`: the startup taint also waits for a passed validation.
    pub(crate) gate: bool,
}

impl Default for Validation {
    fn default() -> Self {
        Validation {
            enabled: false,
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            image: None,
            host_dir: DEFAULT_HOST_DIR.into(),
            gate: false,
        }
    }
}

/// Parses `90s`, `15m`, `2h`, `1d` or a number of seconds within `min..=max`.
pub(crate) fn parse_duration(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.char_indices().last() {
        Some((i, 's')) => (&t[..i], 1),
        Some((i, 'm')) => (&t[..i], 60),
        Some((i, 'h')) => (&t[..i], 3600),
        Some((i, 'd')) => (&t[..i], 86400),
        _ => (t, 1),
    };
    let bad = || {
        format!(
            "duration {} is not from {} to {}: use e.g. 30m, 12h, 1d or a number of seconds",
            quote(text),
            format_duration(min),
            format_duration(max)
        )
    };
    let n: u64 = number.trim().parse().map_err(|_| bad())?;
    let secs = n.checked_mul(unit).ok_or_else(bad)?;
    let d = Duration::from_secs(secs);
    if d < min || d > max {
        return Err(bad());
    }
    Ok(d)
}

/// `1d`, `12h`, `30m`, `90s`: how the configuration writes a duration.
pub(crate) fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(86400) {
        format!("{}d", s / 86400)
    } else if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

macro_rules! bounded_duration {
    ($name:ident, $min:expr, $max:expr, $what:literal, $schema:literal) => {
        #[doc = concat!("`validation.", $what, "`: a duration within its bounds.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
        #[serde(try_from = "DurationText")]
        pub(crate) struct $name(pub(crate) Duration);

        impl $name {
            /// The shortest allowed.
            pub(crate) const MIN: Duration = $min;
            /// The longest allowed.
            pub(crate) const MAX: Duration = $max;

            /// Parses the text form.
            pub(crate) fn parse(text: &str) -> Result<Self, String> {
                parse_duration(text, Self::MIN, Self::MAX)
                    .map($name)
                    .map_err(|e| format!("validation.{}: {e}", $what))
            }
        }

        impl TryFrom<DurationText> for $name {
            type Error = String;
            fn try_from(v: DurationText) -> Result<Self, Self::Error> {
                $name::parse(&v.text())
            }
        }

        inline_schema!($name, {
            "description": $schema,
            "anyOf": [
                {"type": "integer", "minimum": $name::MIN.as_secs(), "maximum": $name::MAX.as_secs()},
                {"type": "string", "pattern": "^[0-9]+(s|m|h|d)?$"}
            ]
        });
    };
}

bounded_duration!(
    IntervalText,
    Duration::from_secs(15 * 60),
    Duration::from_secs(30 * 86400),
    "interval",
    "time between scheduled validation runs: 12h, 1d or a number of seconds, from 15 minutes to 30 days"
);
bounded_duration!(
    TimeoutText,
    Duration::from_secs(60),
    Duration::from_secs(6 * 3600),
    "timeout",
    "the limit of one validation run (the Job's deadline): 20m, 1h or a number of seconds, from 1 minute to 6 hours"
);

pub(super) fn check_image(text: &str) -> Result<Option<String>, String> {
    let t = text.trim();
    if t.chars().any(char::is_whitespace) {
        return Err(format!(
            "validation.image {} contains white space: write an image reference such as mcr.microsoft.com/windows/servercore:ltsc2022, or leave it empty for Server Core matching the host",
            quote(text)
        ));
    }
    Ok((!t.is_empty()).then(|| t.to_string()))
}

pub(super) fn check_host_dir(text: &str) -> Result<String, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(DEFAULT_HOST_DIR.into());
    }
    let b = t.as_bytes();
    let absolute = (b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && b[2] == b'\\')
        || t.starts_with('/');
    if !absolute {
        return Err(format!(
            "validation.hostDir {} is not an absolute path: write a host directory such as {DEFAULT_HOST_DIR}",
            quote(text)
        ));
    }
    Ok(t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_units_and_bounds() {
        assert_eq!(
            IntervalText::parse("1d").unwrap().0,
            Duration::from_secs(86400)
        );
        assert_eq!(
            IntervalText::parse("12h").unwrap().0,
            Duration::from_secs(43200)
        );
        assert_eq!(
            TimeoutText::parse("900").unwrap().0,
            Duration::from_secs(900)
        );
        let e = IntervalText::parse("5m").unwrap_err();
        assert_eq!(
            e,
            "validation.interval: duration \"5m\" is not from 15m to 30d: use e.g. 30m, 12h, 1d or a number of seconds"
        );
        assert!(TimeoutText::parse("7h").is_err());
        assert!(TimeoutText::parse("ten").is_err());
        assert_eq!(format_duration(Duration::from_secs(1200)), "20m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    }

    #[test]
    fn images_and_host_directories_are_checked() {
        assert_eq!(check_image(" "), Ok(None));
        assert_eq!(
            check_image("mcr.microsoft.com/windows/servercore:ltsc2025"),
            Ok(Some("mcr.microsoft.com/windows/servercore:ltsc2025".into()))
        );
        assert!(check_image("a b").is_err());
        assert_eq!(check_host_dir(""), Ok(DEFAULT_HOST_DIR.into()));
        assert_eq!(check_host_dir(r"D:\dxdp"), Ok(r"D:\dxdp".into()));
        assert!(check_host_dir(r"dxdp\exe")
            .unwrap_err()
            .contains("absolute"));
    }
}
