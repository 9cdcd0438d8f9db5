//! Logging setup: `tracing` to stderr, as text for people or JSON lines for machines.
//!
//! Lines are written by a dedicated thread, not by the task that logs: a log line costs the
//! request path (Allocate logs one per call) a copy into a bounded queue, not a write to a pipe
//! the container runtime may be slow to drain. The queue holds [`QUEUE_LINES`] lines; when it is
//! full the logging task waits, so no line is lost. [`init`] returns a [`LogGuard`] that flushes
//! the queue when dropped (keep it for the process's life); a panic, and [`flush`], flush it too,
//! so the lines before a fatal error are out before the error message.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::str::FromStr;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::OnceLock;
use std::thread::ThreadId;
use std::time::Duration;

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

/// The most log lines waiting to be written before a logging task waits for the writer.
pub const QUEUE_LINES: usize = 1024;

/// The longest a flush waits for the writer (stderr may be a pipe nobody reads).
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

enum Message {
    Line(Vec<u8>),
    Flush(SyncSender<()>),
}

struct Writer {
    queue: SyncSender<Message>,
    thread: ThreadId,
}

static WRITER: OnceLock<Writer> = OnceLock::new();

/// Writes queued lines to `out`, several at once when they arrive together, and answers
/// flushes once the lines queued before them are written.
fn write_lines(lines: Receiver<Message>, mut out: impl Write) {
    let mut batch = Vec::new();
    while let Ok(first) = lines.recv() {
        let mut acks = Vec::new();
        let mut next = Some(first);
        while let Some(message) = next {
            match message {
                Message::Line(line) => batch.extend_from_slice(&line),
                Message::Flush(ack) => acks.push(ack),
            }
            next = lines.try_recv().ok();
        }
        // Nowhere to report a failing stderr: the lines are dropped.
        let _ = out.write_all(&batch);
        let _ = out.flush();
        batch.clear();
        if batch.capacity() > 64 * 1024 {
            batch.shrink_to(8 * 1024);
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

/// Starts the writer thread once; `None` when the thread cannot be started.
fn writer() -> Option<&'static Writer> {
    if let Some(w) = WRITER.get() {
        return Some(w);
    }
    let (queue, lines) = mpsc::sync_channel(QUEUE_LINES);
    let thread = std::thread::Builder::new()
        .name("dxdp-log".into())
        .spawn(move || write_lines(lines, std::io::stderr()))
        .ok()?;
    let thread = thread.thread().id();
    Some(WRITER.get_or_init(|| Writer { queue, thread }))
}

/// The `io::Write` handed to the subscriber: one call per formatted event, queued.
#[derive(Debug, Clone, Copy)]
struct Queued;

impl Write for Queued {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match WRITER.get() {
            Some(w) if w.queue.send(Message::Line(buf.to_vec())).is_ok() => Ok(buf.len()),
            // No writer thread (or it is gone): write directly.
            _ => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits (at most [`FLUSH_TIMEOUT`]) until every line logged so far is written to stderr.
/// Call it before writing a fatal error message directly to stderr.
pub fn flush() {
    let Some(w) = WRITER.get() else { return };
    if std::thread::current().id() == w.thread {
        return;
    }
    let (ack, done) = mpsc::sync_channel(1);
    if w.queue.send(Message::Flush(ack)).is_ok() {
        let _ = done.recv_timeout(FLUSH_TIMEOUT);
    }
}

/// Flushes the log queue when dropped: keep it until the process ends.
#[derive(Debug)]
#[must_use = "dropping the guard flushes the log queue; keep it for the process's life"]
pub struct LogGuard(());

impl Drop for LogGuard {
    fn drop(&mut self) {
        flush();
    }
}

/// Installs the global subscriber writing to stderr through the writer thread, and a panic hook
/// that flushes the queue before the panic message. Calling it twice keeps the first subscriber.
pub fn init(format: LogFormat, level: &str) -> Result<LogGuard, LogLevelError> {
    let filter = filter(level)?;
    static HOOK: std::sync::Once = std::sync::Once::new();
    if writer().is_some() {
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                flush();
                previous(info);
            }));
        });
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Queued)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal());
    // try_init fails only when a subscriber is already installed, which is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(LogGuard(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn queued_lines_are_written_in_order_before_a_flush_is_answered() {
        let (queue, lines) = mpsc::sync_channel(4);
        let sink = Sink::default();
        let out = sink.clone();
        let thread = std::thread::spawn(move || write_lines(lines, out));
        for line in ["one\n", "two\n", "three\n"] {
            queue.send(Message::Line(line.into())).unwrap();
        }
        let (ack, done) = mpsc::sync_channel(1);
        queue.send(Message::Flush(ack)).unwrap();
        done.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(&*sink.0.lock().unwrap(), b"one\ntwo\nthree\n");
        queue.send(Message::Line("four\n".into())).unwrap();
        drop(queue);
        thread.join().unwrap();
        assert_eq!(&*sink.0.lock().unwrap(), b"one\ntwo\nthree\nfour\n");
    }

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
}
