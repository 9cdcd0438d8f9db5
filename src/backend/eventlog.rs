//! The Windows event log as a source of fault events: a subscription that delivers rendered
//! records into a bounded [`Queue`], and a one-off query of recent records (`dxdp snapshot`).
//!
//! The rest of dxdp sees only the [`EventLog`] trait; on Windows it is `EvtSubscribe` /
//! `EvtQuery` with `EvtRender` (the thin shim in `backend::windows::eventlog`), elsewhere
//! there is none. What is asked for and what is kept is pure ([`dxdp_core::health::feed`]).
//!
//! A subscription can die: the log reports an error ([`Queue::fail`]), or its service restarts
//! and the subscription silently delivers nothing more ([`EventLog::instance`] changes). The
//! daemon's task (`health::faults`) notices either and subscribes again after the
//! [`Bookmark`] of what was delivered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use dxdp_core::facts::LogRecord;
pub(crate) use dxdp_core::health::feed::Bookmark;
use dxdp_core::health::{feed, HealthPolicy, MAX_JUDGED_FAULTS};

/// What a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// A record, as `EvtRender(EvtRenderEventXml)` returned it.
    Event(String),
    /// A delivered record could not be rendered; the sentence names the call and code. The
    /// subscription goes on (an error of the subscription itself is [`Queue::fail`]).
    Error(String),
}

/// How many deliveries a [`Queue`] holds by default: a second of a 1,000 events/s flood.
pub const QUEUE_CAPACITY: usize = 1024;

/// How many bytes of rendered XML a [`Queue`] holds by default (a rendered fault record is 0.7
/// to 1.5 KB, so the count limit is usually reached first).
pub const QUEUE_BYTES: usize = 4 << 20;

/// A bounded queue between the event log's delivery thread and the daemon's task: pushing
/// never blocks and never grows past the capacity (deliveries and bytes); what does not fit is
/// dropped and counted.
#[derive(Debug)]
pub struct Queue {
    capacity: usize,
    max_bytes: usize,
    items: Mutex<(VecDeque<Delivery>, usize)>,
    dropped: AtomicU64,
    /// The first error the subscription reported (it delivers nothing more).
    failed: Mutex<Option<String>>,
    ready: Notify,
}

fn size(d: &Delivery) -> usize {
    match d {
        Delivery::Event(s) | Delivery::Error(s) => s.len(),
    }
}

impl Queue {
    /// A queue of at most `capacity` deliveries (at least one) and `max_bytes` bytes of text.
    pub(crate) fn new(capacity: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Queue {
            capacity: capacity.max(1),
            max_bytes,
            items: Mutex::new((VecDeque::new(), 0)),
            dropped: AtomicU64::new(0),
            failed: Mutex::new(None),
            ready: Notify::new(),
        })
    }

    /// A queue of the default bounds ([`QUEUE_CAPACITY`], [`QUEUE_BYTES`]).
    pub fn bounded() -> Arc<Self> {
        Queue::new(QUEUE_CAPACITY, QUEUE_BYTES)
    }

    /// Adds `d` unless the queue is full (then it is dropped and counted). Callable from any
    /// thread; never blocks for longer than another push or a drain takes.
    pub fn push(&self, d: Delivery) -> bool {
        let n = size(&d);
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if items.0.len() >= self.capacity || items.1 + n > self.max_bytes {
            drop(items);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        items.0.push_back(d);
        items.1 += n;
        drop(items);
        self.ready.notify_one();
        true
    }

    /// The subscription reported an error (`EvtSubscribeActionError`): it is treated as dead and
    /// made again. Kept outside the bounds, so a full queue cannot lose it; the first error is
    /// kept until `Queue::take_failure`. Callable from any thread.
    pub fn fail(&self, why: String) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            *failed = Some(why);
        }
        drop(failed);
        self.ready.notify_one();
    }

    /// The error the subscription reported, if any (once).
    pub(crate) fn take_failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Takes everything queued.
    pub fn drain(&self) -> Vec<Delivery> {
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        items.1 = 0;
        items.0.drain(..).collect()
    }

    /// Waits until something was pushed since the last wait (or is queued).
    pub(crate) async fn ready(&self) {
        self.ready.notified().await
    }

    /// Deliveries dropped because the queue was full, since the last call.
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }

    /// How many deliveries are queued.
    pub fn len(&self) -> usize {
        self.items.lock().unwrap_or_else(|p| p.into_inner()).0.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of rendered XML queued.
    pub fn bytes(&self) -> usize {
        self.items.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// A running subscription; dropping it ends the deliveries.
pub trait Subscription: Send {}

/// An event log dxdp can follow.
pub trait EventLog: Send + Sync {
    /// A short description for logs (`the Windows event log`).
    fn describe(&self) -> String;
    /// Starts delivering the records `query` (a structured XML query) selects into `queue`,
    /// until the returned subscription is dropped: from the oldest it selects on, or with
    /// `after`, those after the bookmark's record in each channel. An error of the running
    /// subscription goes to [`Queue::fail`].
    fn subscribe(
        &self,
        query: &str,
        after: Option<&Bookmark>,
        queue: Arc<Queue>,
    ) -> Result<Box<dyn Subscription>, String>;
    /// A cheap check of the service behind the log, asked before each subscription and then
    /// every half minute: an ID of the running service that changes when it restarts (on
    /// Windows the Event Log service's process ID), so a subscription that died silently with
    /// the old service is noticed. `Ok(Some(0))` when the service is not running, `Ok(None)`
    /// where there is no such check; an error only when it cannot be asked (which ends nothing).
    fn instance(&self) -> Result<Option<u64>, String> {
        Ok(None)
    }
    /// The records `query` selects now, oldest first, at most `limit` of the newest.
    fn query(&self, query: &str, limit: usize) -> Result<Vec<String>, String>;
}

/// The fault events `log` holds from the last `since`, as a host snapshot's `faults` records
/// them ([`feed::for_snapshot`]: faults only, each once, oldest first, the newest
/// [`MAX_JUDGED_FAULTS`]), with how many records were not faults or could not be read. Both
/// fault sources are read whatever the health policy says: a replay applies its own.
pub fn recent_faults(
    log: &dyn EventLog,
    since: Duration,
) -> Result<(Vec<LogRecord>, usize), String> {
    let query = feed::query(since, &HealthPolicy::default());
    // Twice the kept number: WER reports that are not GPU faults come back too.
    let records = log.query(&query, MAX_JUDGED_FAULTS * 2)?;
    Ok(feed::for_snapshot(records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts_and_never_grows() {
        let q = Queue::new(3, 1 << 20);
        for i in 0..10 {
            q.push(Delivery::Event(format!("e{i}")));
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.bytes(), 6);
        assert_eq!(q.take_dropped(), 7);
        assert_eq!(q.take_dropped(), 0, "counted once");
        assert_eq!(
            q.drain(),
            vec![
                Delivery::Event("e0".into()),
                Delivery::Event("e1".into()),
                Delivery::Event("e2".into())
            ]
        );
        assert!(q.is_empty());
        assert!(q.push(Delivery::Error("x".into())));
        // The byte bound: 5 bytes hold "x" and "abcd", not "e".
        let q = Queue::new(10, 5);
        assert!(q.push(Delivery::Event("x".into())));
        assert!(q.push(Delivery::Event("abcd".into())));
        assert!(!q.push(Delivery::Event("e".into())));
        assert_eq!(q.take_dropped(), 1);
        q.drain();
        assert_eq!(q.bytes(), 0);
        assert!(q.push(Delivery::Event("e".into())));
    }

    #[test]
    fn a_failure_is_kept_even_when_the_queue_is_full() {
        let q = Queue::new(1, 1 << 20);
        assert!(q.push(Delivery::Event("e0".into())));
        assert!(!q.push(Delivery::Event("e1".into())));
        q.fail("the event-log subscription failed: Win32 error 1726".into());
        q.fail("a second error".into());
        assert_eq!(
            q.take_failure().as_deref(),
            Some("the event-log subscription failed: Win32 error 1726"),
            "the first one"
        );
        assert_eq!(q.take_failure(), None, "once");
        assert_eq!(q.len(), 1);
    }

    #[tokio::test]
    async fn a_push_from_another_thread_wakes_the_reader() {
        let q = Queue::bounded();
        let q2 = q.clone();
        std::thread::spawn(move || {
            q2.push(Delivery::Event("e".into()));
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), q.ready())
            .await
            .expect("woken");
        assert_eq!(q.drain(), vec![Delivery::Event("e".into())]);
    }
}
