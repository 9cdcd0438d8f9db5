//! Configuration hot reload: re-reads the configuration when one of its files changes (including
//! a ConfigMap update, which swaps a symlink) and publishes it to the running plugin. An invalid
//! file keeps the previous configuration; every outcome is logged.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{self, Config, Inputs};

/// Re-reads the configuration when one of its files changes; an invalid file keeps the old one.
pub async fn watch(inputs: Inputs, tx: watch::Sender<Arc<Config>>, interval: Duration) {
    let files = inputs.watched_files();
    if files.is_empty() {
        return;
    }
    let watcher = config::Watcher::new(files.clone());
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    loop {
        tokio::time::sleep(interval).await;
        if !watcher.changed() {
            continue;
        }
        match inputs.resolve() {
            Ok(new) if *tx.borrow().as_ref() == new => {
                tracing::info!(files = ?names, "configuration reloaded: no effective change");
            }
            Ok(new) => {
                tracing::info!(files = ?names, "configuration reloaded and applied");
                if tx.send(Arc::new(new)).is_err() {
                    return;
                }
            }
            Err(e) => tracing::error!(
                "configuration reload failed; keeping the previous configuration: {e}"
            ),
        }
    }
}
