//! A stand-in for the Windows event log (`dxdp::backend::eventlog::EventLog`): a log of
//! rendered records (a script given at the start, and records written later by the test) whose
//! subscription delivers the backlog at once (as Windows delivers it), or only the records
//! after a bookmark (by channel and `EventRecordID`, read with dxdp's own parser, as
//! `EvtSubscribeStartAfterBookmark` does), then each record written while it runs. Its service
//! can stop (the subscription reports an error or goes silent, subscribing fails) and start
//! again (another instance); or every subscription fails.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use dxdp::backend::eventlog::{Delivery, EventLog, Queue, Subscription};
use dxdp_core::health::feed::Bookmark;

/// What subscribing to a stopped service answers (what `EvtSubscribe` says when the Event Log
/// service is not there).
pub const SERVICE_DOWN: &str =
    "EvtSubscribe failed: HRESULT 0x800706BA (The RPC server is unavailable.)";

/// The stand-in.
pub struct ScriptedLog {
    script: Vec<String>,
    fail: Option<String>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    queue: Option<Arc<Queue>>,
    attempts: u32,
    /// Records written after the start, in order.
    written: Vec<String>,
    /// Set while the service is stopped.
    down: bool,
    /// The service's instance (changes when it starts again).
    instance: u64,
    /// The bookmark each subscription was asked to start after (its XML).
    after: Vec<Option<String>>,
}

struct Subscribed;
impl Subscription for Subscribed {}

impl ScriptedLog {
    /// Delivers `records` on each subscription from the oldest record.
    pub fn delivering(records: Vec<String>) -> Arc<Self> {
        Arc::new(ScriptedLog {
            script: records,
            fail: None,
            state: Mutex::new(State {
                instance: 1,
                ..State::default()
            }),
        })
    }

    /// Every subscription fails with `error`.
    pub fn failing(error: &str) -> Arc<Self> {
        Arc::new(ScriptedLog {
            script: Vec::new(),
            fail: Some(error.into()),
            state: Mutex::new(State::default()),
        })
    }

    /// Writes `xml` to the log and delivers it to the current subscription (false if there is
    /// none, the service is stopped, or the queue is full: a later subscription delivers it).
    pub fn write(&self, xml: String) -> bool {
        let mut state = self.state.lock().unwrap();
        state.written.push(xml.clone());
        match (&state.queue, state.down) {
            (Some(q), false) => q.push(Delivery::Event(xml)),
            _ => false,
        }
    }

    /// [`ScriptedLog::write`].
    pub fn deliver(&self, xml: String) -> bool {
        self.write(xml)
    }

    /// The service stops: the current subscription reports `error` (the callback's error
    /// action) or, with `None`, goes silent; subscribing fails ([`SERVICE_DOWN`]) until
    /// [`ScriptedLog::start_service`].
    pub fn stop_service(&self, error: Option<&str>) {
        let mut state = self.state.lock().unwrap();
        state.down = true;
        if let (Some(q), Some(e)) = (state.queue.take(), error) {
            q.fail(e.to_string());
        }
    }

    /// The service starts again, as another instance.
    pub fn start_service(&self) {
        let mut state = self.state.lock().unwrap();
        state.down = false;
        state.instance += 1;
    }

    /// How many subscriptions were asked for.
    pub fn attempts(&self) -> u32 {
        self.state.lock().unwrap().attempts
    }

    /// The bookmark (its XML) each subscription was asked to start after, in order.
    pub fn afters(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().after.clone()
    }
}

/// Whether `xml` comes after `bookmark`: a later `EventRecordID` than the bookmark's in its
/// channel, or a channel the bookmark does not name. A record dxdp cannot read is not
/// delivered after a bookmark.
fn after(xml: &str, bookmark: &Bookmark) -> bool {
    match dxdp_core::health::eventlog::parse(xml) {
        Ok(r) => match (r.record_id, bookmark.position(&r.channel)) {
            (Some(id), Some(at)) => id > at,
            (_, None) => true,
            (None, Some(_)) => false,
        },
        Err(_) => false,
    }
}

impl EventLog for ScriptedLog {
    fn describe(&self) -> String {
        "the scripted event log".into()
    }

    fn subscribe(
        &self,
        _query: &str,
        from: Option<&Bookmark>,
        queue: Arc<Queue>,
    ) -> Result<Box<dyn Subscription>, String> {
        let mut state = self.state.lock().unwrap();
        state.attempts += 1;
        state.after.push(from.map(|b| b.to_xml()));
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        if state.down {
            return Err(SERVICE_DOWN.into());
        }
        for xml in self.script.iter().chain(&state.written) {
            if from.is_none_or(|b| after(xml, b)) {
                queue.push(Delivery::Event(xml.clone()));
            }
        }
        state.queue = Some(queue);
        Ok(Box::new(Subscribed))
    }

    fn query(&self, _query: &str, limit: usize) -> Result<Vec<String>, String> {
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        let skip = self.script.len().saturating_sub(limit);
        Ok(self.script[skip..].to_vec())
    }

    fn instance(&self) -> Result<Option<u64>, String> {
        let state = self.state.lock().unwrap();
        if self.fail.is_some() {
            return Err("the service control manager cannot be asked".into());
        }
        // 0: not running, as the Windows shim answers.
        Ok(Some(if state.down { 0 } else { state.instance }))
    }
}

/// A `Display` 4101 record of `driver`, number `id`, logged at `ms` (since the epoch), as
/// `EvtRender` renders it (the layout of `crates/dxdp-core/src/health/events/`).
pub fn display_reset(id: u64, ms: u64, driver: &str) -> String {
    format!(
        "<Event xmlns='http://schemas.microsoft.com/win/2004/08/events/event'><System><Provider Name='Display'/><EventID Qualifiers='0'>4101</EventID><Version>0</Version><Level>3</Level><Task>0</Task><Opcode>0</Opcode><Keywords>0x80000000000000</Keywords><TimeCreated SystemTime='{}'/><EventRecordID>{id}</EventRecordID><Correlation/><Execution ProcessID='0' ThreadID='0'/><Channel>System</Channel><Computer>gpu-node-1</Computer><Security/></System><EventData><Data>{driver}</Data><Data></Data></EventData></Event>",
        dxdp_core::health::eventlog::format_time(ms)
    )
}

/// A WER 1001 record of a `LiveKernelEvent` `code` (141, 117) of report `report`, number `id`
/// in the Application log, logged at `ms` (the layout of
/// `crates/dxdp-core/src/health/events/wer-1001-livekernelevent-141.xml`).
pub fn live_kernel_event(id: u64, ms: u64, code: u32, report: &str) -> String {
    format!(
        "<Event xmlns='http://schemas.microsoft.com/win/2004/08/events/event'><System><Provider Name='Windows Error Reporting'/><EventID Qualifiers='0'>1001</EventID><Version>0</Version><Level>4</Level><Task>0</Task><Opcode>0</Opcode><Keywords>0x80000000000000</Keywords><TimeCreated SystemTime='{}'/><EventRecordID>{id}</EventRecordID><Correlation/><Execution ProcessID='0' ThreadID='0'/><Channel>Application</Channel><Computer>gpu-node-1</Computer><Security/></System><EventData><Data>0</Data><Data>5</Data><Data>LiveKernelEvent</Data><Data>Not available</Data><Data>0</Data><Data>{code}</Data><Data>ffffc30b9a5f2010</Data><Data>fffff8034a3d9f10</Data><Data>0</Data><Data>3c8</Data><Data>10_0_20348</Data><Data>0_0</Data><Data>256_1</Data><Data></Data><Data></Data><Data></Data><Data></Data><Data></Data><Data>0</Data><Data>{report}</Data><Data>268435456</Data><Data></Data><Data>0</Data></EventData></Event>",
        dxdp_core::health::eventlog::format_time(ms)
    )
}
