//! The native Windows backend (DXCore, CfgMgr32, D3DKMT, registry, HCS).
//!
//! Not implemented in this version: every command on Windows needs `--host-snapshot` until it
//! lands. It is compiled and linted for `x86_64-pc-windows-gnu` in CI so the seam stays honest.

use super::{HostFactsSource, SourceError};
use crate::facts::HostFacts;

/// The facts of the Windows machine dxdp runs on.
#[derive(Debug, Clone, Copy, Default)]
pub struct WindowsHost;

impl HostFactsSource for WindowsHost {
    fn describe(&self) -> String {
        "this Windows host".into()
    }

    fn is_simulated(&self) -> bool {
        false
    }

    fn load(&self) -> Result<HostFacts, SourceError> {
        Err(SourceError::Unavailable(
            "the native Windows backend (DXCore, device nodes, driver store) is not part of this dxdp build yet; \
             pass --host-snapshot FILE (or set DXDP_HOST_SNAPSHOT) to use a host snapshot"
                .into(),
        ))
    }
}
