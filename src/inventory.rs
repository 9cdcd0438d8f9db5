//! What the daemon serves: the devices and the configuration they were made with, built from
//! the host facts (pure; the daemon's refresher keeps it current, the node labels read it).

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::{Discovery, Resource};
use dxdp_core::facts::HostFacts;
use dxdp_core::pipeline::discover;
use dxdp_core::sharing::{Served, Sharing};

/// What the services serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// The devices.
    pub discovery: Discovery,
    /// The configuration in force.
    pub(crate) config: Arc<Config>,
    /// The assignment mode in force (`auto` resolved against the host's HCS schema).
    pub(crate) assignment: Assignment,
    /// The host's operating system facts (what a new configuration is validated against).
    pub(crate) os: dxdp_core::facts::OsFacts,
    /// The recorded fault events that are not ignored, with the devices each applies to.
    pub faults: Vec<dxdp_core::health::Hit>,
    /// When a device's fault-driven Unhealthy spell ends (ms since the epoch): rebuild then.
    pub next_health_change_ms: Option<u64>,
}

/// Receives the current inventory and every change.
pub(crate) type InventoryRx = watch::Receiver<Arc<Inventory>>;

/// Builds the inventory for `facts` under `config`, with the notices to show the operator (the
/// pipeline's warnings, and what `auto` assignment fell back to).
pub fn build(facts: &HostFacts, config: Arc<Config>) -> (Inventory, Vec<String>) {
    build_at(facts, config, now_ms())
}

/// Milliseconds since the Unix epoch now (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// [`build`] at `now_ms` (milliseconds since the epoch): the time fault events are judged at.
pub fn build_at(facts: &HostFacts, config: Arc<Config>, now_ms: u64) -> (Inventory, Vec<String>) {
    let mut discovery = discover(facts, &config.pipeline);
    let mut notices: Vec<String> = discovery.warnings.iter().map(ToString::to_string).collect();
    let applied = if config.pipeline.health.enabled {
        dxdp_core::health::apply_recorded(
            facts,
            &mut discovery,
            &config.pipeline.health.policy,
            now_ms,
        )
    } else {
        dxdp_core::health::Applied::default()
    };
    notices.extend(applied.errors);
    if !config.pipeline.health.enabled {
        notices.push(
            "health checks are off (health.enabled: false): every device is advertised Healthy, even one with a problem code or a driver update in progress".into(),
        );
    }
    let os = facts.os.clone().unwrap_or_default();
    let assignment = config.assignment.resolve(&os);
    if config.assignment == Assignment::Auto && assignment == Assignment::ClassGuid {
        notices.push(format!(
            "assignment auto: HCS schema {:?} is below 2.2, so containers get every GPU of the node (class-guid): no isolation between GPU pods on this node",
            os.hcs_schema_versions
        ));
    }
    if config.assignment == Assignment::LocationPath
        && !os.hcs_schema_versions.is_empty()
        && !dxdp_core::assignment::supports_location_path(&os)
    {
        notices.push(format!(
            "assignment location-path needs HCS schema 2.2+, this host has {:?}: every container start will fail; use assignment auto or class-guid",
            os.hcs_schema_versions
        ));
    }
    let inventory = Inventory {
        os,
        assignment,
        discovery,
        config,
        faults: applied.hits,
        next_health_change_ms: applied.next_change_ms,
    };
    (inventory, notices)
}

/// Every name served, with its resource: each enabled class's names ([`Config::endpoints`]) and,
/// for a class shared by memory, its memory resource.
pub fn endpoints(config: &Config) -> Vec<(Resource, String)> {
    let mut out = config.endpoints();
    for r in Resource::ALL {
        if let Some(name) = config.memory_resource_name(r) {
            if !out.iter().any(|(_, n)| n == name) {
                out.push((r, name.to_string()));
            }
        }
    }
    out
}

/// How the served name `name` of class `r` holds the class's GPUs: its memory resource holds
/// the GPUs with memory units, the class's own names the rest (all of them, unless the class
/// is shared by memory).
pub fn served(config: &Config, r: Resource, name: &str) -> Served {
    match config.sharing(r) {
        Sharing::Memory(m) if config.memory_resource_name(r) == Some(name) => Served::Memory(m),
        sharing => Served::Class(sharing),
    }
}
