//! A stand-in for the Windows event log (`dxdp::backend::eventlog::EventLog`): a subscription
//! that delivers a script of rendered records at once (as Windows delivers the backlog of a
//! query), and records pushed later by the test; or one that cannot be subscribed to.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use dxdp::backend::eventlog::{Delivery, EventLog, Queue, Subscription};

/// The stand-in.
pub struct ScriptedLog {
    script: Vec<String>,
    fail: Option<String>,
    queue: Mutex<Option<Arc<Queue>>>,
    attempts: Mutex<u32>,
}

struct Subscribed;
impl Subscription for Subscribed {}

impl ScriptedLog {
    /// Delivers `records` on each subscription.
    pub fn delivering(records: Vec<String>) -> Arc<Self> {
        Arc::new(ScriptedLog {
            script: records,
            fail: None,
            queue: Mutex::new(None),
            attempts: Mutex::new(0),
        })
    }

    /// Every subscription fails with `error`.
    pub fn failing(error: &str) -> Arc<Self> {
        Arc::new(ScriptedLog {
            script: Vec::new(),
            fail: Some(error.into()),
            queue: Mutex::new(None),
            attempts: Mutex::new(0),
        })
    }

    /// Delivers `xml` to the current subscription (false if there is none or it is full).
    pub fn deliver(&self, xml: String) -> bool {
        match self.queue.lock().unwrap().as_ref() {
            Some(q) => q.push(Delivery::Event(xml)),
            None => false,
        }
    }

    /// How many subscriptions were asked for.
    pub fn attempts(&self) -> u32 {
        *self.attempts.lock().unwrap()
    }
}

impl EventLog for ScriptedLog {
    fn describe(&self) -> String {
        "the scripted event log".into()
    }

    fn subscribe(&self, _query: &str, queue: Arc<Queue>) -> Result<Box<dyn Subscription>, String> {
        *self.attempts.lock().unwrap() += 1;
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        for xml in &self.script {
            queue.push(Delivery::Event(xml.clone()));
        }
        *self.queue.lock().unwrap() = Some(queue);
        Ok(Box::new(Subscribed))
    }

    fn query(&self, _query: &str, limit: usize) -> Result<Vec<String>, String> {
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        let skip = self.script.len().saturating_sub(limit);
        Ok(self.script[skip..].to_vec())
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
