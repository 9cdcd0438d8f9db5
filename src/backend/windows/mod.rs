//! The native Windows backend: host facts from DXCore, CfgMgr32 device nodes, D3DKMT, the
//! registry, the file system and HCS; and the live telemetry sources (PDH GPU counters, DXCore
//! shared memory limits, GPU sensors from D3DKMT and NVML, HCS container process lists). The only code that touches Windows APIs; every shim is thin
//! and the byte-level parsing lives in [`crate::backend::winparse`], tested on every target.
//!
//! Per-adapter tolerance: an adapter whose device node, driver store path or registry keys cannot
//! be read keeps the facts that could be read, plus `readErrors` naming the API and status code;
//! the pipeline turns those into warnings (and exclusions where facts are missing).

mod d3dkmt;
mod devnodes;
mod dxcore;
mod error;
pub(crate) mod eventlog;
pub(crate) mod hcs;
mod library;
mod nvml;
mod os;
pub(crate) mod pdh;
pub(crate) mod probe;
mod registry;
mod sensors;
pub(crate) mod telemetry;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use windows::Win32::System::Registry::HKEY_LOCAL_MACHINE;

use super::{HostFactsSource, SourceError, Wake};
use dxdp_core::facts::{AdapterProperty, Attribute, HostFacts, RegistryKey};
use dxdp_core::pipeline::matching::AdapterMatch;
use dxdp_core::pipeline::runtime_files::{CLASS_ROOT, SUBKEYS};

pub(crate) use error::WinError;

/// Facts are re-read at least this often, for changes DXCore does not notify (problem codes,
/// driver updates finishing).
const HEALTH_POLL: Duration = Duration::from_secs(10);

/// The facts of the Windows machine dxdp runs on.
#[derive(Default)]
pub(crate) struct WindowsHost {
    session: Mutex<Option<dxcore::Session>>,
    /// When the last load was attempted, successful or not (so a failing host is retried at
    /// the health-poll pace, not on every safety tick).
    attempted_at: Mutex<Option<Instant>>,
    /// The device-node enumeration errors last logged, so the same ones are not logged again.
    node_errors: Mutex<Vec<String>>,
    /// How adapters were last matched to device nodes, logged when it changes.
    matches: Mutex<Vec<AdapterMatch>>,
    /// The D3D12 feature level per adapter LUID and driver version, or why there is none:
    /// found once (it creates a D3D12 device), not on every refresh.
    feature_levels: Mutex<HashMap<(i64, String), Option<String>>>,
}

/// Logs which rule matched each adapter to its device node (the pipeline warns about unmatched
/// hardware adapters itself).
fn log_matches(facts: &HostFacts, matches: &[AdapterMatch]) {
    for (adapter, m) in facts.adapters.iter().zip(matches) {
        let name = adapter.driver_description.as_str();
        match m.matched_by {
            Some(by) => tracing::info!(
                "adapter {name:?} (LUID {}) matched by {by}: {}",
                dxdp_core::luid::label(m.luid),
                m.detail
            ),
            None if adapter.is_hardware => tracing::info!(
                "adapter {name:?} (LUID {}) has no device node: {}",
                dxdp_core::luid::label(m.luid),
                m.detail
            ),
            None => tracing::debug!(
                "adapter {name:?} (LUID {}): {}",
                dxdp_core::luid::label(m.luid),
                m.detail
            ),
        }
    }
}

impl WindowsHost {
    /// A backend that has not enumerated anything yet.
    pub(crate) fn new() -> Self {
        WindowsHost::default()
    }

    /// Sets each D3D12 graphics adapter's feature level: asked of D3D12, in a child process
    /// (`super::probe::feature_level_in_child`), once per LUID and driver version (not while a
    /// driver update is in progress), logged once; a failure leaves it absent.
    fn fill_feature_levels(&self, facts: &mut HostFacts) {
        let mut known = self
            .feature_levels
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        known.retain(|(luid, version), _| {
            facts
                .adapters
                .iter()
                .any(|a| a.luid == *luid && a.driver_version == *version)
        });
        for adapter in &mut facts.adapters {
            if !adapter.is_hardware
                || !adapter.has(Attribute::D3D12_GRAPHICS)
                || adapter.driver_update_in_progress
            {
                continue;
            }
            let key = (adapter.luid, adapter.driver_version.clone());
            let level = known.entry(key).or_insert_with(|| {
                let name = adapter.driver_description.as_str();
                let luid = dxdp_core::luid::label(adapter.luid);
                match feature_level(adapter.luid) {
                    Ok(level) => {
                        tracing::debug!("adapter {name:?} (LUID {luid}): D3D12 feature level {level}");
                        Some(level)
                    }
                    Err(why) => {
                        tracing::info!("adapter {name:?} (LUID {luid}): D3D12 feature level unknown, so no d3d12-feature-level label: {why}");
                        None
                    }
                }
            });
            adapter.d3d12_feature_level = level.clone();
        }
    }
}

impl HostFactsSource for WindowsHost {
    fn describe(&self) -> String {
        "this Windows host".into()
    }

    fn is_simulated(&self) -> bool {
        false
    }

    fn load(&self) -> Result<HostFacts, SourceError> {
        *self.attempted_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let (mut facts, session, node_errors, matches) = collect().map_err(|e| {
            SourceError::Unavailable(format!(
                "cannot enumerate DirectX adapters ({e}); DXCore needs Windows 10 build 18936 or later (Windows Server 2022 or later for containers)"
            ))
        })?;
        // Replacing the session unregisters the old notifications before releasing its objects.
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(session);
        let mut logged = self.node_errors.lock().unwrap_or_else(|p| p.into_inner());
        if *logged != node_errors {
            for e in &node_errors {
                tracing::warn!("device node enumeration: {e}");
            }
            *logged = node_errors;
        }
        drop(logged);
        let mut logged = self.matches.lock().unwrap_or_else(|p| p.into_inner());
        if *logged != matches {
            log_matches(&facts, &matches);
            *logged = matches;
        }
        drop(logged);
        self.fill_feature_levels(&mut facts);
        Ok(facts)
    }

    fn on_change(&self, wake: Wake) {
        dxcore::set_wake(wake);
    }

    fn changed(&self) -> bool {
        if dxcore::take_changed() {
            return true;
        }
        let stale = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(dxcore::Session::any_stale);
        let due = self
            .attempted_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|t| t.elapsed() >= HEALTH_POLL);
        stale || due
    }
}

/// Collects every fact the pipeline uses, with the device-node enumeration errors and how each
/// adapter was matched to its device node.
fn collect() -> Result<(HostFacts, dxcore::Session, Vec<String>, Vec<AdapterMatch>), WinError> {
    let mut os = os::read();
    let (mut adapters, session) = dxcore::enumerate()?;
    let nodes = devnodes::enumerate();
    // Logged by the caller (when they change); not attached to any adapter but by the rule below.
    let node_errors: Vec<String> = nodes
        .list_errors
        .iter()
        .chain(&nodes.unmatched_errors)
        .cloned()
        .collect();
    // The graphics kernel's PCI address of every adapter that may be hardware (software
    // adapters have no device node); a failure matters only if no node reports the LUID.
    let mut handles = Vec::with_capacity(adapters.len());
    let mut address_errors = Vec::with_capacity(adapters.len());
    for adapter in &mut adapters {
        let mut handle = None;
        let mut address_error = None;
        if adapter.is_hardware || adapter.unsupported(AdapterProperty::IsHardware) {
            match d3dkmt::Adapter::open(adapter.luid) {
                Ok(open) => {
                    match d3dkmt::adapter_address(&open) {
                        Ok(address) => adapter.adapter_address = Some(address),
                        Err(e) => address_error = Some(e.to_string()),
                    }
                    handle = Some(open);
                }
                Err(e) => address_error = Some(e.to_string()),
            }
        }
        handles.push(handle);
        address_errors.push(address_error);
    }
    os.device_nodes = nodes.nodes;
    let mut facts = HostFacts {
        os: Some(os),
        adapters,
        registry: Vec::new(),
        files: Vec::new(),
        faults: Vec::new(),
    };
    // The pipeline's own matching, to know which device node (driver key) is whose.
    let (attached, matches) = dxdp_core::pipeline::matching::attach(&facts);
    let driver_keys: Vec<Option<Option<String>>> = attached
        .adapters
        .iter()
        .map(|a| a.pnp.as_ref().map(|p| p.driver_key.clone()))
        .collect();
    drop(attached);
    let mut registry = Vec::new();
    for (i, adapter) in facts.adapters.iter_mut().enumerate() {
        let Some(driver_key) = &driver_keys[i] else {
            if adapter.is_hardware {
                // A device list that could not be read, or a missing PCI address, may be why
                // no node matched.
                adapter
                    .read_errors
                    .extend(nodes.list_errors.iter().cloned());
                adapter.read_errors.extend(address_errors[i].take());
            }
            // IsHardware unsupported and no device node: the pipeline treats it as software,
            // so its driver store and registry are not read.
            continue;
        };
        let store = match &handles[i] {
            Some(open) => d3dkmt::driver_store_path(open),
            None => d3dkmt::Adapter::open(adapter.luid).and_then(|o| d3dkmt::driver_store_path(&o)),
        };
        match store {
            Ok(path) => adapter.driver_store_path = Some(path),
            Err(e) => adapter.read_errors.push(e.to_string()),
        }
        let Some(driver_key) = driver_key else {
            continue;
        };
        for (subkey, _) in SUBKEYS {
            let relative = format!(
                r"{}\{driver_key}\{subkey}",
                CLASS_ROOT.trim_start_matches(r"HKLM\")
            );
            match registry::read_values(HKEY_LOCAL_MACHINE, &relative) {
                Ok(Some(values)) => registry.push(RegistryKey {
                    key: format!(r"HKLM\{relative}"),
                    values,
                }),
                Ok(None) => {}
                Err(e) => adapter.read_errors.push(e.to_string()),
            }
        }
    }
    drop(handles);
    facts.registry = registry;
    facts.files = dxdp_core::pipeline::runtime_files::candidate_host_paths(&facts)
        .into_iter()
        .filter(|p| Path::new(p).is_file())
        .collect();
    Ok((facts, session, node_errors, matches))
}

/// The feature level of the adapter `luid`, asked by this executable started as a feature-level
/// child: never in the daemon's own process (a D3D12 device maps the driver's user-mode DLLs,
/// and a hung or crashing driver must not stall discovery or end the daemon).
fn feature_level(luid: i64) -> Result<String, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot name dxdp's own executable to ask D3D12: {e}"))?;
    super::probe::feature_level_in_child(&exe, luid, super::probe::FEATURE_LEVEL_CHILD_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_existence_uses_real_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nvcuda_loader64.dll");
        std::fs::write(&file, b"MZ").unwrap();
        assert!(Path::new(&file.display().to_string()).is_file());
        assert!(!Path::new(&dir.path().join("missing.dll").display().to_string()).is_file());
    }

    #[test]
    fn a_failed_load_is_retried_at_the_health_poll_pace_not_on_every_tick() {
        // Under Wine DXCore is missing, so the load fails; asking right after must not say
        // "changed" (which made the daemon reload and log an error on every tick).
        let host = WindowsHost::new();
        assert!(host.changed(), "never loaded: due");
        if host.load().is_err() {
            assert!(!host.changed());
            assert!(!host.changed());
        }
    }

    #[test]
    fn loading_never_panics_where_dxcore_is_missing_or_incomplete() {
        // Under Wine DXCore is absent or a stub: the error must name what is missing.
        let host = WindowsHost::new();
        match host.load() {
            Ok(facts) => assert!(facts.os.is_some()),
            Err(e) => assert!(e.to_string().contains("DirectX adapters"), "{e}"),
        }
        let _ = host.changed();
    }
}
