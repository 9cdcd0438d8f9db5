//! Logging setup: `tracing` to stderr, as text for people or JSON lines for machines.
//!
//! Lines are written by a thread of their own, not by the task that logs: the task formats its
//! line and hands it to `tracing-appender`'s non-blocking writer (a bounded queue in front of
//! that thread), so a log line costs the request path (Allocate logs one per call) the
//! formatting and a copy, not a write to a pipe the container runtime may be slow to drain. The
//! thread writes the lines it finds waiting in one write, once the queue is empty.
//!
//! **Logging never waits for stderr.** The queue holds [`QUEUE_LINES`]; when it is full (the
//! reader of stderr, e.g. a stuck log shipper, stopped reading) a new line is dropped and
//! counted ([`lines_dropped`], the metric `dxdp_log_lines_dropped_total`), and once a write gets
//! through again the writer says how many were lost in one line ("N log lines dropped"). So
//! Allocate, registration and the probes go on whatever the reader does.
//!
//! [`init`] returns a [`LogGuard`] that flushes the queue when dropped (keep it for the process's
//! life); a panic, and [`flush`], flush it too, so the lines before a fatal error are out before
//! the error message. Every flush waits at most a bounded time ([`FLUSH_TIMEOUT`]).
use std::fmt;
use std::io::{IsTerminal, Write};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
use std::time::Duration;

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
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
/// any other word (`verbose`) as a target name and silence every dxdp log line. A filter must be
/// printable ASCII (target names, span names and field values of dxdp's logs are): tracing's
/// filter parser slices text by byte offsets and panics inside a multi-byte character (the
/// filter `x, a [\u{85}{` did), so such text is refused here, and a panic of the parser on
/// anything else is caught and refused too.
pub fn filter(level: &str) -> Result<EnvFilter, LogLevelError> {
    let err = |reason: String| LogLevelError {
        level: printable(level),
        reason,
    };
    let text = level.trim();
    if let Some((at, c)) = text
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_graphic() || *c == ' '))
    {
        return Err(err(format!(
            "character {} at byte {at} is not printable ASCII",
            c.escape_unicode()
        )));
    }
    let is_filter = text.contains(['=', ',', '[', ':']);
    if !is_filter && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(text)) {
        return Err(err(format!("`{text}` is not a level")));
    }
    match std::panic::catch_unwind(|| EnvFilter::builder().parse(text)) {
        Ok(parsed) => parsed.map_err(|e| err(e.to_string())),
        Err(_) => Err(err(
            "tracing's filter parser cannot read it (it panicked)".to_string()
        )),
    }
}

/// `text` with every character that is not printable ASCII written as `\u{…}`.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c.to_string()
            } else {
                c.escape_unicode().to_string()
            }
        })
        .collect()
}

/// The most log lines waiting to be written (some 256 KiB of Allocate's 250-byte lines); a line
/// that does not fit is dropped.
pub const QUEUE_LINES: usize = 1024;

/// The most bytes the writer thread gathers before it writes them, even while more lines wait.
const BATCH_BYTES: usize = 64 * 1024;

/// The longest a flush waits for the writer (stderr may be a pipe nobody reads).
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The log queue: `tracing-appender`'s lossy non-blocking writer, and what its thread has done.
struct Log {
    /// The queue, and the lines it took (a flush waits until the writer handled as many). One
    /// lock, so that the drop count read around a send tells whether that line was dropped.
    sending: Mutex<(NonBlocking, u64)>,
    /// Lines the full queue refused.
    refused: ErrorCounter,
    written: Arc<Written>,
}

/// What the writer thread has done, shared with the tasks that flush.
#[derive(Default)]
struct Written {
    /// Lines handed to stderr (or counted in `failed`), and that count when a flush last ran out
    /// of time: while it has not moved since, the writer hangs in a write and a further flush
    /// gives up at once.
    handled: Mutex<(u64, Option<u64>)>,
    progressed: Condvar,
    /// Lines lost because writing to stderr failed.
    failed: AtomicU64,
    /// The writer thread (set by its first line): it cannot wait for itself.
    thread: OnceLock<ThreadId>,
}

impl Log {
    /// The queue (of `lines` lines) and its writer thread writing to `out`; `notice` is called on
    /// that thread with the number of lines the full queue refused since it last said so, once a
    /// write got through. `None` when the thread cannot be started.
    fn start(
        out: impl Write + Send + 'static,
        lines: usize,
        notice: impl Fn(u64) + Send + 'static,
    ) -> Option<(Log, WorkerGuard)> {
        let written = Arc::new(Written::default());
        let refused = Arc::new(OnceLock::new());
        let out = Out {
            out,
            batch: Vec::new(),
            lines: 0,
            written: written.clone(),
            refused: refused.clone(),
            reported: 0,
            notice,
        };
        let builder = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(lines)
            .thread_name("dxdp-log");
        // tracing-appender panics when the thread cannot be spawned.
        let (queue, guard) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.finish(out))).ok()?;
        let _ = refused.set(queue.error_counter());
        let log = Log {
            refused: queue.error_counter(),
            sending: Mutex::new((queue, 0)),
            written,
        };
        Some((log, guard))
    }

    /// Queues `line`, or drops and counts it when the queue is full; never waits.
    fn push(&self, line: &[u8]) {
        if line.is_empty() {
            return;
        }
        let mut sending = lock(&self.sending);
        let refused = self.refused.dropped_lines();
        // Lossy: never fails, a refused line is counted in `self.refused`.
        let _ = sending.0.write(line);
        if self.refused.dropped_lines() == refused {
            sending.1 += 1;
        }
    }

    fn dropped(&self) -> u64 {
        let refused = u64::try_from(self.refused.dropped_lines()).unwrap_or(u64::MAX);
        refused.saturating_add(self.written.failed.load(Ordering::Relaxed))
    }

    fn on_writer_thread(&self) -> bool {
        self.written.thread.get() == Some(&std::thread::current().id())
    }

    /// Waits (at most `timeout`) until the lines queued before the call are written; false when
    /// the time ran out, or on the writer thread (which cannot wait for itself).
    fn flush(&self, timeout: Duration) -> bool {
        if self.on_writer_thread() {
            return false;
        }
        let queued = lock(&self.sending).1;
        let handled = lock(&self.written.handled);
        if handled.0 < queued && handled.1 == Some(handled.0) {
            // Still in the write that made the last flush give up.
            return false;
        }
        let (mut handled, _) = self
            .written
            .progressed
            .wait_timeout_while(handled, timeout, |h| h.0 < queued)
            .unwrap_or_else(|p| p.into_inner());
        if handled.0 < queued {
            handled.1 = Some(handled.0);
            return false;
        }
        true
    }
}

/// The writer thread's end: tracing-appender hands it one line per `write` and calls `flush`
/// when the queue is empty; the lines gathered in between go to `out` in one write.
struct Out<W, N> {
    out: W,
    batch: Vec<u8>,
    lines: u64,
    written: Arc<Written>,
    refused: Arc<OnceLock<ErrorCounter>>,
    /// Refused lines already reported.
    reported: usize,
    notice: N,
}

impl<W: Write, N: Fn(u64)> Out<W, N> {
    fn write_out(&mut self) {
        if self.lines == 0 {
            return;
        }
        let ok = self
            .out
            .write_all(&self.batch)
            .and_then(|()| self.out.flush())
            .is_ok();
        if !ok {
            // Nowhere to report a failing stderr: the lines are counted as dropped (and not
            // reported, which would fail the same way).
            self.written.failed.fetch_add(self.lines, Ordering::Relaxed);
        }
        self.batch.clear();
        if self.batch.capacity() > 2 * BATCH_BYTES {
            self.batch.shrink_to(8 * 1024);
        }
        lock(&self.written.handled).0 += std::mem::take(&mut self.lines);
        self.written.progressed.notify_all();
        let refused = self.refused.get().map_or(0, ErrorCounter::dropped_lines);
        if ok && refused > self.reported {
            (self.notice)(u64::try_from(refused - self.reported).unwrap_or(u64::MAX));
            self.reported = refused;
        }
    }
}

impl<W: Write, N: Fn(u64)> Write for Out<W, N> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.written
            .thread
            .get_or_init(|| std::thread::current().id());
        self.batch.extend_from_slice(line);
        self.lines += 1;
        if self.batch.len() >= BATCH_BYTES {
            self.write_out();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.write_out();
        Ok(())
    }
}

/// The writer thread's notice, as a log line of its own.
fn say_dropped(n: u64) {
    tracing::warn!(
        dropped = n,
        "{n} log lines dropped: stderr was not read fast enough (see dxdp_log_lines_dropped_total)"
    );
}

static LOG: OnceLock<Log> = OnceLock::new();

/// Log lines dropped since the process started because stderr was not read fast enough (the
/// queue was full) or failed: `dxdp_log_lines_dropped_total`.
pub fn lines_dropped() -> u64 {
    LOG.get().map_or(0, Log::dropped)
}

/// The `io::Write` handed to the subscriber: one call per formatted event, queued (or dropped
/// when the queue is full).
#[derive(Debug, Clone, Copy)]
struct Queued;

impl Write for Queued {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match LOG.get() {
            Some(log) => {
                log.push(buf);
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
    flush_within(FLUSH_TIMEOUT);
}

/// Waits at most `timeout` until every line logged so far is written to stderr; false when the
/// time ran out (stderr is not read) or when called on the writer thread (which cannot wait for
/// itself).
pub fn flush_within(timeout: Duration) -> bool {
    LOG.get().is_none_or(|log| log.flush(timeout))
}

/// Flushes the log queue when dropped: keep it until the process ends. The first [`init`]'s guard
/// then stops the writer thread (tracing-appender's `WorkerGuard`), unless the flush ran out of
/// time: the thread hangs in a write to stderr, and stopping it would wait too.
#[derive(Debug)]
#[must_use = "dropping the guard flushes the log queue; keep it for the process's life"]
pub struct LogGuard(Option<WorkerGuard>);

impl Drop for LogGuard {
    fn drop(&mut self) {
        if !flush_within(FLUSH_TIMEOUT) {
            std::mem::forget(self.0.take());
        }
    }
}

/// Installs the global subscriber writing to stderr through the writer thread, and a panic hook
/// that flushes the queue before the panic message. When the flush cannot finish (stderr is not
/// read, and the writer holds stderr in a write that does not return), the panic message is
/// queued like a log line instead of written directly, so that the panicking thread does not
/// wait for ever on stderr. Calling it twice keeps the first subscriber.
pub fn init(format: LogFormat, level: &str) -> Result<LogGuard, LogLevelError> {
    let filter = filter(level)?;
    let mut worker = None;
    if LOG.get().is_none() {
        if let Some((log, guard)) = Log::start(std::io::stderr(), QUEUE_LINES, say_dropped) {
            // Lost to a concurrent `init`, the guard stops the unused thread.
            worker = LOG.set(log).is_ok().then_some(guard);
        }
    }
    static HOOK: std::sync::Once = std::sync::Once::new();
    if LOG.get().is_some() {
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if flush_within(FLUSH_TIMEOUT) {
                    previous(info);
                    return;
                }
                match LOG.get() {
                    Some(log) if !log.on_writer_thread() => {
                        let thread = std::thread::current();
                        let name = thread.name().unwrap_or("<unnamed>");
                        log.push(format!("thread '{name}' {info}\n").as_bytes());
                    }
                    // The writer thread itself, between writes: stderr is free.
                    _ => previous(info),
                }
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
    Ok(LogGuard(worker))
}

/// Whether to colour output: only on a terminal, and never when `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>).
pub fn colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// A stderr whose reader stopped: the first write blocks until the test opens the gate.
    struct Stalled {
        gate: mpsc::Receiver<()>,
        blocked: Option<mpsc::Sender<()>>,
        out: Sink,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Some(blocked) = self.blocked.take() {
                let _ = blocked.send(());
                let _ = self.gate.recv();
            }
            self.out.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A stderr that fails every write.
    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The notices a log's writer gave, in order.
    fn notices() -> (Arc<Mutex<Vec<u64>>>, impl Fn(u64) + Send + 'static) {
        let said = Arc::new(Mutex::new(Vec::new()));
        let s = said.clone();
        (said, move |n| s.lock().unwrap().push(n))
    }

    #[test]
    fn queued_lines_are_written_in_order_before_a_flush_is_answered() {
        let sink = Sink::default();
        let (said, notice) = notices();
        let (log, _guard) = Log::start(sink.clone(), QUEUE_LINES, notice).unwrap();
        for line in ["one\n", "two\n", "three\n"] {
            log.push(line.as_bytes());
        }
        assert!(log.flush(Duration::from_secs(10)));
        assert_eq!(sink.text(), "one\ntwo\nthree\n");
        log.push(b"four\n");
        assert!(log.flush(Duration::from_secs(10)));
        assert_eq!(sink.text(), "one\ntwo\nthree\nfour\n");
        assert_eq!(log.dropped(), 0);
        assert_eq!(*said.lock().unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn a_stalled_stderr_never_blocks_a_logging_task_and_the_lost_lines_are_counted_and_reported() {
        let (open, gate) = mpsc::channel();
        let (blocked_tx, blocked) = mpsc::channel();
        let sink = Sink::default();
        let stalled = Stalled {
            gate,
            blocked: Some(blocked_tx),
            out: sink.clone(),
        };
        let (said, notice) = notices();
        let (log, _guard) = Log::start(stalled, QUEUE_LINES, notice).unwrap();
        let log = Arc::new(log);
        // The writer takes the first line and hangs in its write, as on a pipe nobody reads.
        log.push(b"first\n");
        blocked
            .recv_timeout(Duration::from_secs(10))
            .expect("the writer writes");
        // 3,000 lines: the queue holds 1,024 of them, the other 1,976 are dropped, not waited for.
        let (done_tx, done) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..3000 {
                    log.push(format!("line {i}\n").as_bytes());
                }
                let _ = done_tx.send(());
            });
        }
        done.recv_timeout(Duration::from_secs(10))
            .expect("logging did not wait for the stalled writer");
        assert_eq!(log.dropped(), 1976);
        // A flush gives up in its time, and the next one at once: the writer still hangs.
        assert!(!log.flush(Duration::from_millis(50)));
        let asked = Instant::now();
        assert!(!log.flush(Duration::from_secs(3600)));
        assert!(asked.elapsed() < Duration::from_secs(60));
        // The reader reads again: everything queued is written, and the count of the lost said.
        open.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !log.flush(Duration::from_secs(10)) {
            assert!(Instant::now() < deadline, "the write never returned");
            std::thread::yield_now();
        }
        let text = sink.text();
        assert_eq!(text.lines().count(), 1 + 1024);
        assert!(
            text.starts_with("first\nline 0\nline 1\n"),
            "{}",
            &text[..30]
        );
        assert!(
            text.ends_with("line 1023\n"),
            "{}",
            &text[text.len() - 30..]
        );
        assert_eq!(*said.lock().unwrap(), vec![1976]);
        assert_eq!(log.dropped(), 1976);
    }

    #[test]
    fn lines_a_failing_stderr_refuses_are_counted_not_reported() {
        let (said, notice) = notices();
        let (log, _guard) = Log::start(Broken, QUEUE_LINES, notice).unwrap();
        for line in ["one\n", "two\n", "three\n"] {
            log.push(line.as_bytes());
        }
        assert!(log.flush(Duration::from_secs(10)));
        assert_eq!(log.dropped(), 3);
        assert_eq!(*said.lock().unwrap(), Vec::<u64>::new());
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
            ("dxdp[serve{resource=x}]=debug", true),
            ("verbose", false),
            ("", false),
            ("dxdp=loud", false),
            // Found by the `config` fuzz target: tracing-subscriber 0.3's parser panics on it.
            ("x, a [\u{85}{", false),
            ("dxdp=débug", false),
            ("info\u{0}", false),
        ];
        for (level, ok) in table {
            assert_eq!(filter(level).is_ok(), ok, "{level:?}");
        }
    }

    #[test]
    fn a_refused_filter_is_named_printably() {
        let e = filter("x, a [\u{85}{").unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid log level `x, a [\\u{85}{`: character \\u{85} at byte 6 is not printable ASCII (use error, warn, info, debug, trace or a tracing filter such as `dxdp=debug`)"
        );
    }

    #[test]
    fn no_colour_off_a_terminal() {
        assert!(!colour(false));
    }
}
