//! Logging setup: `tracing` to stderr, as text for people or JSON lines for machines.
//!
//! Lines are written by a dedicated thread, not by the task that logs: a log line costs the
//! request path (Allocate logs one per call) a copy into a bounded queue, not a write to a pipe
//! the container runtime may be slow to drain. The writer sleeps while there is nothing to write;
//! woken by a line, it lets further lines gather for `LINGER` and writes them at once, so a
//! burst costs one wake-up and one write.
//!
//! **Logging never waits for stderr.** The queue holds `QUEUE_BYTES`; when it is full (the
//! reader of stderr, e.g. a stuck log shipper, stopped reading) a new line is dropped and
//! counted (`lines_dropped`, the metric `dxdp_log_lines_dropped_total`), and once a write gets
//! through again the writer says how many were lost in one line ("N log lines dropped"). So
//! Allocate, registration and the probes go on whatever the reader does.
//!
//! [`init`] returns a [`LogGuard`] that flushes the queue when dropped (keep it for the process's
//! life); a panic, and [`flush`], flush it too, so the lines before a fatal error are out before
//! the error message. Every flush waits at most a bounded time (`FLUSH_TIMEOUT`).
//!
//! A line on a latency-critical path (the one per Allocate) can be `deferred`: the caller
//! queues the event itself, and the writer thread formats it, so the request path pays neither
//! the formatting nor the filter. A deferred event that panics is caught: the writer goes on.

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
pub(crate) const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a log level or filter and builds it. A bare word must be a level: tracing would take
/// any other word (`verbose`) as a target name and silence every dxdp log line. A filter must be
/// printable ASCII (target names, span names and field values of dxdp's logs are): tracing's
/// filter parser slices text by byte offsets and panics inside a multi-byte character (the
/// filter `x, a [\u{85}{` did), so such text is refused here, and a panic of the parser on
/// anything else is caught and refused too.
pub(crate) fn filter(level: &str) -> Result<EnvFilter, LogLevelError> {
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

/// The most bytes of log lines waiting to be written; a line that does not fit is dropped.
pub(crate) const QUEUE_BYTES: usize = 256 * 1024;

/// The most bytes queued by the writer thread itself (the deferred events it formats, its own
/// notices): it must not drop the deferred lines it takes on only because other tasks filled the
/// queue meanwhile.
const WRITER_QUEUE_BYTES: usize = 2 * QUEUE_BYTES;

/// How long the writer lets lines gather after the first one before it writes them: a burst of
/// lines (one per Allocate) costs one wake-up and one write, not one each.
pub(crate) const LINGER: Duration = Duration::from_millis(2);

/// The longest a flush waits for the writer (stderr may be a pipe nobody reads).
pub(crate) const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// An event to log on the writer thread.
type Event = Box<dyn FnOnce() + Send>;

/// The most events [`deferred`] queues; beyond, the caller logs it at once.
pub(crate) const DEFERRED_EVENTS: usize = 4096;

/// What the writer has to say about itself, as a log line of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// This many lines were dropped since the last notice: the queue was full.
    Dropped(u64),
    /// A deferred event panicked (its panic message is already on stderr).
    Panicked,
}

#[derive(Default)]
struct State {
    /// Lines not yet written.
    lines: Vec<u8>,
    /// Events not yet logged ([`deferred`]), in call order.
    events: Vec<Event>,
    /// The writer sleeps until woken.
    writer_idle: bool,
    /// Flushes asked for and done (a flush is done when the lines and deferred events queued
    /// before it are written).
    flushes_asked: u64,
    flushes_done: u64,
    /// Lines dropped since the writer last said so.
    unreported: u64,
    /// Writes the writer finished.
    writes: u64,
    /// The writes finished when a flush last ran out of time: while no write finishes after
    /// it, the writer hangs in a write and a further flush gives up at once.
    timed_out_at: Option<u64>,
}

/// The queue between logging tasks and the writer thread.
#[derive(Default)]
struct Queue {
    state: std::sync::Mutex<State>,
    /// Wakes the writer.
    work: std::sync::Condvar,
    /// Wakes tasks waiting for a flush.
    written: std::sync::Condvar,
    /// Lines dropped so far: the queue was full, or stderr failed.
    dropped: std::sync::atomic::AtomicU64,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `line`, or drops and counts it when the queue is full; never waits. `writer`:
    /// the writer thread itself queues it (and may fill up to [`WRITER_QUEUE_BYTES`]). Wakes
    /// the writer only if it sleeps. Whether the line was queued.
    fn push(&self, line: &[u8], writer: bool) -> bool {
        let limit = if writer {
            WRITER_QUEUE_BYTES
        } else {
            QUEUE_BYTES
        };
        let mut state = self.lock();
        if !state.lines.is_empty() && state.lines.len() + line.len() > limit {
            state.unreported += 1;
            drop(state);
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        state.lines.extend_from_slice(line);
        self.wake_writer(&mut state);
        true
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

    /// Waits (at most `timeout`) until the lines and deferred events queued before the call are
    /// written; false when the time ran out.
    fn flush(&self, timeout: Duration) -> bool {
        let mut state = self.lock();
        state.flushes_asked += 1;
        let ticket = state.flushes_asked;
        self.wake_writer(&mut state);
        if state.timed_out_at == Some(state.writes) {
            // Still in the write that made the last flush give up.
            return false;
        }
        let (mut state, _) = self
            .written
            .wait_timeout_while(state, timeout, |s| s.flushes_done < ticket)
            .unwrap_or_else(|p| p.into_inner());
        let done = state.flushes_done >= ticket;
        if !done {
            state.timed_out_at = Some(state.writes);
        }
        done
    }

    /// The writer: takes what is queued (after letting a burst gather for [`LINGER`], unless a
    /// flush waits or the queue is half full), logs the deferred events (which `log` turns
    /// into queued lines; one that panics is caught and reported), writes the lines to `out`,
    /// reports lines dropped meanwhile once a write got through (`notice` queues a line saying
    /// so), and sleeps when there is nothing. Runs until the process ends.
    fn write_to(&self, mut out: impl Write, log: impl Fn(Event), notice: impl Fn(Notice)) {
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
            // The flushes asked for by now: every event deferred before them is in this batch,
            // and every line queued before them is queued before the batch's lines are taken.
            let asked = {
                let mut state = self.lock();
                std::mem::swap(&mut state.events, &mut events);
                state.flushes_asked
            };
            let mut panicked = false;
            for event in events.drain(..) {
                let logged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log(event)));
                panicked |= logged.is_err();
            }
            if panicked {
                // Queued with this batch, right after the lines of the events before it.
                notice(Notice::Panicked);
            }
            std::mem::swap(&mut self.lock().lines, &mut spare);
            let written = out.write_all(&spare).and_then(|()| out.flush());
            if written.is_err() {
                // Nowhere to report a failing stderr: the lines are counted as dropped (and not
                // reported, which would fail the same way).
                let lines = spare.iter().filter(|b| **b == b'\n').count().max(1);
                self.dropped.fetch_add(
                    u64::try_from(lines).unwrap_or(u64::MAX),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            spare.clear();
            if spare.capacity() > 64 * 1024 {
                spare.shrink_to(8 * 1024);
            }
            let dropped = {
                let mut state = self.lock();
                state.writes += 1;
                state.flushes_done = state.flushes_done.max(asked);
                if written.is_ok() {
                    std::mem::take(&mut state.unreported)
                } else {
                    0
                }
            };
            self.written.notify_all();
            if dropped > 0 {
                notice(Notice::Dropped(dropped));
            }
        }
    }
}

/// The writer thread's notices, as log lines.
fn say(notice: Notice) {
    match notice {
        Notice::Dropped(n) => tracing::warn!(
            dropped = n,
            "{n} log lines dropped: stderr was not read fast enough (see dxdp_log_lines_dropped_total)"
        ),
        Notice::Panicked => {
            tracing::error!("a deferred log event panicked (its message is above); logging goes on")
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
            .spawn(move || queue.write_to(std::io::stderr(), |event| event(), say))
            .ok()?
    };
    let thread = thread.thread().id();
    Some(WRITER.get_or_init(|| Writer { queue, thread }))
}

/// Log lines dropped since the process started because stderr was not read fast enough (the
/// queue was full) or failed: `dxdp_log_lines_dropped_total`.
pub(crate) fn lines_dropped() -> u64 {
    WRITER.get().map_or(0, |w| {
        w.queue.dropped.load(std::sync::atomic::Ordering::Relaxed)
    })
}

/// The `io::Write` handed to the subscriber: one call per formatted event, queued (or dropped
/// when the queue is full).
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

/// Waits (at most `FLUSH_TIMEOUT`) until every line logged so far is written to stderr.
/// Call it before writing a fatal error message directly to stderr.
pub fn flush() {
    flush_within(FLUSH_TIMEOUT);
}

/// Waits at most `timeout` until every line and deferred event logged so far is written to
/// stderr; false when the time ran out (stderr is not read) or when called on the writer
/// thread (which cannot wait for itself).
pub fn flush_within(timeout: Duration) -> bool {
    let Some(w) = WRITER.get() else { return true };
    if std::thread::current().id() == w.thread {
        return false;
    }
    w.queue.flush(timeout)
}

/// Logs `event` (a closure that logs, e.g. with `tracing::info!`) on the writer thread, off the
/// caller's path: the caller pays for queueing a closure, not for filtering and formatting the
/// line. The line's timestamp is when the writer logs it (at most [`LINGER`] later), and it may
/// follow lines other tasks logged meanwhile. Without a writer thread, or with
/// [`DEFERRED_EVENTS`] already queued, `event` runs at once. [`flush`] waits for deferred events
/// too. Guard the call with `tracing::enabled!` so that a filtered-out line costs nothing.
pub(crate) fn deferred(event: impl FnOnce() + Send + 'static) {
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
/// that flushes the queue before the panic message. When the flush cannot finish (stderr is not
/// read, and the writer holds stderr in a write that does not return), the panic message is
/// queued like a log line instead of written directly, so that the panicking thread does not
/// wait for ever on stderr. Calling it twice keeps the first subscriber.
pub fn init(format: LogFormat, level: &str) -> Result<LogGuard, LogLevelError> {
    let filter = filter(level)?;
    static HOOK: std::sync::Once = std::sync::Once::new();
    if writer().is_some() {
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if flush_within(FLUSH_TIMEOUT) {
                    previous(info);
                    return;
                }
                let thread = std::thread::current();
                let line = format!("thread '{}' {info}\n", thread.name().unwrap_or("<unnamed>"));
                match WRITER.get() {
                    Some(w) if thread.id() != w.thread => {
                        w.queue.push(line.as_bytes(), false);
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
    Ok(LogGuard(()))
}

/// Whether to colour output: only on a terminal, and never when `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>).
pub(crate) fn colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

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

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// A writer thread for `queue` writing into `out`, its notices queued as `notice: …` lines.
    fn start_writer(queue: &std::sync::Arc<Queue>, out: impl Write + Send + 'static) {
        let (queue, q) = (queue.clone(), queue.clone());
        std::thread::spawn(move || {
            queue.write_to(
                out,
                |event| event(),
                move |n| {
                    q.push(format!("notice: {n:?}\n").as_bytes(), true);
                },
            )
        });
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

    #[test]
    fn queued_lines_are_written_in_order_before_a_flush_is_answered() {
        let queue = std::sync::Arc::new(Queue::default());
        let sink = Sink::default();
        start_writer(&queue, sink.clone());
        for line in ["one\n", "two\n", "three\n"] {
            assert!(queue.push(line.as_bytes(), false));
        }
        assert!(queue.flush(Duration::from_secs(10)));
        assert_eq!(sink.text(), "one\ntwo\nthree\n");
        queue.push(b"four\n", false);
        assert!(queue.flush(Duration::from_secs(10)));
        assert_eq!(sink.text(), "one\ntwo\nthree\nfour\n");
    }

    #[test]
    fn a_stalled_stderr_never_blocks_a_logging_task_and_the_lost_lines_are_counted_and_reported() {
        let queue = std::sync::Arc::new(Queue::default());
        let (open, gate) = mpsc::channel();
        let (blocked_tx, blocked) = mpsc::channel();
        let sink = Sink::default();
        start_writer(
            &queue,
            Stalled {
                gate,
                blocked: Some(blocked_tx),
                out: sink.clone(),
            },
        );
        // The writer takes the first line and hangs in its write, as on a pipe nobody reads.
        assert!(queue.push(b"first\n", false));
        blocked
            .recv_timeout(Duration::from_secs(10))
            .expect("the writer writes");
        // 1,000 lines of 1,000 bytes: four times what the queue holds.
        let line = [vec![b'x'; 999], vec![b'\n']].concat();
        let (done_tx, done) = mpsc::channel();
        {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let queued = (0..1000).filter(|_| queue.push(&line, false)).count();
                let _ = done_tx.send(queued);
            });
        }
        let queued = done
            .recv_timeout(Duration::from_secs(10))
            .expect("logging did not wait for the stalled writer");
        // The queue holds 256 KiB: 262 lines of 1,000 bytes fit, the other 738 are dropped.
        assert_eq!(queued, 262);
        assert_eq!(
            queue.dropped.load(std::sync::atomic::Ordering::Relaxed),
            738
        );
        // A flush gives up in its time, and the next one at once: the writer still hangs.
        assert!(!queue.flush(Duration::from_millis(50)));
        let asked = Instant::now();
        assert!(!queue.flush(Duration::from_secs(3600)));
        assert!(asked.elapsed() < Duration::from_secs(60));
        // The reader reads again: everything queued is written, then the count of the lost.
        let writes = queue.lock().writes;
        open.send(()).unwrap();
        // (A flush before the hanging write returns gives up at once, as above.)
        let deadline = Instant::now() + Duration::from_secs(10);
        while queue.lock().writes == writes {
            assert!(Instant::now() < deadline, "the write never returned");
            std::thread::yield_now();
        }
        assert!(queue.flush(Duration::from_secs(10)));
        assert!(queue.flush(Duration::from_secs(10)));
        let text = sink.text();
        assert_eq!(text.lines().filter(|l| l.starts_with('x')).count(), 262);
        assert!(text.starts_with("first\n"), "{}", &text[..20]);
        assert!(
            text.ends_with("notice: Dropped(738)\n"),
            "{}",
            &text[text.len() - 40..]
        );
    }

    #[test]
    fn a_flush_waits_for_events_deferred_before_it_even_while_the_writer_runs_others() {
        let queue = std::sync::Arc::new(Queue::default());
        let sink = Sink::default();
        start_writer(&queue, sink.clone());
        // Event A holds the writer until the test lets it go.
        let (running_tx, running) = mpsc::channel();
        let (release, wait) = mpsc::channel::<()>();
        let a: Event = Box::new(move || {
            let _ = running_tx.send(());
            let _ = wait.recv();
        });
        assert!(queue.defer(a).is_ok());
        running.recv_timeout(Duration::from_secs(10)).unwrap();
        // While A runs: B is deferred, then a flush is asked for.
        let q = queue.clone();
        let b: Event = Box::new(move || {
            q.push(b"deferred b\n", true);
        });
        assert!(queue.defer(b).is_ok());
        let flushed = {
            let queue = queue.clone();
            std::thread::spawn(move || queue.flush(Duration::from_secs(10)))
        };
        while queue.lock().flushes_asked < 1 {
            std::thread::yield_now();
        }
        release.send(()).unwrap();
        assert!(flushed.join().unwrap());
        // B was deferred before the flush: its line is out when the flush returns.
        assert_eq!(sink.text(), "deferred b\n");
    }

    #[test]
    fn a_panicking_deferred_event_is_caught_and_the_writer_goes_on() {
        let queue = std::sync::Arc::new(Queue::default());
        let sink = Sink::default();
        start_writer(&queue, sink.clone());
        let boom: Event = Box::new(|| panic!("a deferred event that panics"));
        assert!(queue.defer(boom).is_ok());
        assert!(queue.flush(Duration::from_secs(10)));
        queue.push(b"after\n", false);
        assert!(queue.flush(Duration::from_secs(10)));
        assert_eq!(sink.text(), "notice: Panicked\nafter\n");
    }

    #[test]
    fn deferred_events_are_logged_on_the_writer_thread_before_a_flush_is_answered() {
        let queue = std::sync::Arc::new(Queue::default());
        let sink = Sink::default();
        let writer = {
            let (queue, out) = (queue.clone(), sink.clone());
            std::thread::spawn(move || queue.write_to(out, |event| event(), |_| {}))
        };
        let ran_on = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        queue.push(b"direct\n", false);
        for line in ["deferred one\n", "deferred two\n"] {
            let (q, ran_on) = (queue.clone(), ran_on.clone());
            let event: Event = Box::new(move || {
                ran_on.lock().unwrap().push(std::thread::current().id());
                // As `Queued` does on the writer thread.
                q.push(line.as_bytes(), true);
            });
            assert!(queue.defer(event).is_ok());
        }
        assert!(queue.flush(Duration::from_secs(10)));
        // The deferred lines follow the direct one queued before them, in call order.
        assert_eq!(sink.text(), "direct\ndeferred one\ndeferred two\n");
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
