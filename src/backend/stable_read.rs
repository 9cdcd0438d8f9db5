//! Reading a file that another process may be rewriting in place.
//!
//! Snapshot and configuration files should be replaced atomically (write a new file, rename it
//! over the old one; a ConfigMap update does that), but an editor or `echo > file` rewrites the
//! file in place, and a reader can then see it half-written. A file cut at a line boundary is often
//! still valid YAML, just with fewer adapters, so parsing cannot tell. [`read_settled`] reads the
//! file until two reads taken a settle time apart agree.

use std::path::Path;
use std::time::Duration;

/// How long the content must stay the same before it is believed, and how often to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle {
    /// The pause between two reads that must agree.
    pub interval: Duration,
    /// The most reads before giving up.
    pub max_reads: u32,
}

impl Settle {
    /// The default for snapshot and configuration files: 100 ms apart, up to 20 reads (2 s).
    pub const DEFAULT: Settle = Settle {
        interval: Duration::from_millis(100),
        max_reads: 20,
    };
}

impl Default for Settle {
    fn default() -> Self {
        Settle::DEFAULT
    }
}

/// Why a file could not be read in a settled state.
#[derive(Debug, thiserror::Error)]
pub enum StableReadError {
    /// The file cannot be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Every read differed from the one before.
    #[error(
        "it kept changing: {reads} reads {interval:?} apart never agreed; replace it atomically (write a new file, then rename it over the old one)"
    )]
    Unsettled {
        /// How many reads were made.
        reads: u32,
        /// The pause between reads.
        interval: Duration,
    },
}

impl From<StableReadError> for std::io::Error {
    fn from(e: StableReadError) -> Self {
        match e {
            StableReadError::Io(e) => e,
            unsettled => std::io::Error::other(unsettled.to_string()),
        }
    }
}

/// Reads `path` as UTF-8 text once it has settled: reads it, waits `settle.interval`, reads it
/// again, and returns the content when two consecutive reads are identical. A file that is
/// removed or unreadable mid-way is an error, as is one that never settles within
/// `settle.max_reads` reads. Blocks the calling thread.
pub fn read_settled(path: &Path, settle: Settle) -> Result<String, StableReadError> {
    let bytes = settled(|| std::fs::read(path), std::thread::sleep, settle).inspect_err(|e| {
        if matches!(e, StableReadError::Unsettled { .. }) {
            tracing::debug!(path = %path.display(), "file never settled");
        }
    })?;
    String::from_utf8(bytes)
        .map_err(|e| StableReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// The settle loop over any reader and pause, so tests can drive it without a clock.
fn settled(
    mut read: impl FnMut() -> std::io::Result<Vec<u8>>,
    mut pause: impl FnMut(Duration),
    settle: Settle,
) -> Result<Vec<u8>, StableReadError> {
    let mut last = read()?;
    let mut reads = 1;
    while reads < settle.max_reads.max(2) {
        pause(settle.interval);
        let now = read()?;
        reads += 1;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    Err(StableReadError::Unsettled {
        reads,
        interval: settle.interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Settle = Settle {
        interval: Duration::from_millis(5),
        max_reads: 4,
    };

    #[test]
    fn a_quiet_file_is_read_with_two_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "a: 1\n").unwrap();
        assert_eq!(read_settled(&path, FAST).unwrap(), "a: 1\n");
    }

    #[test]
    fn missing_and_non_utf8_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        assert!(matches!(
            read_settled(&path, FAST),
            Err(StableReadError::Io(_))
        ));
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        let err = read_settled(&path, FAST).unwrap_err();
        assert!(
            matches!(&err, StableReadError::Io(e) if e.kind() == std::io::ErrorKind::InvalidData)
        );
    }

    /// Runs the settle loop over a scripted sequence of file contents (the last repeats).
    fn script(contents: &[&str], max_reads: u32) -> (Result<Vec<u8>, StableReadError>, usize) {
        let mut i = 0;
        let mut pauses = 0;
        let result = settled(
            || {
                let c = contents[i.min(contents.len() - 1)];
                i += 1;
                Ok(c.as_bytes().to_vec())
            },
            |_| pauses += 1,
            Settle {
                interval: Duration::from_millis(100),
                max_reads,
            },
        );
        (result, pauses)
    }

    #[test]
    fn content_is_taken_only_when_two_consecutive_reads_agree() {
        // (contents read in turn, max reads, expected content or None, expected pauses)
        let table: [(&[&str], u32, Option<&str>, usize); 6] = [
            (&["a"], 4, Some("a"), 1),
            (&["a\n", "a\nb\n"], 4, Some("a\nb\n"), 2),
            (&["", "a\n", "a\nb\n", "a\nb\n"], 4, Some("a\nb\n"), 3),
            (&["", "a\n", "a\nb\n", "a\nb\nc\n", "x"], 4, None, 3),
            // A half-written file read twice mid-write is the only way to be fooled; a full
            // rewrite that changes back is fine.
            (&["full", "", "full", "full"], 5, Some("full"), 3),
            (&["a", "b"], 1, None, 1),
        ];
        for (contents, max_reads, expected, pauses) in table {
            let (result, n) = script(contents, max_reads);
            match expected {
                Some(want) => assert_eq!(result.unwrap(), want.as_bytes(), "{contents:?}"),
                None => assert!(
                    matches!(result, Err(StableReadError::Unsettled { .. })),
                    "{contents:?}: {result:?}"
                ),
            }
            assert_eq!(n, pauses, "{contents:?}");
        }
    }
}
