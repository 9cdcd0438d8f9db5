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
//!
//! Every read here is of a regular file only, and bounded: [`open_regular`] opens without
//! blocking (on Unix with `O_NONBLOCK`, so that a FIFO with no writer cannot hang the reader) and
//! checks the type of the opened handle (`fstat` on Unix, `GetFileType` on Windows: no window
//! between the check and the read), so a FIFO, socket, device or directory is an error naming
//! what it is; and reading stops one byte past the caller's size limit, so an oversized file is
//! refused without being read whole.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How patient a read is with a file that keeps changing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settle {
    /// The longest pause between two reads (the first pause is [`FIRST_PAUSE`], doubling up
    /// to this).
    pub(crate) interval: Duration,
    /// The most reads before giving up.
    pub(crate) max_reads: u32,
}

/// The pause before the first re-read of a file that changed while it was read.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(1);

impl Settle {
    /// The default for snapshot and configuration files: pauses of 1 ms doubling up to 100 ms,
    /// up to 20 reads (about 1.6 s of pauses in all).
    pub(crate) const DEFAULT: Settle = Settle {
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
pub(crate) enum StableReadError {
    /// The file cannot be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The path is not a regular file (a FIFO, socket, device or directory).
    #[error(
        "it is {kind}, not a regular file: dxdp reads only regular files (replace it with one)"
    )]
    NotRegular {
        /// What it is (`a FIFO (named pipe)`).
        kind: &'static str,
    },
    /// The file holds more than the caller's limit.
    #[error("{}, more than the {} limit for this file: it was not read (make it smaller)", size_text(*.size), bytes_text(*.limit))]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
        /// The size the file's metadata gives, when over the limit (`None`: it grew past the
        /// limit while it was read).
        size: Option<u64>,
    },
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
            other => std::io::Error::other(other.to_string()),
        }
    }
}

/// `n` bytes for people: whole MiB as `64 MiB`, else the bytes.
fn bytes_text(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else {
        format!("{n} bytes")
    }
}

fn size_text(size: Option<u64>) -> String {
    match size {
        Some(n) => format!("it is {n} bytes"),
        None => "it grew while it was read".to_string(),
    }
}

/// What a file that is not a regular file is, for people (`None` for a regular file).
#[cfg(unix)]
fn kind_of(t: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        None
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_dir() {
        Some("a directory")
    } else {
        Some("a special file")
    }
}

/// What a file that is not a regular file is, for people (`None` for a regular file).
#[cfg(not(unix))]
fn kind_of(t: &std::fs::FileType) -> Option<&'static str> {
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else {
        Some("a special file")
    }
}

/// What the opened handle is, when Windows says it is not a file on disk (a named pipe, a
/// console or another character device).
#[cfg(windows)]
fn handle_kind(file: &File) -> Option<&'static str> {
    use std::os::windows::io::AsRawHandle;
    use windows::Win32::Foundation::HANDLE;
    use windows::Win32::Storage::FileSystem::{
        GetFileType, FILE_TYPE_CHAR, FILE_TYPE_DISK, FILE_TYPE_PIPE,
    };
    // SAFETY: the handle is open for as long as `file` lives, and GetFileType only reads it.
    let t = unsafe { GetFileType(HANDLE(file.as_raw_handle())) };
    match t {
        FILE_TYPE_DISK => None,
        FILE_TYPE_PIPE => Some("a named pipe"),
        FILE_TYPE_CHAR => Some("a character device"),
        _ => Some("a special file"),
    }
}

/// Opens `path` for reading without ever blocking in the open, and only when the opened
/// handle is a regular file: on Unix with `O_NONBLOCK` (a FIFO without a writer would block a
/// plain open forever) and `O_NOCTTY`, checked with `fstat` on the handle; on Windows checked
/// with `GetFileType` and the handle's metadata. A FIFO, socket, device or directory is
/// [`StableReadError::NotRegular`] naming what it is.
pub(crate) fn open_regular(path: &Path) -> Result<File, StableReadError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = match options.open(path) {
        Ok(f) => f,
        Err(e) => {
            // A socket cannot be opened at all (ENXIO), nor a directory on Windows: say what
            // it is rather than the OS's words for it.
            if let Some(kind) = std::fs::metadata(path)
                .ok()
                .and_then(|m| kind_of(&m.file_type()))
            {
                return Err(StableReadError::NotRegular { kind });
            }
            return Err(StableReadError::Io(e));
        }
    };
    #[cfg(windows)]
    {
        if let Some(kind) = handle_kind(&file) {
            return Err(StableReadError::NotRegular { kind });
        }
    }
    if let Some(kind) = kind_of(&file.metadata()?.file_type()) {
        return Err(StableReadError::NotRegular { kind });
    }
    Ok(file)
}

/// Reads an opened file whose metadata gives `len` bytes, at most `max_bytes`: a file the
/// metadata says is larger is refused without reading, and reading stops one byte past the
/// limit (a file that grows during the read is refused too, never read whole).
fn read_bounded(file: &mut File, len: u64, max_bytes: u64) -> Result<Vec<u8>, StableReadError> {
    if len > max_bytes {
        return Err(StableReadError::TooLarge {
            limit: max_bytes,
            size: Some(len),
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(StableReadError::TooLarge {
            limit: max_bytes,
            size: None,
        });
    }
    Ok(bytes)
}

fn utf8(bytes: Vec<u8>) -> Result<String, StableReadError> {
    String::from_utf8(bytes)
        .map_err(|e| StableReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// Reads `path` once as UTF-8 text, when it is a regular file of at most `max_bytes` bytes
/// (see [`open_regular`]), without the settle check: for a file known to be complete (renamed
/// into place, or closed after writing).
pub(crate) fn read_once(path: &Path, max_bytes: u64) -> Result<String, StableReadError> {
    let mut file = open_regular(path)?;
    let len = file.metadata()?.len();
    utf8(read_bounded(&mut file, len, max_bytes)?)
}

/// What identifies one version of a file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    file: super::file_id::FileId,
    #[cfg(unix)]
    changed: (i64, i64),
}

impl Stamp {
    /// The stamp of `path` now.
    pub(crate) fn of(path: &Path) -> std::io::Result<Stamp> {
        Ok(Stamp::from_metadata(&std::fs::metadata(path)?))
    }

    fn from_metadata(m: &std::fs::Metadata) -> Stamp {
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        Stamp {
            len: m.len(),
            modified: m.modified().ok(),
            #[cfg(unix)]
            file: super::file_id::FileId::of_metadata(m),
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

/// One read of `path`: the stamp of the opened handle, at most `max_bytes` of content, and the
/// stamp of the path after (a file renamed over it during the read changes its identity).
fn sample(path: &Path, max_bytes: u64) -> Result<Sample, StableReadError> {
    let mut file = open_regular(path)?;
    let before = Stamp::from_metadata(&file.metadata()?);
    let bytes = read_bounded(&mut file, before.len, max_bytes)?;
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
/// `settle.max_reads` reads, one that is not a regular file ([`open_regular`]) and one larger
/// than `max_bytes` (never read past the limit). Blocks the calling thread (only while it
/// pauses, and only when the file is being written).
pub(crate) fn read_settled(
    path: &Path,
    settle: Settle,
    max_bytes: u64,
) -> Result<String, StableReadError> {
    let bytes =
        settled(|| sample(path, max_bytes), std::thread::sleep, settle).inspect_err(|e| {
            if matches!(e, StableReadError::Unsettled { .. }) {
                tracing::debug!(path = %path.display(), "file never settled");
            }
        })?;
    utf8(bytes)
}

/// The settle loop over any sampler and pause, so tests can drive it without a clock.
fn settled(
    mut read: impl FnMut() -> Result<Sample, StableReadError>,
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

    const LIMIT: u64 = 1 << 20;

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
                sample(&path, LIMIT)
            },
            |_| pauses += 1,
            Settle::DEFAULT,
        )
        .unwrap();
        assert_eq!(bytes, b"a: 1\n");
        assert_eq!((reads, pauses), (1, 0));
        assert_eq!(read_settled(&path, FAST, LIMIT).unwrap(), "a: 1\n");
    }

    #[test]
    fn missing_and_non_utf8_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        assert!(matches!(
            read_settled(&path, FAST, LIMIT),
            Err(StableReadError::Io(_))
        ));
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        let err = read_settled(&path, FAST, LIMIT).unwrap_err();
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

    /// A FIFO with no writer, a socket, a character device and a directory: each is refused at
    /// once, naming what it is, by both reads (a plain read of the FIFO would block forever).
    #[cfg(unix)]
    #[test]
    fn only_regular_files_are_read_and_special_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let table: [(&Path, &str); 4] = [
            (&fifo, "a FIFO (named pipe)"),
            (&socket, "a socket"),
            (Path::new("/dev/null"), "a character device"),
            (dir.path(), "a directory"),
        ];
        for (path, kind) in table {
            let want = format!(
                "it is {kind}, not a regular file: dxdp reads only regular files (replace it with one)"
            );
            let settled = read_settled(path, FAST, LIMIT).unwrap_err();
            assert_eq!(settled.to_string(), want, "{}", path.display());
            let once = read_once(path, LIMIT).unwrap_err();
            assert_eq!(once.to_string(), want, "{}", path.display());
        }
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_its_size_and_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, vec![b'a'; (1 << 20) + 1]).unwrap();
        let want = "it is 1048577 bytes, more than the 1 MiB limit for this file: it was not read (make it smaller)";
        assert_eq!(
            read_settled(&path, FAST, LIMIT).unwrap_err().to_string(),
            want
        );
        assert_eq!(read_once(&path, LIMIT).unwrap_err().to_string(), want);
        // Exactly the limit is read.
        std::fs::write(&path, vec![b'a'; 1 << 20]).unwrap();
        assert_eq!(read_once(&path, LIMIT).unwrap().len(), 1 << 20);
        assert_eq!(
            read_once(&path, 1000).unwrap_err().to_string(),
            "it is 1048576 bytes, more than the 1000 bytes limit for this file: it was not read (make it smaller)"
        );
    }

    /// A file whose metadata understates its size (it grows during the read, or a file system
    /// reports 0 as /proc does) is read only up to one byte past the limit.
    #[cfg(target_os = "linux")]
    #[test]
    fn reading_stops_past_the_limit_whatever_the_metadata_says() {
        // /proc files report a size of 0 and hold more than 16 bytes.
        let path = Path::new("/proc/self/status");
        let mut file = open_regular(path).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 0);
        let err = read_bounded(&mut file, 0, 16).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it grew while it was read, more than the 16 bytes limit for this file: it was not read (make it smaller)"
        );
    }

    fn stamp(len: u64, secs: u64) -> Stamp {
        Stamp {
            len,
            modified: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
            #[cfg(unix)]
            file: crate::util::file_id::FileId { volume: 1, file: 1 },
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
