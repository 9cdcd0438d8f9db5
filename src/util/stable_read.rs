//! Reading a file that another process may be rewriting in place.
//!
//! Snapshot and configuration files should be replaced atomically (write a new file, rename it
//! over the old one; a ConfigMap update does that), but an editor or `echo > file` rewrites the
//! file in place, and a reader can then see it half-written. A file cut at a line boundary is often
//! still valid YAML, just with fewer adapters, so parsing cannot tell. [`read_settled`] takes the
//! file's metadata (size, modification time and, on Unix, inode and change time) before and after
//! each read and believes the content only when both agree and the content has the size the
//! metadata gives: a file that is already stable is read once, with no wait. When they differ (a
//! write landed during the read) it reads again after a short pause that doubles each time, up to
//! `Settle::interval`, for at most `Settle::max_reads` reads.
//!
//! A writer that pauses between two writes for longer than one read takes leaves the metadata
//! unchanged across that read; the daemon covers that case with file events (it reads a file
//! written in place once it is closed, or after a grace period on Windows).

use std::path::Path;
use std::time::{Duration, SystemTime};

/// How patient a read is with a file that keeps changing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle {
    /// The longest pause between two reads (the first pause is [`FIRST_PAUSE`], doubling up
    /// to this).
    pub interval: Duration,
    /// The most reads before giving up.
    pub max_reads: u32,
}

/// The pause before the first re-read of a file that changed while it was read.
pub const FIRST_PAUSE: Duration = Duration::from_millis(1);

impl Settle {
    /// The default for snapshot and configuration files: pauses of 1 ms doubling up to 100 ms,
    /// up to 20 reads (about 1.6 s of pauses in all).
    pub const DEFAULT: Settle = Settle {
        interval: Duration::from_millis(100),
        max_reads: 20,
    };

    /// The pause before read number `reads + 1`.
    fn pause_after(&self, reads: u32) -> Duration {
        let doubled = FIRST_PAUSE.saturating_mul(1u32 << reads.saturating_sub(1).min(16));
        doubled.min(self.interval.max(FIRST_PAUSE))
    }
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
    /// The file changed during every read.
    #[error(
        "it kept changing: it was written to during each of {reads} reads (over {waited:?}); replace it atomically (write a new file, then rename it over the old one)"
    )]
    Unsettled {
        /// How many reads were made.
        reads: u32,
        /// The time spent pausing between them.
        waited: Duration,
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

/// What identifies one version of a file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    inode: (u64, u64),
    #[cfg(unix)]
    changed: (i64, i64),
}

impl Stamp {
    /// The stamp of `path` now.
    pub fn of(path: &Path) -> std::io::Result<Stamp> {
        Ok(Stamp::from_metadata(&std::fs::metadata(path)?))
    }

    fn from_metadata(m: &std::fs::Metadata) -> Stamp {
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        Stamp {
            len: m.len(),
            modified: m.modified().ok(),
            #[cfg(unix)]
            inode: (m.dev(), m.ino()),
            #[cfg(unix)]
            changed: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// One read of a file with its stamp before and after.
#[derive(Debug)]
struct Sample {
    before: Stamp,
    bytes: Vec<u8>,
    after: Stamp,
}

impl Sample {
    /// Whether nothing was written to the file during the read.
    fn is_whole(&self) -> bool {
        self.before == self.after && self.bytes.len() as u64 == self.before.len
    }
}

fn sample(path: &Path) -> std::io::Result<Sample> {
    let before = Stamp::of(path)?;
    let bytes = std::fs::read(path)?;
    let after = Stamp::of(path)?;
    Ok(Sample {
        before,
        bytes,
        after,
    })
}

/// Reads `path` as UTF-8 text once a read sees no write: the metadata before and after the read
/// agree and match the content's size. A file that is already stable is read once; otherwise it
/// is read again after pauses of [`FIRST_PAUSE`] doubling up to `settle.interval`. A file that
/// is removed or unreadable mid-way is an error, as is one written to during each of
/// `settle.max_reads` reads. Blocks the calling thread (only while it pauses, and only when the
/// file is being written).
pub fn read_settled(path: &Path, settle: Settle) -> Result<String, StableReadError> {
    let bytes = settled(|| sample(path), std::thread::sleep, settle).inspect_err(|e| {
        if matches!(e, StableReadError::Unsettled { .. }) {
            tracing::debug!(path = %path.display(), "file never settled");
        }
    })?;
    String::from_utf8(bytes)
        .map_err(|e| StableReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// The settle loop over any sampler and pause, so tests can drive it without a clock.
fn settled(
    mut read: impl FnMut() -> std::io::Result<Sample>,
    mut pause: impl FnMut(Duration),
    settle: Settle,
) -> Result<Vec<u8>, StableReadError> {
    let mut reads = 0;
    let mut waited = Duration::ZERO;
    loop {
        let now = read()?;
        reads += 1;
        if now.is_whole() {
            return Ok(now.bytes);
        }
        if reads >= settle.max_reads.max(1) {
            return Err(StableReadError::Unsettled { reads, waited });
        }
        let p = settle.pause_after(reads);
        pause(p);
        waited += p;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const FAST: Settle = Settle {
        interval: Duration::from_millis(5),
        max_reads: 4,
    };

    #[test]
    fn a_quiet_file_is_read_once_without_a_pause() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "a: 1\n").unwrap();
        let mut reads = 0;
        let mut pauses = 0;
        let bytes = settled(
            || {
                reads += 1;
                sample(&path)
            },
            |_| pauses += 1,
            Settle::DEFAULT,
        )
        .unwrap();
        assert_eq!(bytes, b"a: 1\n");
        assert_eq!((reads, pauses), (1, 0));
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

    /// A write lands between the stamp before and the read, on a real file: the read is not
    /// believed, and the next one (after the first pause) returns the whole content.
    #[test]
    fn a_write_during_the_read_is_detected_by_the_metadata_and_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Half of the file, as a writer in place leaves it between two writes.
        std::fs::write(&path, "adapters:\n- a\n").unwrap();
        let mut reads = 0;
        let mut pauses = Vec::new();
        let bytes = settled(
            || {
                reads += 1;
                let before = Stamp::of(&path)?;
                if reads == 1 {
                    // The writer appends the rest during the first read.
                    let mut f = std::fs::OpenOptions::new().append(true).open(&path)?;
                    f.write_all(b"- b\n")?;
                }
                let bytes = std::fs::read(&path)?;
                let after = Stamp::of(&path)?;
                Ok(Sample {
                    before,
                    bytes,
                    after,
                })
            },
            |d| pauses.push(d),
            Settle::DEFAULT,
        )
        .unwrap();
        assert_eq!(bytes, b"adapters:\n- a\n- b\n");
        assert_eq!(reads, 2);
        assert_eq!(pauses, [Duration::from_millis(1)]);
    }

    fn stamp(len: u64, secs: u64) -> Stamp {
        Stamp {
            len,
            modified: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
            #[cfg(unix)]
            inode: (1, 1),
            #[cfg(unix)]
            changed: (secs as i64, 0),
        }
    }

    /// One scripted read: the stamp before, the content, the stamp after.
    type Scripted<'a> = (Stamp, &'a str, Stamp);

    /// Runs the settle loop over scripted samples (the last repeats).
    fn script(
        samples: &[Scripted],
        settle: Settle,
    ) -> (Result<Vec<u8>, StableReadError>, Vec<Duration>) {
        let mut i = 0;
        let mut pauses = Vec::new();
        let result = settled(
            || {
                let (before, c, after) = samples[i.min(samples.len() - 1)];
                i += 1;
                Ok(Sample {
                    before,
                    bytes: c.as_bytes().to_vec(),
                    after,
                })
            },
            |d| pauses.push(d),
            settle,
        );
        (result, pauses)
    }

    #[test]
    fn content_is_taken_only_when_the_metadata_agrees_before_and_after_the_read() {
        let ms = Duration::from_millis;
        let s = Settle {
            interval: ms(4),
            max_reads: 5,
        };
        // (samples, expected content or None, expected pauses)
        type Case<'a> = (&'a [Scripted<'a>], Option<&'a str>, &'a [Duration]);
        let table: [Case; 6] = [
            (&[(stamp(1, 10), "a", stamp(1, 10))], Some("a"), &[]),
            // Grew during the read.
            (
                &[
                    (stamp(2, 10), "a\n", stamp(4, 11)),
                    (stamp(4, 11), "a\nb\n", stamp(4, 11)),
                ],
                Some("a\nb\n"),
                &[ms(1)],
            ),
            // Same size before and after but modified in between (a rewrite in place).
            (
                &[
                    (stamp(4, 10), "a\nb\n", stamp(4, 11)),
                    (stamp(4, 11), "c\nd\n", stamp(4, 11)),
                ],
                Some("c\nd\n"),
                &[ms(1)],
            ),
            // Metadata agrees, but the content read is shorter than the size it gives.
            (
                &[
                    (stamp(4, 10), "a\n", stamp(4, 10)),
                    (stamp(4, 10), "a\nb\n", stamp(4, 10)),
                ],
                Some("a\nb\n"),
                &[ms(1)],
            ),
            // Never settles: pauses double up to the interval, reads stop at max_reads.
            (
                &[
                    (stamp(1, 10), "a", stamp(2, 11)),
                    (stamp(2, 11), "ab", stamp(3, 12)),
                    (stamp(3, 12), "abc", stamp(4, 13)),
                    (stamp(4, 13), "abcd", stamp(5, 14)),
                    (stamp(5, 14), "abcde", stamp(6, 15)),
                    (stamp(6, 15), "abcdef", stamp(6, 15)),
                ],
                None,
                &[ms(1), ms(2), ms(4), ms(4)],
            ),
            // Settles on the fourth read.
            (
                &[
                    (stamp(1, 10), "a", stamp(2, 11)),
                    (stamp(2, 11), "ab", stamp(3, 12)),
                    (stamp(3, 12), "abc", stamp(4, 13)),
                    (stamp(4, 13), "abcd", stamp(4, 13)),
                ],
                Some("abcd"),
                &[ms(1), ms(2), ms(4)],
            ),
        ];
        for (samples, expected, pauses) in table {
            let (result, seen) = script(samples, s);
            match expected {
                Some(want) => assert_eq!(result.unwrap(), want.as_bytes(), "{samples:?}"),
                None => assert!(
                    matches!(
                        result,
                        Err(StableReadError::Unsettled { reads: 5, waited })
                            if waited == ms(11)
                    ),
                    "{samples:?}: {result:?}"
                ),
            }
            assert_eq!(seen, pauses, "{samples:?}");
        }
    }

    #[test]
    fn one_read_at_most_gives_up_at_once() {
        let (result, pauses) = script(
            &[(stamp(1, 10), "a", stamp(2, 11))],
            Settle {
                interval: Duration::from_millis(100),
                max_reads: 1,
            },
        );
        assert!(matches!(
            result,
            Err(StableReadError::Unsettled { reads: 1, .. })
        ));
        assert!(pauses.is_empty());
    }
}
