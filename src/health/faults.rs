//! Live GPU fault events: follows the Windows event log (display-driver resets, `Display` 4101;
//! WER `LiveKernelEvent` reports, 1001) and feeds new fault events into the health the daemon
//! serves, through the same model as a host snapshot's recorded `faults`.
//!
//! [`live_faults`] wraps the host-facts source ([`WithLiveFaults`]: the facts' `faults` get the
//! live records) and returns the optional task ([`follow`]) that subscribes and moves records
//! from the subscription's bounded queue into the kept [`FaultLog`]. A flood costs bounded CPU
//! and memory: the queue drops (and counts) what does not fit, the log keeps the newest
//! [`dxdp_core::health::MAX_JUDGED_FAULTS`] faults, and the inventory is rebuilt at most once a
//! second ([`Pacer`]), on the refresher's own task; Allocate answers from the published
//! inventory and never waits for any of it. When the event log cannot be followed the task
//! says so once, counts it, and retries with backoff; device serving goes on.
//!
//! A subscription that dies heals: an error the subscription reports ([`Queue::fail`]) or a
//! change of the log's service ([`EventLog::instance`], asked every [`CHECK_EVERY`]: a restart
//! of the Windows Event Log service kills subscriptions, maybe silently) ends it;
//! `dxdp_eventlog_subscribed` drops to 0, the loss is said once, and the task subscribes again
//! with backoff, after the [`Bookmark`] of the records already delivered (no gap, nothing
//! twice), saying the recovery once. The state machine (subscribed, lost, backing off,
//! subscribed again) is all here, portable; the Windows shim only subscribes and reports.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::eventlog::{Bookmark, Delivery, EventLog, Queue, Subscription};
use crate::backend::{HostFactsSource, SourceError, Wake};
use crate::config::Config;
use crate::inventory::now_ms;
use crate::observe::metrics::Metrics;
use crate::supervisor::{Role, TaskSpec};
use crate::util::bounded::{run_blocking, Overdue};
use crate::util::retry::{self, Backoff};
use crate::util::task::Task;
use dxdp_core::facts::{HostFacts, LogRecord};
use dxdp_core::health::feed::{self, FaultLog, Offer, Pacer, PUBLISH_INTERVAL_MS};
use dxdp_core::health::HealthPolicy;

/// The task's name (logs, metrics, `/healthz`).
pub(crate) const TASK: &str = "event-log";

/// How often records older than the lookback are forgotten.
const EXPIRE_EVERY: Duration = Duration::from_secs(60);

/// How often a flood's dropped records are said in the log (they are counted at once).
const DROPPED_LOG_EVERY: Duration = Duration::from_secs(60);

/// How often the log's service is checked while subscribed ([`EventLog::instance`]): a
/// subscription that died silently with a restarted Event Log service is noticed within this
/// (and what was logged meanwhile is read from the bookmark).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(30);

/// The live fault events kept, and how to wake the inventory refresher for them.
#[derive(Default)]
pub(crate) struct LiveFaults {
    log: Mutex<FaultLog>,
    wake: Mutex<Option<Wake>>,
    /// Set when there was something to show before the refresher registered its wake.
    missed: AtomicBool,
}

impl LiveFaults {
    /// Nothing kept yet.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(LiveFaults::default())
    }

    /// The kept records, oldest first.
    pub(crate) fn records(&self) -> Vec<LogRecord> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).records()
    }

    /// Offers one rendered record ([`FaultLog::offer`]).
    #[cfg(test)]
    pub(crate) fn offer(&self, xml: String, oldest_ms: u64) -> Offer {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .offer(xml, oldest_ms)
    }

    /// Offers one delivered record and moves `bookmark` on to it if it can be read.
    fn offer_delivered(&self, xml: String, oldest_ms: u64, bookmark: &mut Bookmark) -> Offer {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .offer_noting(xml, oldest_ms, |r| bookmark.note(r))
    }

    /// Forgets records before `oldest_ms`.
    pub(crate) fn expire(&self, oldest_ms: u64) -> usize {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .expire(oldest_ms)
    }

    /// Wakes the refresher (a rebuild with the kept records).
    fn wake(&self) {
        let wake = self.wake.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match wake {
            Some(wake) => wake(),
            None => self.missed.store(true, Ordering::SeqCst),
        }
    }
}

/// A host-facts source whose facts carry the live fault events in `faults`, after the ones the
/// source itself records (a snapshot's), each record once.
///
/// A rebuild for new events alone does not read the host again: when the source has no files
/// and has not said it changed (a DXCore notification, the health poll), the facts of its last
/// read are reused, so a flood never turns into a DXCore enumeration a second.
pub(crate) struct WithLiveFaults {
    inner: Arc<dyn HostFactsSource>,
    live: Arc<LiveFaults>,
    last: Mutex<Option<HostFacts>>,
    stale: Arc<AtomicBool>,
}

impl WithLiveFaults {
    /// `inner`'s facts with the events of `live`.
    pub(crate) fn new(inner: Arc<dyn HostFactsSource>, live: Arc<LiveFaults>) -> Self {
        WithLiveFaults {
            inner,
            live,
            last: Mutex::new(None),
            stale: Arc::new(AtomicBool::new(true)),
        }
    }

    fn with_faults(
        &self,
        read: impl FnOnce() -> Result<HostFacts, SourceError>,
    ) -> Result<HostFacts, SourceError> {
        let stale = self.stale.swap(false, Ordering::SeqCst);
        let cached = if stale || !self.inner.watched_files().is_empty() {
            None
        } else {
            self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
        };
        let mut facts = match cached {
            Some(f) => f,
            None => match read() {
                Ok(f) => {
                    *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(f.clone());
                    f
                }
                Err(e) => {
                    self.stale.store(true, Ordering::SeqCst);
                    return Err(e);
                }
            },
        };
        facts.faults = feed::merge(&facts.faults, self.live.records());
        Ok(facts)
    }
}

impl HostFactsSource for WithLiveFaults {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn is_simulated(&self) -> bool {
        self.inner.is_simulated()
    }

    fn load(&self) -> Result<HostFacts, SourceError> {
        self.with_faults(|| self.inner.load())
    }

    fn load_complete(&self) -> Result<HostFacts, SourceError> {
        self.with_faults(|| self.inner.load_complete())
    }

    fn watched_files(&self) -> Vec<PathBuf> {
        self.inner.watched_files()
    }

    fn on_change(&self, wake: Wake) {
        *self.live.wake.lock().unwrap_or_else(|p| p.into_inner()) = Some(wake.clone());
        let stale = self.stale.clone();
        let inner_wake = wake.clone();
        self.inner.on_change(Arc::new(move || {
            stale.store(true, Ordering::SeqCst);
            inner_wake();
        }));
        // Events that arrived before the refresher was there.
        if self.live.missed.swap(false, Ordering::SeqCst) {
            wake();
        }
    }

    fn changed(&self) -> bool {
        let changed = self.inner.changed();
        if changed {
            self.stale.store(true, Ordering::SeqCst);
        }
        changed
    }
}

/// Wraps `source` so that its facts carry the live fault events, and returns the optional task
/// that follows `log` for them: subscribes with the query of the health policy in `config`
/// (again when the policy changes it), counts into `metrics`, retries a failed subscription
/// after `backoff` (`backoff.timeout` limits one subscribe call).
pub(crate) fn live_faults(
    source: Arc<dyn HostFactsSource>,
    log: Arc<dyn EventLog>,
    config: watch::Receiver<Arc<Config>>,
    metrics: Metrics,
    backoff: Backoff,
) -> (Arc<dyn HostFactsSource>, TaskSpec) {
    let live = LiveFaults::new();
    let wrapped: Arc<dyn HostFactsSource> = Arc::new(WithLiveFaults::new(source, live.clone()));
    let follow = FollowLog {
        live,
        log,
        config,
        metrics,
        backoff,
        check_every: CHECK_EVERY,
    };
    let task = TaskSpec::task(TASK, Role::Optional, follow);
    (wrapped, task)
}

/// What the policy in force asks the event log for: `None` when health is off or every event
/// signal is ignored.
fn wanted(config: &Config) -> Option<(Duration, String)> {
    let health = &config.pipeline.health;
    if !health.enabled {
        return None;
    }
    let policy: &HealthPolicy = &health.policy;
    let lookback = feed::lookback(policy);
    let query = feed::query(lookback, policy);
    (!feed::selects_nothing(&query)).then_some((lookback, query))
}

/// Subscribes on a blocking thread, within `limit`, after `after` if given.
async fn subscribe(
    log: &Arc<dyn EventLog>,
    query: &str,
    after: Option<Bookmark>,
    queue: &Arc<Queue>,
    limit: Duration,
) -> Result<Box<dyn Subscription>, String> {
    let (log, query, queue) = (log.clone(), query.to_string(), queue.clone());
    let call = move || log.subscribe(&query, after.as_ref(), queue);
    match run_blocking(limit, "EvtSubscribe", call).await {
        Ok(result) => result,
        Err(Overdue::Panicked { message, .. }) => {
            Err(format!("the subscribe call failed: {message}"))
        }
        // The thread's result, if it ever comes, is dropped (which ends that subscription).
        Err(_) => Err(format!("EvtSubscribe did not return within {limit:?}")),
    }
}

/// Asks the log's service which instance runs ([`EventLog::instance`]) on a blocking thread,
/// within `limit`.
async fn instance(log: &Arc<dyn EventLog>, limit: Duration) -> Result<Option<u64>, String> {
    let log = log.clone();
    match run_blocking(limit, "the Event Log service check", move || log.instance()).await {
        Ok(result) => result,
        Err(Overdue::Panicked { message, .. }) => {
            Err(format!("the service check failed: {message}"))
        }
        Err(_) => Err(format!(
            "the Event Log service check did not return within {limit:?}"
        )),
    }
}

/// Why a subscription ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    /// The health policy asks for another query.
    PolicyChanged,
    /// The subscription died: it reported an error (`stage` `delivery`) or the log's service
    /// restarted or stopped (`stage` `service`).
    Lost { why: String, stage: &'static str },
}

/// What the service check says of a subscription made while `baseline` ran.
fn judge_instance(baseline: &mut Option<u64>, now: Result<Option<u64>, String>) -> Option<String> {
    match (*baseline, now) {
        (Some(_), Ok(Some(0))) => {
            Some("the Event Log service stopped, which ends subscriptions".into())
        }
        (Some(b), Ok(Some(n))) if n != b => Some(format!(
            "the Event Log service restarted (process {b}, now {n}), which ends subscriptions"
        )),
        // Not known when subscribing: checked from now on.
        (None, Ok(Some(n))) if n != 0 => {
            *baseline = Some(n);
            None
        }
        // A check that cannot be made now (slow, refused) says nothing of the subscription.
        (_, Err(e)) => {
            tracing::debug!("the event log's service cannot be checked now: {e}");
            None
        }
        _ => None,
    }
}

/// An outage of the feed: since when, and how many subscribe attempts failed in it.
struct Outage {
    since: tokio::time::Instant,
    attempts: u32,
}

/// Follows `log` for fault events until the task is stopped (see the module documentation).
#[derive(Clone)]
pub(crate) struct FollowLog {
    pub(crate) live: Arc<LiveFaults>,
    pub(crate) log: Arc<dyn EventLog>,
    pub(crate) config: watch::Receiver<Arc<Config>>,
    pub(crate) metrics: Metrics,
    pub(crate) backoff: Backoff,
    /// How often the log's service is checked while subscribed ([`CHECK_EVERY`]).
    pub(crate) check_every: Duration,
}

impl Task for FollowLog {
    async fn run(self) {
        let FollowLog {
            live,
            log,
            mut config,
            metrics,
            backoff,
            check_every,
        } = self;
        let health = metrics.device_health().clone();
        // Consecutive failures (subscribe attempts, and subscriptions lost soon after they
        // were made), for the backoff.
        let mut failures = 0u32;
        let mut outage: Option<Outage> = None;
        // Where the deliveries got to, and the query of the last subscription: a new
        // subscription of the same query starts after the bookmark.
        let mut bookmark = Bookmark::new();
        let mut last_query: Option<String> = None;
        let mut config_open = true;
        loop {
            let current = config.borrow_and_update().clone();
            let Some((lookback, query)) = wanted(&current) else {
                health.eventlog_subscribed(false);
                outage = None;
                tracing::info!("not following the event log: health is off or every event signal is ignored (health.enabled, health.ignore)");
                if !config_open || config.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                continue;
            };
            let queue = Queue::bounded();
            // Asked before subscribing: a restart after this is seen as a change.
            let baseline = match instance(&log, backoff.timeout).await {
                Ok(known) => known,
                Err(e) => {
                    tracing::debug!("the event log's service cannot be checked now: {e}");
                    None
                }
            };
            let from = (last_query.as_deref() == Some(query.as_str()) && bookmark.covers(&query))
                .then(|| bookmark.clone());
            let resumed = from.is_some();
            let subscription = match subscribe(&log, &query, from, &queue, backoff.timeout).await {
                Ok(s) => s,
                Err(e) => {
                    health.eventlog_subscribed(false);
                    health.eventlog_error("subscribe");
                    failures = failures.saturating_add(1);
                    match &mut outage {
                        Some(o) => {
                            o.attempts = o.attempts.saturating_add(1);
                            tracing::debug!(
                                attempts = o.attempts,
                                "subscribing to {} failed again: {e}",
                                log.describe()
                            );
                        }
                        None => {
                            tracing::warn!(
                                    "cannot follow {} for GPU fault events ({e}): display-driver resets are not seen until it works; retrying with backoff. Check that the Windows Event Log service runs and that dxdp may read the System and Application logs (it does as SYSTEM in the chart's HostProcess pod). Problem codes, driver updates and removed adapters still count (docs/health.md)",
                                    log.describe()
                                );
                            outage = Some(Outage {
                                since: tokio::time::Instant::now(),
                                attempts: 1,
                            });
                        }
                    }
                    let delay = backoff.delay(failures, retry::random());
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        changed = config.changed(), if config_open => {
                            config_open = changed.is_ok();
                        }
                    }
                    continue;
                }
            };
            health.eventlog_subscribed(true);
            let up = tokio::time::Instant::now();
            match outage.take() {
                Some(o) => tracing::info!(
                    down_s = o.since.elapsed().as_secs(),
                    failed_attempts = o.attempts,
                    "following {} for GPU fault events again: {}",
                    log.describe(),
                    if resumed {
                        "records logged meanwhile are read from where it stopped, none twice"
                    } else {
                        "the lookback is read again; records already kept are not counted twice"
                    }
                ),
                None => tracing::info!(
                    lookback_s = lookback.as_secs(),
                    "following {} for GPU fault events (Display 4101, WER LiveKernelEvent)",
                    log.describe()
                ),
            }
            last_query = Some(query.clone());
            let ended = pump(
                Pump {
                    live: &live,
                    queue: &queue,
                    metrics: &metrics,
                    lookback,
                    query: &query,
                    log: &log,
                    check_every,
                    limit: backoff.timeout,
                },
                &mut config,
                &mut config_open,
                &mut bookmark,
                baseline,
            )
            .await;
            drop(subscription);
            health.eventlog_subscribed(false);
            match ended {
                Ended::PolicyChanged => {
                    failures = 0;
                    tracing::info!(
                        "subscribing to {} again: the health policy changed what is read",
                        log.describe()
                    );
                }
                Ended::Lost { why, stage } => {
                    health.eventlog_error(stage);
                    // A subscription that lived past the longest delay starts the backoff
                    // over; one lost soon after it was made waits longer each time.
                    failures = if up.elapsed() >= backoff.max {
                        1
                    } else {
                        failures.saturating_add(1)
                    };
                    tracing::warn!(
                        "lost the subscription to {} for GPU fault events ({why}): display-driver resets and LiveKernelEvents are not seen until it is made again (dxdp_eventlog_subscribed is 0 meanwhile); subscribing again with backoff, after the last record read, so nothing logged meanwhile is missed or counted twice",
                        log.describe()
                    );
                    outage = Some(Outage {
                        since: tokio::time::Instant::now(),
                        attempts: 0,
                    });
                    let delay = backoff.delay(failures, retry::random());
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        changed = config.changed(), if config_open => {
                            config_open = changed.is_ok();
                        }
                    }
                }
            }
        }
    }
}

/// What [`pump`] works with.
struct Pump<'a> {
    live: &'a LiveFaults,
    queue: &'a Queue,
    metrics: &'a Metrics,
    lookback: Duration,
    query: &'a str,
    log: &'a Arc<dyn EventLog>,
    check_every: Duration,
    limit: Duration,
}

/// Moves what the subscription delivers into `live` (noting each record in `bookmark`) and
/// wakes the refresher at most once per [`PUBLISH_INTERVAL_MS`], until the policy asks for
/// another query or the subscription dies: it reports an error, or the log's service is not
/// the `baseline` instance any more (checked every `check_every`). Returns why it ended.
async fn pump(
    p: Pump<'_>,
    config: &mut watch::Receiver<Arc<Config>>,
    config_open: &mut bool,
    bookmark: &mut Bookmark,
    mut baseline: Option<u64>,
) -> Ended {
    let Pump {
        live,
        queue,
        metrics,
        lookback,
        query,
        log,
        check_every,
        limit,
    } = p;
    let mut check =
        tokio::time::interval_at(tokio::time::Instant::now() + check_every, check_every);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let health = metrics.device_health();
    let lookback_ms = lookback.as_millis() as u64;
    let mut pacer = Pacer::new(PUBLISH_INTERVAL_MS);
    let mut expire = tokio::time::interval(EXPIRE_EVERY);
    expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut said_record: Option<String> = None;
    let mut dropped_said: Option<tokio::time::Instant> = None;
    let mut dropped_since_said = 0u64;
    loop {
        let due = pacer.due_ms();
        let publish = async move {
            match due {
                Some(at) => {
                    let wait = at.saturating_sub(now_ms());
                    tokio::time::sleep(Duration::from_millis(wait)).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = queue.ready() => {
                let oldest = now_ms().saturating_sub(lookback_ms);
                for d in queue.drain() {
                    match d {
                        Delivery::Event(xml) => match live.offer_delivered(xml, oldest, bookmark) {
                            Offer::Added => pacer.note(),
                            Offer::Unreadable(e) => {
                                health.eventlog_error("record");
                                if said_record.as_deref() != Some(e.as_str()) {
                                    tracing::warn!("an event-log record is not read: {e}");
                                    said_record = Some(e);
                                }
                            }
                            Offer::Duplicate | Offer::NotAFault | Offer::TooOld => {}
                        },
                        Delivery::Error(e) => {
                            health.eventlog_error("record");
                            if said_record.as_deref() != Some(e.as_str()) {
                                tracing::warn!("an event-log record could not be rendered: {e}");
                                said_record = Some(e);
                            }
                        }
                    }
                }
                let dropped = queue.take_dropped();
                if dropped > 0 {
                    health.eventlog_dropped(dropped);
                    dropped_since_said += dropped;
                    if dropped_said.is_none_or(|t| t.elapsed() >= DROPPED_LOG_EVERY) {
                        tracing::warn!(
                            dropped = dropped_since_said,
                            "a flood of event-log records: records beyond the queue's bound are dropped (counted in dxdp_eventlog_dropped_total); health is judged from the ones kept"
                        );
                        dropped_said = Some(tokio::time::Instant::now());
                        dropped_since_said = 0;
                    }
                }
                // What was delivered before the error is kept (and bookmarked) above.
                if let Some(why) = queue.take_failure() {
                    return Ended::Lost { why, stage: "delivery" };
                }
                // A flood's batch must not hold the runtime's thread for long.
                tokio::task::yield_now().await;
            }
            _ = check.tick() => {
                let now = instance(log, limit).await;
                if let Some(why) = judge_instance(&mut baseline, now) {
                    return Ended::Lost { why, stage: "service" };
                }
            }
            _ = publish => {
                pacer.published(now_ms());
                live.wake();
            }
            _ = expire.tick() => {
                live.expire(now_ms().saturating_sub(lookback_ms));
            }
            changed = config.changed(), if *config_open => {
                if changed.is_err() {
                    *config_open = false;
                    continue;
                }
                let current = config.borrow_and_update().clone();
                if wanted(&current).map(|(_, q)| q).as_deref() != Some(query) {
                    return Ended::PolicyChanged;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A source that counts its reads; with `files` it says it has files.
    struct Counting {
        reads: AtomicUsize,
        files: bool,
        wake: Mutex<Option<Wake>>,
        changed: AtomicBool,
    }

    impl Counting {
        fn new(files: bool) -> Arc<Self> {
            Arc::new(Counting {
                reads: AtomicUsize::new(0),
                files,
                wake: Mutex::new(None),
                changed: AtomicBool::new(false),
            })
        }
        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }
    }

    impl HostFactsSource for Counting {
        fn describe(&self) -> String {
            "counting".into()
        }
        fn is_simulated(&self) -> bool {
            true
        }
        fn load(&self) -> Result<HostFacts, SourceError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Ok(HostFacts::default())
        }
        fn watched_files(&self) -> Vec<PathBuf> {
            if self.files {
                vec![PathBuf::from("/x/host.yaml")]
            } else {
                Vec::new()
            }
        }
        fn on_change(&self, wake: Wake) {
            *self.wake.lock().unwrap() = Some(wake);
        }
        fn changed(&self) -> bool {
            self.changed.swap(false, Ordering::SeqCst)
        }
    }

    /// A `Display` 4101 record of `nvlddmkm`, number `id`, logged at `ms`.
    fn tdr(id: u64, ms: u64) -> String {
        format!(
            "<Event xmlns='http://schemas.microsoft.com/win/2004/08/events/event'><System><Provider Name='Display'/><EventID Qualifiers='0'>4101</EventID><TimeCreated SystemTime='{}'/><EventRecordID>{id}</EventRecordID><Channel>System</Channel></System><EventData><Data>nvlddmkm</Data><Data></Data></EventData></Event>",
            dxdp_core::health::eventlog::format_time(ms)
        )
    }

    #[test]
    fn events_alone_reuse_the_last_read_of_the_host() {
        let inner = Counting::new(false);
        let live = LiveFaults::new();
        let source = WithLiveFaults::new(inner.clone(), live.clone());
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        source.on_change(Arc::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        }));
        assert!(source.load().unwrap().faults.is_empty());
        assert_eq!(inner.reads(), 1);
        let now = now_ms();
        assert_eq!(live.offer(tdr(7, now), 0), Offer::Added);
        let facts = source.load().unwrap();
        assert_eq!(facts.faults, vec![LogRecord { xml: tdr(7, now) }]);
        assert_eq!(inner.reads(), 1, "new events alone do not read the host");
        // The source's own wake (a DXCore notification): read again, and the refresher woken.
        let wake = inner.wake.lock().unwrap().clone().unwrap();
        wake();
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        source.load().unwrap();
        assert_eq!(inner.reads(), 2);
        // The health poll says changed: read again.
        inner.changed.store(true, Ordering::SeqCst);
        assert!(source.changed());
        source.load().unwrap();
        assert_eq!(inner.reads(), 3);
        source.load().unwrap();
        assert_eq!(inner.reads(), 3);
        // The task's wake reaches the refresher.
        live.wake();
        assert_eq!(woken.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn events_before_the_refresher_registered_wake_it_when_it_does() {
        let live = LiveFaults::new();
        let source = WithLiveFaults::new(Counting::new(false), live.clone());
        live.wake();
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        source.on_change(Arc::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        // A restarted refresher registering again is not woken for nothing.
        source.on_change(Arc::new(|| panic!("woken for nothing")));
    }

    #[test]
    fn a_source_with_files_is_read_every_time() {
        let inner = Counting::new(true);
        let source = WithLiveFaults::new(inner.clone(), LiveFaults::new());
        source.load().unwrap();
        source.load().unwrap();
        assert_eq!(inner.reads(), 2);
    }

    /// An event log whose subscription delivers `batch` at once (within the subscribe call,
    /// as Windows delivers the backlog), or that cannot be subscribed to; its service check
    /// answers `instance`. Records the bookmark each subscription was asked to start after.
    struct Scripted {
        batch: Vec<Delivery>,
        fail: Mutex<Option<String>>,
        subscribed: AtomicUsize,
        queue: Mutex<Option<Arc<Queue>>>,
        instance: Mutex<Result<Option<u64>, String>>,
        after: Mutex<Vec<Option<String>>>,
    }

    struct Nothing;
    impl Subscription for Nothing {}

    impl EventLog for Scripted {
        fn describe(&self) -> String {
            "the scripted event log".into()
        }
        fn subscribe(
            &self,
            _query: &str,
            after: Option<&Bookmark>,
            queue: Arc<Queue>,
        ) -> Result<Box<dyn Subscription>, String> {
            self.subscribed.fetch_add(1, Ordering::SeqCst);
            self.after.lock().unwrap().push(after.map(|b| b.to_xml()));
            if let Some(e) = self.fail.lock().unwrap().clone() {
                return Err(e);
            }
            if after.is_none() {
                for d in &self.batch {
                    queue.push(d.clone());
                }
            }
            *self.queue.lock().unwrap() = Some(queue);
            Ok(Box::new(Nothing))
        }
        fn instance(&self) -> Result<Option<u64>, String> {
            self.instance.lock().unwrap().clone()
        }
        fn query(&self, _query: &str, _limit: usize) -> Result<Vec<String>, String> {
            Ok(Vec::new())
        }
    }

    /// The live-fault source over `inner` following `log` under the default configuration: its
    /// metrics, the configuration's sender (kept while the test runs), the source and the task.
    fn follow(
        inner: Arc<dyn HostFactsSource>,
        log: Arc<dyn EventLog>,
    ) -> (
        Metrics,
        watch::Sender<Arc<Config>>,
        Arc<dyn HostFactsSource>,
        TaskSpec,
    ) {
        let metrics = Metrics::new();
        let (tx, config) = watch::channel(Arc::new(Config::default()));
        let (source, task) = live_faults(inner, log, config, metrics.clone(), FAST);
        (metrics, tx, source, task)
    }

    fn scripted(batch: Vec<Delivery>, fail: Option<&str>) -> Arc<Scripted> {
        Arc::new(Scripted {
            batch,
            fail: Mutex::new(fail.map(String::from)),
            subscribed: AtomicUsize::new(0),
            queue: Mutex::new(None),
            instance: Mutex::new(Ok(None)),
            after: Mutex::new(Vec::new()),
        })
    }

    const FAST: Backoff = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(40),
        timeout: Duration::from_secs(5),
    };

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delivered_faults_are_kept_once_and_wake_the_refresher() {
        let now = now_ms();
        let old = now - 30 * 60_000;
        let batch = vec![
            Delivery::Event(tdr(3, now - 2_000)),
            Delivery::Event(tdr(1, now - 9_000)),
            Delivery::Event(tdr(3, now - 2_000)),
            // Before the 20-minute lookback of the default policy.
            Delivery::Event(tdr(2, old)),
            Delivery::Event("<Event><System/></Event>".into()),
            Delivery::Error("EvtRender(EvtRenderEventXml) failed: Win32 error 15005".into()),
        ];
        let log = scripted(batch, None);
        let inner = Counting::new(false);
        let (metrics, _tx, source, task) = follow(inner.clone(), log.clone());
        assert_eq!(task.name, TASK);
        assert_eq!(task.role, Role::Optional);
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        source.on_change(Arc::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        }));
        let mut factory = task.factory;
        let running = tokio::spawn(factory());
        until("woken", || woken.load(Ordering::SeqCst) >= 1).await;
        let faults = source.load().unwrap().faults;
        // Records 1 and 3, oldest first; 3 once; 2 too old; the broken one not kept.
        assert_eq!(
            faults,
            vec![
                LogRecord {
                    xml: tdr(1, now - 9_000)
                },
                LogRecord {
                    xml: tdr(3, now - 2_000)
                }
            ]
        );
        let h = metrics.device_health();
        // The broken record, and the one that could not be rendered.
        assert_eq!(h.eventlog("record"), (2, 0, true));
        assert_eq!(h.eventlog("delivery").0, 0);
        assert_eq!(h.eventlog("subscribe").0, 0);
        let text = metrics.encode();
        for line in [
            "dxdp_eventlog_subscribed 1",
            "dxdp_eventlog_errors_total{stage=\"record\"} 2",
            "dxdp_eventlog_errors_total{stage=\"delivery\"} 0",
            "dxdp_eventlog_errors_total{stage=\"service\"} 0",
            "dxdp_eventlog_errors_total{stage=\"subscribe\"} 0",
            "dxdp_eventlog_dropped_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
        running.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_is_bounded_counted_and_rebuilds_at_most_once_a_second() {
        let now = now_ms();
        // 3,000 records delivered at once: the queue holds 1,024, the rest is dropped.
        let batch: Vec<Delivery> = (0..3000)
            .map(|i| Delivery::Event(tdr(10_000 + i, now - 60_000 + i)))
            .collect();
        let log = scripted(batch, None);
        let (metrics, _tx, source, task) = follow(Counting::new(false), log.clone());
        let woken = Arc::new(AtomicUsize::new(0));
        let times = Arc::new(Mutex::new(Vec::new()));
        let (w, t) = (woken.clone(), times.clone());
        source.on_change(Arc::new(move || {
            t.lock().unwrap().push(std::time::Instant::now());
            w.fetch_add(1, Ordering::SeqCst);
        }));
        let mut factory = task.factory;
        let running = tokio::spawn(factory());
        until("woken", || woken.load(Ordering::SeqCst) >= 1).await;
        assert_eq!(metrics.device_health().eventlog("record").1, 1976);
        assert_eq!(source.load().unwrap().faults.len(), 1024);
        // 500 more within the same second: one more rebuild, not 500, and not before a second
        // has passed since the first.
        let queue = log.queue.lock().unwrap().clone().unwrap();
        for i in 0..500 {
            queue.push(Delivery::Event(tdr(20_000 + i, now - 1_000 + i)));
        }
        until("woken again", || woken.load(Ordering::SeqCst) >= 2).await;
        let gap = {
            let t = times.lock().unwrap();
            t[1] - t[0]
        };
        assert!(gap >= Duration::from_millis(950), "{gap:?}");
        assert_eq!(source.load().unwrap().faults.len(), 1524);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(woken.load(Ordering::SeqCst), 2, "nothing new: no rebuild");
        running.abort();
    }

    /// The recorded WER LiveKernelEvent 141 report (Application log, record 40211), logged at
    /// `ms`.
    fn wer(ms: u64) -> String {
        include_str!("../../crates/dxdp-core/src/health/events/wer-1001-livekernelevent-141.xml")
            .replace(
                "2026-11-25T21:40:19.0412210Z",
                &dxdp_core::health::eventlog::format_time(ms),
            )
    }

    /// A log sink for one test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// Issue 43: a subscription that dies (silently with its service, or with an error it
    /// reports) is noticed, said once, made again with backoff after the bookmark, and the
    /// recovery is said once; `dxdp_eventlog_subscribed` is 0 meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_subscription_heals_after_the_bookmark_and_is_said_once_each_way() {
        use tracing::instrument::WithSubscriber;
        let now = now_ms();
        let log = scripted(
            vec![
                Delivery::Event(tdr(18_233, now - 60_000)),
                Delivery::Event(wer(now - 50_000)),
            ],
            None,
        );
        *log.instance.lock().unwrap() = Ok(Some(100));
        let metrics = Metrics::new();
        let (_tx, config) = watch::channel(Arc::new(Config::default()));
        let live = LiveFaults::new();
        let follow = FollowLog {
            live: live.clone(),
            log: log.clone(),
            config,
            metrics: metrics.clone(),
            backoff: FAST,
            check_every: Duration::from_millis(20),
        };
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let running = tokio::spawn(follow.run().with_subscriber(subscriber));
        let h = metrics.device_health().clone();
        until("subscribed", || {
            h.eventlog("subscribe").2 && live.records().len() == 2
        })
        .await;
        // The Event Log service stops: the subscription delivers nothing more, silently.
        *log.fail.lock().unwrap() =
            Some("EvtSubscribe failed: HRESULT 0x800706BA (The RPC server is unavailable.)".into());
        // Not running: no process (what the Windows shim answers).
        *log.instance.lock().unwrap() = Ok(Some(0));
        until("lost", || h.eventlog("service").0 == 1).await;
        assert!(!h.eventlog("subscribe").2, "0 while lost");
        // Attempts while it is down fail, counted, not said again.
        until("three failed attempts", || h.eventlog("subscribe").0 >= 3).await;
        assert!(!h.eventlog("subscribe").2);
        // It comes back (another process).
        *log.fail.lock().unwrap() = None;
        *log.instance.lock().unwrap() = Ok(Some(200));
        until("subscribed again", || h.eventlog("subscribe").2).await;
        let attempts = log.subscribed.load(Ordering::SeqCst);
        let after = log.after.lock().unwrap().clone();
        assert_eq!(after.len(), attempts);
        assert_eq!(
            after[0], None,
            "the first from the oldest record of the lookback"
        );
        // Every later one after the two records delivered (the WER report the last).
        let bookmark = "<BookmarkList><Bookmark Channel='Application' RecordId='40211' IsCurrent='true'/><Bookmark Channel='System' RecordId='18233'/></BookmarkList>";
        for a in &after[1..] {
            assert_eq!(a.as_deref(), Some(bookmark));
        }
        // A record delivered by the new subscription is kept; the old ones once.
        let queue = log.queue.lock().unwrap().clone().unwrap();
        assert!(queue.push(Delivery::Event(tdr(18_240, now - 1_000))));
        until("the new record", || live.records().len() == 3).await;
        // Now the subscription reports an error: lost again, made again after record 18240.
        queue.fail("the event-log subscription failed: Win32 error 15011".into());
        until("lost by its error", || h.eventlog("delivery").0 == 1).await;
        until("made again", || {
            log.subscribed.load(Ordering::SeqCst) > attempts && h.eventlog("subscribe").2
        })
        .await;
        assert_eq!(
            log.after.lock().unwrap().last().cloned().flatten().as_deref(),
            Some("<BookmarkList><Bookmark Channel='Application' RecordId='40211'/><Bookmark Channel='System' RecordId='18240' IsCurrent='true'/></BookmarkList>")
        );
        assert_eq!(live.records().len(), 3);
        running.abort();
        let text = lines.text();
        let count = |what: &str| text.lines().filter(|l| l.contains(what)).count();
        assert_eq!(count(" WARN "), 2, "one warning per loss:\n{text}");
        assert_eq!(
            count("lost the subscription to the scripted event log for GPU fault events (the Event Log service stopped, which ends subscriptions): display-driver resets and LiveKernelEvents are not seen until it is made again"),
            1,
            "{text}"
        );
        assert_eq!(
            count("lost the subscription to the scripted event log for GPU fault events (the event-log subscription failed: Win32 error 15011)"),
            1,
            "{text}"
        );
        assert_eq!(
            count("following the scripted event log for GPU fault events again: records logged meanwhile are read from where it stopped, none twice"),
            2,
            "{text}"
        );
        assert_eq!(
            count("following the scripted event log for GPU fault events (Display 4101"),
            1,
            "{text}"
        );
    }

    #[test]
    fn the_service_check_tells_a_restart_from_a_check_that_cannot_be_made() {
        let mut known = Some(100);
        assert_eq!(judge_instance(&mut known, Ok(Some(100))), None);
        assert_eq!(judge_instance(&mut known, Ok(None)), None);
        assert_eq!(
            judge_instance(&mut known, Ok(Some(200))).as_deref(),
            Some(
                "the Event Log service restarted (process 100, now 200), which ends subscriptions"
            )
        );
        assert_eq!(
            judge_instance(&mut known, Ok(Some(0))).as_deref(),
            Some("the Event Log service stopped, which ends subscriptions")
        );
        // A check that cannot be made ends nothing.
        let mut known = Some(100);
        assert_eq!(judge_instance(&mut known, Err("timed out".into())), None);
        assert_eq!(known, Some(100));
        // Not known when subscribing: nothing to compare, and the first answer is kept.
        let mut unknown = None;
        assert_eq!(judge_instance(&mut unknown, Err("no SCM".into())), None);
        assert_eq!(judge_instance(&mut unknown, Ok(Some(7))), None);
        assert_eq!(unknown, Some(7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_that_cannot_be_followed_is_retried_and_counted() {
        let log = scripted(Vec::new(), Some("EvtSubscribe failed: Win32 error 1717"));
        let (metrics, tx, source, task) = follow(Counting::new(false), log.clone());
        let mut factory = task.factory;
        let running = tokio::spawn(factory());
        until("retried", || log.subscribed.load(Ordering::SeqCst) >= 3).await;
        let (errors, _, subscribed) = metrics.device_health().eventlog("subscribe");
        assert!(errors >= 2, "{errors}");
        assert!(!subscribed);
        // The facts are still served.
        assert!(source.load().unwrap().faults.is_empty());
        // Health off: no more attempts.
        let mut off = Config::default();
        off.pipeline.health.enabled = false;
        tx.send_replace(Arc::new(off));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let attempts = log.subscribed.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(log.subscribed.load(Ordering::SeqCst), attempts);
        running.abort();
    }
}
