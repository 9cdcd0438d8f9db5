//! What the daemon serves: the devices and the configuration they were made with, built from
//! the host facts (pure; the daemon's refresher keeps it current, the node labels read it).

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::Discovery;
use dxdp_core::facts::HostFacts;
use dxdp_core::pipeline::discover;

/// What the services serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// The devices.
    pub discovery: Discovery,
    /// The configuration in force.
    pub config: Arc<Config>,
    /// The assignment mode in force (`auto` resolved against the host's HCS schema).
    pub assignment: Assignment,
    /// The host's operating system facts (what a new configuration is validated against).
    pub os: dxdp_core::facts::OsFacts,
}

/// Receives the current inventory and every change.
pub type InventoryRx = watch::Receiver<Arc<Inventory>>;

/// Builds the inventory for `facts` under `config`, with the notices to show the operator (the
/// pipeline's warnings, and what `auto` assignment fell back to).
pub fn build(facts: &HostFacts, config: Arc<Config>) -> (Inventory, Vec<String>) {
    let discovery = discover(facts, &config.pipeline);
    let mut notices: Vec<String> = discovery.warnings.iter().map(ToString::to_string).collect();
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
    };
    (inventory, notices)
}
