//! The live inventory: the latest [`Discovery`], republished whenever the host facts change.
//!
//! The refresher asks the source every poll interval whether the facts may have changed (a
//! snapshot file was edited; DXCore reported an adapter change) and then reloads them. A load
//! that fails keeps the last good inventory.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::HostFactsSource;
use crate::devices::Discovery;
use crate::pipeline::{discover, PipelineConfig};

/// Receives the current inventory and every change.
pub type InventoryRx = watch::Receiver<Arc<Discovery>>;

/// Keeps the inventory up to date until every receiver is gone.
pub async fn refresh(
    source: Arc<dyn HostFactsSource>,
    pipeline: PipelineConfig,
    tx: watch::Sender<Arc<Discovery>>,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tx.closed() => return,
        }
        if !source.changed() {
            continue;
        }
        let source = source.clone();
        let loaded = tokio::task::spawn_blocking(move || source.load()).await;
        match loaded {
            Ok(Ok(facts)) => {
                let discovery = discover(&facts, &pipeline);
                let changed = tx.send_if_modified(|current| {
                    if **current == discovery {
                        false
                    } else {
                        *current = Arc::new(discovery);
                        true
                    }
                });
                if changed {
                    tracing::info!(
                        devices = tx.borrow().devices.len(),
                        "host facts changed; devices re-advertised"
                    );
                }
            }
            Ok(Err(e)) => {
                tracing::error!("keeping the last good device list: {e}");
            }
            Err(e) => tracing::error!("host facts refresh failed: {e}"),
        }
    }
}
