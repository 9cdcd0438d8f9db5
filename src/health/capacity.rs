//! Readiness that means capacity: `/readyz` succeeds only once the Node's `status.allocatable`
//! shows each served resource name that has healthy devices, so that a Job scheduled the moment
//! the plugin pod is Ready finds the capacity ("Insufficient directx.microsoft.com/display"
//! otherwise). Followed through the Node watch dxdp already has (`cluster::node`).
//!
//! What cannot make a node never-ready for a wrong reason:
//! - a name whose devices are all Unhealthy (or that has none) is not required: the kubelet
//!   shows it as 0 or not at all, and rightly so;
//! - "shows" is at least 1 allocatable, not an exact count: replicas multiply the count, a
//!   device that just changed health is counted by the kubelet at its next status update, and
//!   a count that lags must not flap readiness; a quantity dxdp cannot read as a whole number
//!   counts as shown;
//! - without the API server (no `NODE_NAME` or credentials) the capacity is not checked:
//!   `/readyz` keeps its meaning (registered and watched) and says so in its body; the same
//!   when the Node could not be read within `FIRST_READ_GRACE` of the start (logged once).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::NodeInfo;
use crate::inventory::{Inventory, InventoryRx};
use crate::observe::state::{Capacity, Readiness};
use crate::util::task::Task;
use dxdp_core::devices::HealthState;

/// How long readiness waits for a first read of the Node before it stops checking capacity.
pub(crate) const FIRST_READ_GRACE: Duration = Duration::from_secs(120);

/// Why the capacity is not checked without an API server client (`/readyz` says it).
pub const NO_CLIENT: &str =
    "the Node's allocatable capacity is not checked: dxdp has no API server client";

/// Whether a quantity of `status.allocatable` shows at least one device (a quantity that is
/// not a whole number counts as shown: dxdp does not judge what it cannot read).
fn shows(quantity: &str) -> bool {
    match quantity.trim().parse::<u64>() {
        Ok(n) => n >= 1,
        Err(_) => !quantity.trim().is_empty(),
    }
}

/// Why the Node does not show the capacity of `inventory` yet: one sentence per served name
/// that has healthy devices and that `allocatable` does not show (empty: it shows them all).
pub(crate) fn gaps(inventory: &Inventory, allocatable: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (r, name) in crate::inventory::endpoints(&inventory.config) {
        // The healthy IDs this name advertises (replicas or memory units of healthy GPUs).
        let served = crate::inventory::served(&inventory.config, r, &name);
        let ids = dxdp_core::allocation::advertise(&inventory.discovery, r, served)
            .iter()
            .filter(|a| a.health == HealthState::Healthy)
            .count() as u64;
        if ids == 0 {
            continue;
        }
        match allocatable.get(&name) {
            Some(q) if shows(q) => {}
            Some(q) => out.push(format!(
                "{name}: {ids} healthy device ID(s) advertised, but the Node's status.allocatable shows {q} (the kubelet updates it at its next node status update)"
            )),
            None => out.push(format!(
                "{name}: {ids} healthy device ID(s) advertised, but the Node's status.allocatable does not show it yet (the kubelet adds it at its next node status update)"
            )),
        }
    }
    out
}

/// The readiness gate: its inputs, cloned for every (re)start by the supervisor.
#[derive(Debug, Clone)]
pub struct CapacityGate {
    /// The Node as followed (`None` until it was read).
    pub node: watch::Receiver<Option<NodeInfo>>,
    /// The served inventory.
    pub inventory: InventoryRx,
    /// Where the verdict goes.
    pub readiness: Readiness,
    /// How long to wait for a first read of the Node (`FIRST_READ_GRACE`).
    pub first_read_grace: Duration,
}

impl Task for CapacityGate {
    /// Keeps the readiness's capacity verdict current until the channels close.
    async fn run(self) {
        let CapacityGate {
            mut node,
            mut inventory,
            readiness,
            first_read_grace,
        } = self;
        let started = Instant::now();
        let mut gave_up = false;
        let mut said: Option<String> = None;
        let (mut node_open, mut inventory_open) = (true, true);
        loop {
            let info = node.borrow_and_update().clone();
            let inv = inventory.borrow_and_update().clone();
            let mut wake = None;
            let verdict = match &info {
                Some(info) => {
                    if gave_up {
                        tracing::info!(
                            "the Node was read: /readyz checks its allocatable capacity again"
                        );
                        gave_up = false;
                    }
                    let gaps = gaps(&inv, &info.allocatable);
                    if gaps.is_empty() {
                        Capacity::Checked(Ok(()))
                    } else {
                        Capacity::Checked(Err(gaps.join("; ")))
                    }
                }
                None => {
                    let waited = started.elapsed();
                    if waited < first_read_grace {
                        wake = Some(started + first_read_grace);
                        Capacity::Checked(Err(
                            "waiting to read the Node (its status.allocatable must show the served resources)".into(),
                        ))
                    } else {
                        if !gave_up {
                            tracing::warn!("the Node could not be read within {} s of the start: /readyz does not wait for its allocatable capacity until it is", first_read_grace.as_secs());
                            gave_up = true;
                        }
                        Capacity::NotChecked(
                            "the Node's allocatable capacity is not checked: the Node could not be read yet".into(),
                        )
                    }
                }
            };
            if let Capacity::Checked(Err(why)) = &verdict {
                if said.as_deref() != Some(why.as_str()) {
                    tracing::info!("not ready until the Node shows the capacity: {why}");
                    said = Some(why.clone());
                }
            } else if said.take().is_some() {
                tracing::info!("the Node shows the capacity of every served resource");
            }
            readiness.set_capacity(verdict);
            if !node_open && !inventory_open && wake.is_none() {
                std::future::pending::<()>().await;
            }
            tokio::select! {
                changed = node.changed(), if node_open => node_open = changed.is_ok(),
                changed = inventory.changed(), if inventory_open => inventory_open = changed.is_ok(),
                () = crate::util::sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert!(shows("4"));
        assert!(shows("1"));
        assert!(!shows("0"));
        assert!(!shows(""));
        assert!(shows("2k"), "not a whole number: not judged");
    }
}
