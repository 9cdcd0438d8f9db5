//! The live inventory: the latest [`Discovery`], republished whenever the host facts change.
//!
//! The refresher reloads facts when the source's watched file changes (host snapshots; the
//! Windows backend adds its own notifications). A load that fails keeps the last good inventory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::backend::HostFactsSource;
use crate::devices::Discovery;
use crate::pipeline::{discover, PipelineConfig};

/// Receives the current inventory and every change.
pub type InventoryRx = watch::Receiver<Arc<Discovery>>;

/// What identifies a version of a file: modification time and length.
type Stamp = Option<(Option<SystemTime>, u64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.modified().ok(), m.len()))
}

/// Keeps the inventory up to date until every receiver is gone.
pub async fn refresh(
    source: Arc<dyn HostFactsSource>,
    pipeline: PipelineConfig,
    tx: watch::Sender<Arc<Discovery>>,
    interval: Duration,
) {
    let Some(path) = source.watch_path() else {
        // Nothing to watch: keep the sender alive so receivers never see a closed channel.
        tx.closed().await;
        return;
    };
    let mut last = stamp(&path);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tx.closed() => return,
        }
        let now = stamp(&path);
        if now == last {
            continue;
        }
        last = now;
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
