//! Logging setup: `tracing` to stderr, as text for people or JSON lines for machines.
//!
//! Lines are written by a dedicated thread, not by the task that logs: a log line costs the
//! request path (Allocate logs one per call) a copy into a bounded queue, not a write to a pipe
//! the container runtime may be slow to drain. The writer sleeps while there is nothing to write;
//! woken by a line, it lets further lines gather for [`LINGER`] and writes them at once, so a
//! burst costs one wake-up and one write. The queue holds [`QUEUE_BYTES`]; when it is full the
//! logging task waits, so no line is lost. [`init`] returns a [`LogGuard`] that flushes
//! the queue when dropped (keep it for the process's life); a panic, and [`flush`], flush it too,
//! so the lines before a fatal error are out before the error message.
//!
//! A line on a latency-critical path (the one per Allocate) can be [`deferred`]: the caller
//! queues the event itself, and the writer thread formats it, so the request path pays neither
//! the formatting nor the filter.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::str::FromStr;
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

/// The most bytes of log lines waiting to be written before a logging task waits for the writer.
pub const QUEUE_BYTES: usize = 256 * 1024;

/// How long the writer lets lines gather after the first one before it writes them: a burst of
/// lines (one per Allocate) costs one wake-up and one write, not one each.
pub const LINGER: Duration = Duration::from_millis(2);

/// The longest a flush waits for the writer (stderr may be a pipe nobody reads).
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// An event to log on the writer thread.
type Event = Box<dyn FnOnce() + Send>;

/// The most events [`deferred`] queues; beyond, the caller logs it at once.
pub const DEFERRED_EVENTS: usize = 4096;

#[derive(Default)]
struct State {
    /// Lines not yet written.
    lines: Vec<u8>,
    /// Events not yet logged ([`deferred`]), in call order.
    events: Vec<Event>,
    /// The writer sleeps until woken.
    writer_idle: bool,
    /// Flushes asked for and done (a flush is done when the lines before it are written).
    flushes_asked: u64,
    flushes_done: u64,
}

/// The queue between logging tasks and the writer thread.
#[derive(Default)]
struct Queue {
    state: std::sync::Mutex<State>,
    /// Wakes the writer.
    work: std::sync::Condvar,
    /// Wakes tasks waiting for room or for a flush.
    written: std::sync::Condvar,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `line`; waits while the queue is full (unless `writer`: the writer thread itself
    /// logs deferred events and must not wait for itself). Wakes the writer only if it sleeps.
    fn push(&self, line: &[u8], writer: bool) {
        let mut state = self.lock();
        while !writer && !state.lines.is_empty() && state.lines.len() + line.len() > QUEUE_BYTES {
            self.wake_writer(&mut state);
            state = self.written.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.lines.extend_from_slice(line);
        self.wake_writer(&mut state);
    }

    /// Queues `event` for the writer; gives it back when [`DEFERRED_EVENTS`] are queued.
    fn defer(&self, event: Event) -> Result<(), Event> {
        let mut state = self.lock();
        if state.events.len() >= DEFERRED_EVENTS {
            return Err(event);
        }
        state.events.push(event);
        self.wake_writer(&mut state);
        Ok(())
    }

    fn wake_writer(&self, state: &mut State) {
        if state.writer_idle {
            state.writer_idle = false;
            self.work.notify_one();
        }
    }

    /// Waits (at most `timeout`) until the lines queued before the call are written.
    fn flush(&self, timeout: Duration) {
        let mut state = self.lock();
        state.flushes_asked += 1;
        let ticket = state.flushes_asked;
        self.wake_writer(&mut state);
        let _ = self
            .written
            .wait_timeout_while(state, timeout, |s| s.flushes_done < ticket);
    }

    /// The writer: takes what is queued (after letting a burst gather for [`LINGER`], unless a
    /// flush waits or the queue is half full), logs the deferred events (which `log` turns
    /// into queued lines), writes the lines to `out`, and sleeps when there is nothing. Runs
    /// until the process ends.
    fn write_to(&self, mut out: impl Write, log: impl Fn(Event)) {
        let mut spare = Vec::new();
        let mut events = Vec::new();
        loop {
            let mut state = self.lock();
            while state.lines.is_empty()
                && state.events.is_empty()
                && state.flushes_done == state.flushes_asked
            {
                state.writer_idle = true;
                state = self.work.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            state.writer_idle = false;
            let hurry = state.flushes_done < state.flushes_asked
                || state.lines.len() >= QUEUE_BYTES / 2
                || state.events.len() >= DEFERRED_EVENTS / 2;
            drop(state);
            if !hurry {
                std::thread::sleep(LINGER);
            }
            std::mem::swap(&mut self.lock().events, &mut events);
            for event in events.drain(..) {
                log(event);
            }
            let mut state = self.lock();
            std::mem::swap(&mut state.lines, &mut spare);
            let asked = state.flushes_asked;
            drop(state);
            // Nowhere to report a failing stderr: the lines are dropped.
            let _ = out.write_all(&spare);
            let _ = out.flush();
            spare.clear();
            if spare.capacity() > 64 * 1024 {
                spare.shrink_to(8 * 1024);
            }
            let mut state = self.lock();
            state.flushes_done = asked;
            drop(state);
            self.written.notify_all();
        }
    }
}

struct Writer {
    queue: std::sync::Arc<Queue>,
    thread: ThreadId,
}

static WRITER: OnceLock<Writer> = OnceLock::new();

/// Starts the writer thread once; `None` when the thread cannot be started.
fn writer() -> Option<&'static Writer> {
    if let Some(w) = WRITER.get() {
        return Some(w);
    }
    let queue = std::sync::Arc::new(Queue::default());
    let thread = {
        let queue = queue.clone();
        std::thread::Builder::new()
            .name("dxdp-log".into())
            .spawn(move || queue.write_to(std::io::stderr(), |event| event()))
            .ok()?
    };
    let thread = thread.thread().id();
    Some(WRITER.get_or_init(|| Writer { queue, thread }))
}

/// The `io::Write` handed to the subscriber: one call per formatted event, queued.
#[derive(Debug, Clone, Copy)]
struct Queued;

impl Write for Queued {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match WRITER.get() {
            Some(w) => {
                w.queue.push(buf, std::thread::current().id() == w.thread);
                Ok(buf.len())
            }
            // No writer thread: write directly.
            None => std::io::stderr().write(buf),
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
    w.queue.flush(FLUSH_TIMEOUT);
}

/// Logs `event` (a closure that logs, e.g. with `tracing::info!`) on the writer thread, off the
/// caller's path: the caller pays for queueing a closure, not for filtering and formatting the
/// line. The line's timestamp is when the writer logs it (at most [`LINGER`] later), and it may
/// follow lines other tasks logged meanwhile. Without a writer thread, or with
/// [`DEFERRED_EVENTS`] already queued, `event` runs at once. [`flush`] waits for deferred events
/// too. Guard the call with `tracing::enabled!` so that a filtered-out line costs nothing.
pub fn deferred(event: impl FnOnce() + Send + 'static) {
    let event: Event = Box::new(event);
    let rejected = match WRITER.get() {
        Some(w) if std::thread::current().id() != w.thread => w.queue.defer(event).err(),
        _ => Some(event),
    };
    if let Some(event) = rejected {
        event();
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
        .with_ansi(colour(std::io::stderr().is_terminal()));
    // try_init fails only when a subscriber is already installed, which is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(LogGuard(()))
}

/// Whether to colour output: only on a terminal, and never when `NO_COLOR` is set to anything
/// but the empty string (https://no-color.org).
pub fn colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
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
        let queue = std::sync::Arc::new(Queue::default());
        let sink = Sink::default();
        {
            let (queue, out) = (queue.clone(), sink.clone());
            std::thread::spawn(move || queue.write_to(out, |event| event()));
        }
        for line in ["one\n", "two\n", "three\n"] {
            queue.push(line.as_bytes(), false);
        }
        queue.flush(Duration::from_secs(10));
        assert_eq!(&*sink.0.lock().unwrap(), b"one\ntwo\nthree\n");
        queue.push(b"four\n", false);
        queue.flush(Duration::from_secs(10));
        assert_eq!(&*sink.0.lock().unwrap(), b"one\ntwo\nthree\nfour\n");
    }

    #[test]
    fn a_full_queue_makes_the_logging_task_wait_and_loses_nothing() {
        let queue = std::sync::Arc::new(Queue::default());
        let sink = Sink::default();
        let line = vec![b'x'; 1000];
        let n = 3 * QUEUE_BYTES / line.len();
        let logger = {
            let (queue, line) = (queue.clone(), line.clone());
            std::thread::spawn(move || {
                for _ in 0..n {
                    queue.push(&line, false);
                }
            })
        };
        {
            let (queue, out) = (queue.clone(), sink.clone());
            std::thread::spawn(move || queue.write_to(out, |event| event()));
        }
        logger.join().unwrap();
        queue.flush(Duration::from_secs(10));
        assert_eq!(sink.0.lock().unwrap().len(), n * line.len());
    }

    #[test]
    fn deferred_events_are_logged_on_the_writer_thread_before_a_flush_is_answered() {
        let queue = std::sync::Arc::new(Queue::default());
        let sink = Sink::default();
        let writer = {
            let (queue, out) = (queue.clone(), sink.clone());
            std::thread::spawn(move || queue.write_to(out, |event| event()))
        };
        let ran_on = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        queue.push(b"direct\n", false);
        for line in ["deferred one\n", "deferred two\n"] {
            let (q, ran_on) = (queue.clone(), ran_on.clone());
            let event: Event = Box::new(move || {
                ran_on.lock().unwrap().push(std::thread::current().id());
                // As `Queued` does on the writer thread: never waits for room.
                q.push(line.as_bytes(), true);
            });
            assert!(queue.defer(event).is_ok());
        }
        queue.flush(Duration::from_secs(10));
        // The deferred lines follow the direct one queued before them, in call order.
        assert_eq!(
            &*sink.0.lock().unwrap(),
            b"direct\ndeferred one\ndeferred two\n"
        );
        let writer = writer.thread().id();
        assert_eq!(*ran_on.lock().unwrap(), vec![writer, writer]);
    }

    #[test]
    fn deferred_events_beyond_the_cap_are_handed_back() {
        // No writer thread: nothing drains the queue.
        let queue = Queue::default();
        for _ in 0..DEFERRED_EVENTS {
            assert!(queue.defer(Box::new(|| {})).is_ok());
        }
        assert!(queue.defer(Box::new(|| {})).is_err());
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

    #[test]
    fn no_colour_off_a_terminal() {
        assert!(!colour(false));
    }
}
