//! Whether a configuration can be served on this host: the one check for the start and for
//! every reload, so that nothing refused at start is ever applied later.

use std::collections::BTreeSet;
use std::path::Path;

use dxdp_core::assignment::{supports_location_path, Assignment};
use dxdp_core::facts::OsFacts;

use super::claim::socket_file_name;
use crate::config::Config;
use crate::transport;

/// Why a configuration cannot be served. A reload that hits one of these is rejected whole.
#[derive(Debug, thiserror::Error)]
pub enum Unservable {
    /// No resource is enabled.
    #[error("no resources to serve: enable display, compute or both")]
    NoResources,
    /// One name is served twice.
    #[error("resource name {0} is served twice: each name in resources.*.name and resources.*.aliases must be unique")]
    Duplicate(String),
    /// A socket path does not fit in `sun_path`.
    #[error(transparent)]
    SocketPath(#[from] transport::SocketPathTooLong),
    /// The configured assignment cannot work on this host.
    #[error("assignment location-path needs HCS schema 2.2 or later (Windows Server 2022+), and this host has {schema}: every container start would fail. Use assignment auto (class-guid here, every container then gets every GPU) or class-guid")]
    Assignment {
        /// The host's schema versions.
        schema: String,
    },
}

/// Checks that `config` can be served from `kubelet_dir` on a host with `os`: something
/// enabled, every name once, every socket path short enough, and an explicit `location-path`
/// assignment only where HCS supports it (a host that reports no HCS schema is not judged).
pub(crate) fn check(config: &Config, kubelet_dir: &Path, os: &OsFacts) -> Result<(), Unservable> {
    let endpoints = crate::inventory::endpoints(config);
    if endpoints.is_empty() {
        return Err(Unservable::NoResources);
    }
    let mut seen = BTreeSet::new();
    for (_, name) in &endpoints {
        if !seen.insert(name.as_str()) {
            return Err(Unservable::Duplicate(name.clone()));
        }
        // The longest name this resource's sockets can get.
        transport::check_socket_path(
            &kubelet_dir.join(socket_file_name(name, u128::from(u64::MAX))),
        )?;
    }
    if config.assignment == Assignment::LocationPath
        && !os.hcs_schema_versions.is_empty()
        && !supports_location_path(os)
    {
        return Err(Unservable::Assignment {
            schema: os.hcs_schema_versions.join(", "),
        });
    }
    Ok(())
}
