//! The live fault-event feed, pure: what dxdp asks the Windows event log for and how far back
//! ([`query`], [`lookback`]), which records it keeps ([`FaultLog`]: fault events only, the newest
//! [`MAX_JUDGED_FAULTS`], each once by channel and `EventRecordID`, a WER report once by its
//! report ID), where a subscription got to ([`Bookmark`], to subscribe again after a failure
//! with no gap and nothing twice), and how often a flood may rebuild the inventory ([`Pacer`]:
//! at most once per [`PUBLISH_INTERVAL_MS`]).
//!
//! The subscription itself (`EvtSubscribe`) is the Windows backend's thin shim; the daemon's
//! task moves what it delivers through these pieces. `dxdp snapshot` records with the same
//! query and keeps what [`for_snapshot`] keeps, so a replay judges what the daemon would have.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::eventlog;
use super::{Action, HealthPolicy, Reason, MAX_JUDGED_FAULTS};
use crate::facts::LogRecord;

/// The shortest time a new inventory waits for the previous one during a flood of events.
pub const PUBLISH_INTERVAL_MS: u64 = 1000;

/// The least history read at start: a restarted dxdp still sees the resets of the last minutes.
pub const MIN_LOOKBACK: Duration = Duration::from_secs(10 * 60);

/// The most history read at start (two policy durations of the 7-day maximum).
pub const MAX_LOOKBACK: Duration = Duration::from_secs(14 * 24 * 3600);

/// The largest rendered record kept (a fault record is 0.7 to 1.5 KB): with
/// [`MAX_JUDGED_FAULTS`] records this bounds a [`FaultLog`]'s memory to 64 MiB at the very
/// worst, about 3 to 6 MiB in a real flood.
pub const MAX_RECORD_BYTES: usize = 16 << 10;

/// The event signals the feed reads, with the channel, provider and event ID Windows logs them
/// under (the catalogue's sources).
pub const SOURCES: [(Reason, &str, &str, u32); 2] = [
    (Reason::Tdr, "System", "Display", 4101),
    (
        Reason::LiveKernelEvent,
        "Application",
        "Windows Error Reporting",
        1001,
    ),
];

/// How far back the events that can still change health go under `policy`: for each event
/// signal that is not ignored, its window plus how long it lasts (`unhealthy_for`), the longest
/// of them, at least [`MIN_LOOKBACK`] and at most [`MAX_LOOKBACK`].
pub fn lookback(policy: &HealthPolicy) -> Duration {
    let mut longest = Duration::ZERO;
    for (signal, ..) in SOURCES {
        let p = policy.of(signal);
        let lasts = match p.action {
            Action::Ignore => continue,
            Action::UnhealthyFor(d) => d,
            Action::UnhealthyUntilCleared | Action::EventOnly => Duration::ZERO,
        };
        longest = longest.max(p.window.saturating_add(lasts));
    }
    longest.clamp(MIN_LOOKBACK, MAX_LOOKBACK)
}

/// The structured XML query (`EvtSubscribe`, `EvtQuery`) for the fault events of the last
/// `lookback`: `Display` 4101 in the System log and `Windows Error Reporting` 1001 in the
/// Application log (which LiveKernelEvent a WER report is, the parser decides). `ignored`
/// signals are left out of the query.
pub fn query(lookback: Duration, policy: &HealthPolicy) -> String {
    let ms = lookback.as_millis();
    let mut out = String::from("<QueryList><Query Id=\"0\">");
    for (signal, channel, provider, id) in SOURCES {
        if policy.of(signal).action == Action::Ignore {
            continue;
        }
        out.push_str(&format!(
            "<Select Path=\"{channel}\">*[System[Provider[@Name='{provider}'] and EventID={id} and TimeCreated[timediff(@SystemTime) &lt;= {ms}]]]</Select>"
        ));
    }
    out.push_str("</Query></QueryList>");
    out
}

/// Whether `query` selects nothing (every event signal is ignored): no subscription is needed.
pub fn selects_nothing(query: &str) -> bool {
    !query.contains("<Select")
}

/// How many WER report IDs a [`FaultLog`] remembers after their records left it (expired or
/// pushed out), so that a later state change of the same report is not a new fault: the newest
/// 4,096 (a report ID is a 36-character GUID: at most about 400 KiB with the sets' overhead).
pub const MAX_SEEN_REPORTS: usize = 4096;

/// The channels the structured query `query` reads (its `Select Path` values), in order.
pub fn channels(query: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("<Select Path=\"") {
        let after = &rest[at + 14..];
        let Some(end) = after.find('"') else { break };
        let channel = after[..end].to_string();
        if !out.iter().any(|c| c.eq_ignore_ascii_case(&channel)) {
            out.push(channel);
        }
        rest = &after[end..];
    }
    out
}

/// Where a subscription got to: the `EventRecordID` of the newest record delivered in each
/// channel. Rendered as the event log's bookmark XML ([`Bookmark::to_xml`], the format of
/// `[MS-EVEN6]` 2.2.14 that `EvtCreateBookmark` reads), a new subscription starts after it
/// (`EvtSubscribeStartAfterBookmark`): records written while dxdp was not subscribed are
/// delivered, and none already delivered comes again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bookmark {
    /// Channel (as rendered, e.g. `System`) to the newest record ID delivered.
    channels: BTreeMap<String, u64>,
    /// The channel of the last record noted (`IsCurrent`).
    current: Option<String>,
}

impl Bookmark {
    /// Nothing delivered yet.
    pub fn new() -> Self {
        Bookmark::default()
    }

    /// Notes a delivered record (one without a channel or `EventRecordID` changes nothing).
    pub fn note(&mut self, record: &eventlog::EventRecord) {
        let (Some(id), false) = (record.record_id, record.channel.is_empty()) else {
            return;
        };
        let key = self
            .channels
            .keys()
            .find(|c| c.eq_ignore_ascii_case(&record.channel))
            .cloned()
            .unwrap_or_else(|| record.channel.clone());
        let slot = self.channels.entry(key.clone()).or_insert(id);
        *slot = (*slot).max(id);
        self.current = Some(key);
    }

    /// The newest record ID delivered in `channel`.
    pub fn position(&self, channel: &str) -> Option<u64> {
        self.channels
            .iter()
            .find(|(c, _)| c.eq_ignore_ascii_case(channel))
            .map(|(_, id)| *id)
    }

    /// Whether every channel `query` reads has a position: only then does a subscription after
    /// the bookmark miss nothing (what Windows does with a channel a bookmark does not name is
    /// not documented), so otherwise a new subscription reads the lookback again and the
    /// [`FaultLog`] drops what it already holds.
    pub fn covers(&self, query: &str) -> bool {
        let wanted = channels(query);
        !wanted.is_empty() && wanted.iter().all(|c| self.position(c).is_some())
    }

    /// Whether no record was noted.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// The bookmark as `EvtRender(EvtRenderBookmark)` writes it and `EvtCreateBookmark` reads
    /// it: `<BookmarkList><Bookmark Channel='System' RecordId='18251' IsCurrent='true'/>…`.
    pub fn to_xml(&self) -> String {
        let mut out = String::from("<BookmarkList>");
        for (channel, id) in &self.channels {
            let current = if self.current.as_deref() == Some(channel.as_str()) {
                " IsCurrent='true'"
            } else {
                ""
            };
            out.push_str(&format!(
                "<Bookmark Channel='{}' RecordId='{id}'{current}/>",
                escape(channel)
            ));
        }
        out.push_str("</BookmarkList>");
        out
    }
}

/// Escapes text for an XML attribute in single quotes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// What tells two records apart: the WER report a `LiveKernelEvent` belongs to (every state
/// change of one report logs another record), else the channel and `EventRecordID`, or (a
/// rendering without a record ID) the text itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Report(String),
    Record(String, u64),
    Text(u64),
}

fn key_of(record: &eventlog::EventRecord, xml: &str) -> Key {
    if let Some(report) = eventlog::report_id(record) {
        return Key::Report(report);
    }
    match record.record_id {
        Some(id) => Key::Record(record.channel.to_ascii_lowercase(), id),
        None => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            xml.hash(&mut h);
            Key::Text(h.finish())
        }
    }
}

/// What [`FaultLog::offer`] did with a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// A new fault event, kept.
    Added,
    /// The same record (channel and `EventRecordID`) is already kept, or the same WER report
    /// (report ID) was already offered.
    Duplicate,
    /// A record that is no fault dxdp knows (another WER report, an unknown code).
    NotAFault,
    /// Older than what is kept (before the lookback, or older than every kept record when the
    /// log is full).
    TooOld,
    /// The record cannot be read; the sentence says why.
    Unreadable(String),
}

/// The fault events kept for judging: at most `capacity`, the newest by event time, each record
/// once, each WER report once (also after its record left, for the newest [`MAX_SEEN_REPORTS`]
/// reports). Memory is bounded by `capacity` times the size of a record (a rendered 4101 record
/// is about 700 bytes, a WER report about 1.5 KB) plus the remembered report IDs.
#[derive(Debug, Clone)]
pub struct FaultLog {
    capacity: usize,
    /// By (event time, arrival): the newest last.
    by_time: BTreeMap<(u64, u64), (Key, String)>,
    keys: HashMap<Key, (u64, u64)>,
    arrivals: u64,
    bytes: usize,
    /// WER report IDs offered, the oldest first, at most [`MAX_SEEN_REPORTS`].
    reports: VecDeque<String>,
    seen_reports: HashSet<String>,
}

impl Default for FaultLog {
    fn default() -> Self {
        FaultLog::new(MAX_JUDGED_FAULTS)
    }
}

impl FaultLog {
    /// An empty log keeping at most `capacity` records (at least one).
    pub fn new(capacity: usize) -> Self {
        FaultLog {
            capacity: capacity.max(1),
            by_time: BTreeMap::new(),
            keys: HashMap::new(),
            arrivals: 0,
            bytes: 0,
            reports: VecDeque::new(),
            seen_reports: HashSet::new(),
        }
    }

    /// Keeps `xml` if it is a fault event at or after `oldest_ms` (milliseconds since the
    /// epoch) not kept yet; when full, the oldest record makes room.
    pub fn offer(&mut self, xml: String, oldest_ms: u64) -> Offer {
        self.offer_noting(xml, oldest_ms, |_| {})
    }

    /// [`FaultLog::offer`], calling `noted` with every record that could be read (fault or
    /// not), e.g. to move a [`Bookmark`] on.
    pub fn offer_noting(
        &mut self,
        xml: String,
        oldest_ms: u64,
        noted: impl FnOnce(&eventlog::EventRecord),
    ) -> Offer {
        if xml.len() > MAX_RECORD_BYTES {
            return Offer::Unreadable(format!(
                "a record of {} bytes is larger than the {} KiB dxdp reads",
                xml.len(),
                MAX_RECORD_BYTES >> 10
            ));
        }
        let record = match eventlog::parse(&xml) {
            Ok(r) => r,
            Err(e) => return Offer::Unreadable(e),
        };
        noted(&record);
        if eventlog::fault(&record).is_none() {
            return Offer::NotAFault;
        }
        let key = key_of(&record, &xml);
        if let Key::Report(report) = &key {
            // A later state of a report already offered, kept or not.
            if !self.remember_report(report) {
                return Offer::Duplicate;
            }
        }
        if record.time_ms < oldest_ms {
            return Offer::TooOld;
        }
        if self.keys.contains_key(&key) {
            return Offer::Duplicate;
        }
        self.arrivals += 1;
        let slot = (record.time_ms, self.arrivals);
        if self.by_time.len() >= self.capacity {
            match self.by_time.first_key_value() {
                Some((first, _)) if *first < slot => {
                    let first = *first;
                    self.remove(first);
                }
                _ => return Offer::TooOld,
            }
        }
        self.bytes += xml.len();
        self.keys.insert(key.clone(), slot);
        self.by_time.insert(slot, (key, xml));
        Offer::Added
    }

    /// Remembers `report`; false if it was already remembered.
    fn remember_report(&mut self, report: &str) -> bool {
        if self.seen_reports.contains(report) {
            return false;
        }
        if self.reports.len() >= MAX_SEEN_REPORTS {
            if let Some(old) = self.reports.pop_front() {
                self.seen_reports.remove(&old);
            }
        }
        self.reports.push_back(report.to_string());
        self.seen_reports.insert(report.to_string());
        true
    }

    /// How many WER report IDs are remembered.
    pub fn reports_seen(&self) -> usize {
        self.reports.len()
    }

    fn remove(&mut self, slot: (u64, u64)) {
        if let Some((key, xml)) = self.by_time.remove(&slot) {
            self.bytes -= xml.len();
            self.keys.remove(&key);
        }
    }

    /// Forgets the records before `oldest_ms`; returns how many.
    pub fn expire(&mut self, oldest_ms: u64) -> usize {
        let old: Vec<(u64, u64)> = self
            .by_time
            .range(..(oldest_ms, 0))
            .map(|(k, _)| *k)
            .collect();
        for slot in &old {
            self.remove(*slot);
        }
        old.len()
    }

    /// The kept records, oldest first (the order of a snapshot's `faults`).
    pub fn records(&self) -> Vec<LogRecord> {
        self.by_time
            .values()
            .map(|(_, xml)| LogRecord { xml: xml.clone() })
            .collect()
    }

    /// How many records are kept.
    pub fn len(&self) -> usize {
        self.by_time.len()
    }

    /// Whether no record is kept.
    pub fn is_empty(&self) -> bool {
        self.by_time.is_empty()
    }

    /// The bytes of rendered XML kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The records a snapshot keeps from what the event log returned: the fault events, each once,
/// oldest first, the newest [`MAX_JUDGED_FAULTS`] of them (what the daemon judges). Returns
/// them with how many records were not faults or could not be read.
pub fn for_snapshot<I: IntoIterator<Item = String>>(xmls: I) -> (Vec<LogRecord>, usize) {
    let mut log = FaultLog::default();
    let mut skipped = 0;
    for xml in xmls {
        match log.offer(xml, 0) {
            Offer::NotAFault | Offer::Unreadable(_) => skipped += 1,
            Offer::Added | Offer::Duplicate | Offer::TooOld => {}
        }
    }
    (log.records(), skipped)
}

/// The recorded events of a host (a snapshot's `faults`) followed by the live ones that are not
/// among them (the same channel and `EventRecordID`).
pub fn merge(recorded: &[LogRecord], live: Vec<LogRecord>) -> Vec<LogRecord> {
    if recorded.is_empty() {
        return live;
    }
    let known: std::collections::HashSet<Key> = recorded
        .iter()
        .filter_map(|r| eventlog::parse(&r.xml).ok().map(|p| key_of(&p, &r.xml)))
        .collect();
    let mut out = recorded.to_vec();
    out.extend(live.into_iter().filter(|r| {
        eventlog::parse(&r.xml)
            .map(|p| !known.contains(&key_of(&p, &r.xml)))
            .unwrap_or(true)
    }));
    out
}

/// When to rebuild the inventory for new events: at once for the first change, then at most
/// once per interval, however many events arrive in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacer {
    interval_ms: u64,
    last_ms: Option<u64>,
    pending: bool,
}

impl Pacer {
    /// Publishes at most once per `interval_ms`.
    pub fn new(interval_ms: u64) -> Self {
        Pacer {
            interval_ms,
            last_ms: None,
            pending: false,
        }
    }

    /// Something changed that the inventory should show.
    pub fn note(&mut self) {
        self.pending = true;
    }

    /// When the next rebuild is due (ms since the epoch), or `None` with nothing to show.
    pub fn due_ms(&self) -> Option<u64> {
        if !self.pending {
            return None;
        }
        Some(
            self.last_ms
                .map_or(0, |l| l.saturating_add(self.interval_ms)),
        )
    }

    /// Whether a rebuild is due at `now_ms`.
    pub fn is_due(&self, now_ms: u64) -> bool {
        self.due_ms().is_some_and(|d| d <= now_ms)
    }

    /// A rebuild was asked for at `now_ms`.
    pub fn published(&mut self, now_ms: u64) {
        self.pending = false;
        self.last_ms = Some(now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::SignalPolicy;

    const TDR: &str = include_str!("events/display-4101-nvlddmkm.xml");
    const TDR_UNKNOWN: &str = include_str!("events/display-4101-unknown-driver.xml");
    const WER_141: &str = include_str!("events/wer-1001-livekernelevent-141.xml");
    const SCM: &str = include_str!("events/scm-7036-not-a-fault.xml");
    /// 2026-11-25T21:40:12.512Z, the time of `TDR`.
    const T_TDR: u64 = 1_795_642_812_512;

    /// `TDR` with another record ID and time (`21:MM:SS`).
    fn tdr_at(id: u64, mm: u32, ss: u32) -> String {
        TDR.replace("<EventRecordID>18233<", &format!("<EventRecordID>{id}<"))
            .replace(
                "2026-11-25T21:40:12.5129385Z",
                &format!("2026-11-25T21:{mm:02}:{ss:02}.0000000Z"),
            )
    }

    #[test]
    fn the_default_policy_reads_twenty_minutes_back() {
        // tdr: 3 within 10 minutes, then 10 minutes Unhealthy; live_kernel_event: event only.
        assert_eq!(
            lookback(&HealthPolicy::default()),
            Duration::from_secs(20 * 60)
        );
        let mut p = HealthPolicy::default();
        p.signals.insert(
            Reason::Tdr,
            SignalPolicy::every(Action::UnhealthyUntilCleared),
        );
        assert_eq!(
            lookback(&p),
            MIN_LOOKBACK,
            "nothing needs more than the floor"
        );
        p.signals.insert(
            Reason::LiveKernelEvent,
            SignalPolicy {
                action: Action::UnhealthyFor(Duration::from_secs(7 * 24 * 3600)),
                count: 2,
                window: Duration::from_secs(7 * 24 * 3600),
                ambiguous: crate::health::Ambiguous::EventOnly,
            },
        );
        assert_eq!(lookback(&p), MAX_LOOKBACK);
        p.ignore.insert(Reason::LiveKernelEvent);
        assert_eq!(
            lookback(&p),
            MIN_LOOKBACK,
            "an ignored signal needs no history"
        );
    }

    #[test]
    fn the_query_selects_both_logs_and_leaves_out_ignored_signals() {
        let q = query(Duration::from_secs(20 * 60), &HealthPolicy::default());
        assert_eq!(
            q,
            "<QueryList><Query Id=\"0\">\
             <Select Path=\"System\">*[System[Provider[@Name='Display'] and EventID=4101 and TimeCreated[timediff(@SystemTime) &lt;= 1200000]]]</Select>\
             <Select Path=\"Application\">*[System[Provider[@Name='Windows Error Reporting'] and EventID=1001 and TimeCreated[timediff(@SystemTime) &lt;= 1200000]]]</Select>\
             </Query></QueryList>"
        );
        assert!(!selects_nothing(&q));
        let mut p = HealthPolicy::default();
        p.ignore.insert(Reason::LiveKernelEvent);
        let q = query(Duration::from_secs(60), &p);
        assert!(
            q.contains("Path=\"System\"") && !q.contains("Application"),
            "{q}"
        );
        p.ignore.insert(Reason::Tdr);
        assert!(selects_nothing(&query(Duration::from_secs(60), &p)));
    }

    #[test]
    fn the_log_keeps_faults_once_each_and_says_why_not() {
        let mut log = FaultLog::new(8);
        assert_eq!(log.offer(TDR.into(), 0), Offer::Added);
        assert_eq!(log.offer(TDR.into(), 0), Offer::Duplicate);
        // The same record rendered again differently (another Keywords) is still one record.
        let again = TDR.replace("0x80000000000000", "0x8000000000000000");
        assert_eq!(log.offer(again, 0), Offer::Duplicate);
        assert_eq!(log.offer(SCM.into(), 0), Offer::NotAFault);
        let huge = TDR.replace(
            "<Data></Data>",
            &format!("<Data>{}</Data>", "x".repeat(20_000)),
        );
        assert_eq!(
            log.offer(huge, 0),
            Offer::Unreadable(format!(
                "a record of {} bytes is larger than the 16 KiB dxdp reads",
                TDR.len() + 20_000
            ))
        );
        assert_eq!(
            log.offer("<Event/>".into(), 0),
            Offer::Unreadable("no <System> element".into())
        );
        assert_eq!(log.offer(WER_141.into(), 0), Offer::Added);
        // Record 18233 of the Application log is another record than 18233 of System.
        let other_channel = TDR.replace("<Channel>System<", "<Channel>Application<");
        assert_eq!(log.offer(other_channel, 0), Offer::Added);
        assert_eq!(log.offer(TDR_UNKNOWN.into(), T_TDR + 1), Offer::Added);
        // Before the lookback: not kept.
        assert_eq!(log.offer(tdr_at(1, 0, 0), T_TDR), Offer::TooOld);
        assert_eq!(log.len(), 4);
        let times: Vec<u64> = log
            .records()
            .iter()
            .map(|r| eventlog::parse(&r.xml).unwrap().time_ms)
            .collect();
        // 21:40:12.512 (twice: System and Application), 21:40:19.041, 21:52:40.000: oldest first.
        assert_eq!(times, [T_TDR, T_TDR, 1_795_642_819_041, 1_795_643_560_000]);
        assert_eq!(
            log.bytes(),
            TDR.len() * 2 + WER_141.len() + TDR_UNKNOWN.len() + 5
        );
    }

    #[test]
    fn a_full_log_keeps_the_newest_and_expiry_forgets_the_old() {
        let mut log = FaultLog::new(3);
        for (id, ss) in [(1, 10), (2, 20), (3, 30)] {
            assert_eq!(log.offer(tdr_at(id, 41, ss), 0), Offer::Added);
        }
        // A newer one pushes out 21:41:10; an older one than all kept is not taken.
        assert_eq!(log.offer(tdr_at(4, 41, 40), 0), Offer::Added);
        assert_eq!(log.offer(tdr_at(5, 41, 5), 0), Offer::TooOld);
        // The pushed-out record may come again (a new subscription): still too old.
        assert_eq!(log.offer(tdr_at(1, 41, 10), 0), Offer::TooOld);
        let ids: Vec<Option<u64>> = log
            .records()
            .iter()
            .map(|r| eventlog::parse(&r.xml).unwrap().record_id)
            .collect();
        assert_eq!(ids, [Some(2), Some(3), Some(4)]);
        // 21:41:30.000Z = 1_795_564_800_000 + (21 * 3600 + 41 * 60 + 30) * 1000.
        let t_30 = 1_795_564_800_000 + (21 * 3600 + 41 * 60 + 30) * 1000;
        assert_eq!(log.expire(t_30), 1, "21:41:20 goes, 21:41:30 stays");
        assert_eq!(log.len(), 2);
        assert_eq!(log.bytes(), 2 * tdr_at(3, 41, 30).len());
        assert_eq!(log.offer(tdr_at(2, 41, 20), 0), Offer::Added, "forgotten");
    }

    #[test]
    fn a_snapshot_keeps_the_faults_oldest_first() {
        let (kept, skipped) = for_snapshot([
            TDR_UNKNOWN.to_string(),
            SCM.to_string(),
            TDR.to_string(),
            TDR.to_string(),
            "not xml".to_string(),
        ]);
        assert_eq!(skipped, 2);
        assert_eq!(
            kept,
            vec![
                LogRecord { xml: TDR.into() },
                LogRecord {
                    xml: TDR_UNKNOWN.into()
                }
            ]
        );
    }

    #[test]
    fn live_records_already_recorded_are_not_added_twice() {
        let recorded = vec![LogRecord { xml: TDR.into() }];
        let live = vec![
            LogRecord { xml: TDR.into() },
            LogRecord {
                xml: WER_141.into(),
            },
        ];
        assert_eq!(
            merge(&recorded, live.clone()),
            vec![
                LogRecord { xml: TDR.into() },
                LogRecord {
                    xml: WER_141.into()
                }
            ]
        );
        assert_eq!(merge(&[], live.clone()), live);
    }

    /// The same WER report (`0e7b1c55-…`) logged again when it was sent, 43 s later, as a
    /// new record (40217).
    const WER_141_SENT: &str = include_str!("events/wer-1001-livekernelevent-141-sent.xml");
    /// Another report (`5c2d9e41-…`, LiveKernelEvent 117, record 40230).
    const WER_117: &str = include_str!("events/wer-1001-livekernelevent-117.xml");

    #[test]
    fn a_live_kernel_event_report_counts_once_whatever_its_states() {
        // Three deliveries, two reports: two faults.
        let (kept, skipped) = for_snapshot([
            WER_141.to_string(),
            WER_141_SENT.to_string(),
            WER_117.to_string(),
        ]);
        assert_eq!(skipped, 0);
        assert_eq!(
            kept,
            vec![
                LogRecord {
                    xml: WER_141.into()
                },
                LogRecord {
                    xml: WER_117.into()
                }
            ]
        );
        let mut log = FaultLog::new(8);
        assert_eq!(log.offer(WER_141.into(), 0), Offer::Added);
        assert_eq!(log.offer(WER_141_SENT.into(), 0), Offer::Duplicate);
        assert_eq!(log.offer(WER_117.into(), 0), Offer::Added);
        assert_eq!(log.reports_seen(), 2);
        // After the first record expired, the report's next state is still not a new fault.
        assert_eq!(log.expire(u64::MAX), 2);
        assert_eq!(log.offer(WER_141_SENT.into(), 0), Offer::Duplicate);
        // Merged with a snapshot holding the first state: one record for the report.
        let merged = merge(
            &[LogRecord {
                xml: WER_141.into(),
            }],
            vec![
                LogRecord {
                    xml: WER_141_SENT.into(),
                },
                LogRecord {
                    xml: WER_117.into(),
                },
            ],
        );
        assert_eq!(
            merged,
            vec![
                LogRecord {
                    xml: WER_141.into()
                },
                LogRecord {
                    xml: WER_117.into()
                }
            ]
        );
    }

    #[test]
    fn the_memory_of_reports_is_bounded() {
        let report = |n: usize| {
            WER_141.replace(
                "0e7b1c55-3a52-4c1e-9a0d-5f1f2f0a6b21",
                &format!("00000000-0000-0000-0000-{n:012}"),
            )
        };
        let mut log = FaultLog::new(4);
        for n in 0..MAX_SEEN_REPORTS + 1 {
            // One time for all: once the log holds 4, the others are too old, but remembered.
            let offered = log.offer(report(n), 0);
            assert!(
                matches!(offered, Offer::Added | Offer::TooOld),
                "{n}: {offered:?}"
            );
        }
        assert_eq!(log.reports_seen(), 4096);
        assert_eq!(log.len(), 4);
        // Report 0 was forgotten (the oldest), report 1 is still remembered.
        assert_eq!(log.expire(u64::MAX), 4);
        assert_eq!(log.offer(report(0), 0), Offer::Added);
        assert_eq!(log.offer(report(2), 0), Offer::Duplicate);
    }

    #[test]
    fn a_bookmark_holds_the_newest_record_of_each_channel() {
        let q = query(Duration::from_secs(20 * 60), &HealthPolicy::default());
        assert_eq!(channels(&q), ["System", "Application"]);
        let mut b = Bookmark::new();
        assert!(b.is_empty());
        assert!(!b.covers(&q));
        assert_eq!(b.to_xml(), "<BookmarkList></BookmarkList>");
        b.note(&eventlog::parse(&tdr_at(18_240, 41, 0)).unwrap());
        b.note(&eventlog::parse(&tdr_at(18_251, 42, 0)).unwrap());
        // An older record delivered late does not move it back.
        b.note(&eventlog::parse(&tdr_at(18_239, 40, 0)).unwrap());
        assert_eq!(b.position("system"), Some(18_251));
        assert!(!b.covers(&q), "nothing of the Application log yet");
        b.note(&eventlog::parse(WER_141).unwrap());
        assert!(b.covers(&q));
        assert_eq!(
            b.to_xml(),
            "<BookmarkList><Bookmark Channel='Application' RecordId='40211' IsCurrent='true'/><Bookmark Channel='System' RecordId='18251'/></BookmarkList>"
        );
        // A query of the System log only is covered by it too.
        let mut p = HealthPolicy::default();
        p.ignore.insert(Reason::LiveKernelEvent);
        let system = query(Duration::from_secs(60), &p);
        assert_eq!(channels(&system), ["System"]);
        let mut s = Bookmark::new();
        s.note(&eventlog::parse(TDR).unwrap());
        assert!(s.covers(&system));
        // The record that could not be read moves nothing; one without a record ID neither.
        let no_id = TDR.replace("<EventRecordID>18233</EventRecordID>", "");
        s.note(&eventlog::parse(&no_id).unwrap());
        assert_eq!(
            s.to_xml(),
            "<BookmarkList><Bookmark Channel='System' RecordId='18233' IsCurrent='true'/></BookmarkList>"
        );
        assert!(!s.covers("<QueryList><Query Id=\"0\"></Query></QueryList>"));
    }

    #[test]
    fn offering_notes_every_record_it_could_read() {
        let mut log = FaultLog::new(8);
        let mut b = Bookmark::new();
        assert_eq!(
            log.offer_noting(SCM.into(), 0, |r| b.note(r)),
            Offer::NotAFault
        );
        assert_eq!(log.offer_noting(TDR.into(), 0, |r| b.note(r)), Offer::Added);
        assert_eq!(
            log.offer_noting("<Event/>".into(), 0, |r| b.note(r)),
            Offer::Unreadable("no <System> element".into())
        );
        assert_eq!(b.position("System"), Some(18_233));
    }

    #[test]
    fn a_flood_publishes_at_once_then_at_most_once_a_second() {
        let mut p = Pacer::new(PUBLISH_INTERVAL_MS);
        assert_eq!(p.due_ms(), None, "nothing to show");
        p.note();
        assert!(p.is_due(5_000), "the first change at once");
        p.published(5_000);
        assert_eq!(p.due_ms(), None);
        // 1,000 events in the next second: one rebuild, at 6,000.
        for _ in 0..1000 {
            p.note();
        }
        assert_eq!(p.due_ms(), Some(6_000));
        assert!(!p.is_due(5_999));
        assert!(p.is_due(6_000));
        p.published(6_000);
        // A quiet spell, then one event: at once again.
        p.note();
        assert!(p.is_due(60_000));
    }
}
