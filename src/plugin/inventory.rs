//! The live inventory: the latest devices and the configuration they were made with,
//! republished whenever the host facts or the configuration change.
//!
//! The refresher asks the source every poll interval whether the facts may have changed (a
//! snapshot file was edited; DXCore reported an adapter change) and then reloads them; a new
//! configuration reruns the pipeline over the last facts. A load that fails keeps the last good
//! inventory.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::HostFactsSource;
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
}

/// Receives the current inventory and every change.
pub type InventoryRx = watch::Receiver<Arc<Inventory>>;

/// `auto` resolved against the host's HCS schema, with a warning when it falls back to class-guid.
pub fn effective_assignment(configured: Assignment, facts: &HostFacts) -> Assignment {
    let os = facts.os.clone().unwrap_or_default();
    let resolved = configured.resolve(&os);
    if configured == Assignment::Auto && resolved == Assignment::ClassGuid {
        tracing::warn!(
            "assignment auto: HCS schema {:?} is below 2.2, so containers get every GPU of the node (class-guid)",
            os.hcs_schema_versions
        );
    }
    resolved
}

/// Builds the inventory for `facts` under `config`, logging the pipeline's warnings.
pub fn build(facts: &HostFacts, config: Arc<Config>) -> Inventory {
    let discovery = discover(facts, &config.pipeline);
    for w in &discovery.warnings {
        tracing::warn!("{w}");
    }
    Inventory {
        assignment: effective_assignment(config.assignment, facts),
        discovery,
        config,
    }
}

/// Keeps the inventory up to date until every receiver is gone.
pub async fn refresh(
    source: Arc<dyn HostFactsSource>,
    mut facts: HostFacts,
    mut config: watch::Receiver<Arc<Config>>,
    tx: watch::Sender<Arc<Inventory>>,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut config_open = true;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if !source.changed() {
                    continue;
                }
                let loader = source.clone();
                match tokio::task::spawn_blocking(move || loader.load()).await {
                    Ok(Ok(new)) => facts = new,
                    Ok(Err(e)) => {
                        tracing::error!("keeping the last good device list: {e}");
                        continue;
                    }
                    Err(e) => {
                        tracing::error!("host facts refresh failed: {e}");
                        continue;
                    }
                }
            }
            changed = config.changed(), if config_open => if changed.is_err() {
                // No more configuration updates: keep following the host facts.
                config_open = false;
                continue;
            },
            _ = tx.closed() => return,
        }
        let inventory = build(&facts, config.borrow_and_update().clone());
        let changed = tx.send_if_modified(|current| {
            if **current == inventory {
                false
            } else {
                *current = Arc::new(inventory);
                true
            }
        });
        if changed {
            tracing::info!(
                devices = tx.borrow().discovery.devices.len(),
                "devices or configuration changed; re-advertising"
            );
        }
    }
}
