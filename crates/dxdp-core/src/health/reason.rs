//! The health reasons: `healthy` and one per fault signal, with stable names.

use std::fmt;

use schemars::JsonSchema;
use serde::Serialize;

/// Why a device has its health: `healthy`, or the signal that made it Unhealthy. The names are
/// stable (metrics labels, logs, `discover --json`, configuration keys).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Nothing is wrong.
    #[default]
    Healthy,
    /// The device node reports a problem code (Device Manager's "Code 43" and friends).
    ProblemCode,
    /// The device node's status cannot be read, so the device is not trusted.
    StatusUnreadable,
    /// Windows is updating the adapter's driver.
    DriverUpdate,
    /// The adapter left the host (DXCore no longer lists it, or its device node was removed)
    /// while a pod still holds it.
    Removed,
    /// The display driver stopped responding and was reset (TDR; System log, `Display` 4101).
    Tdr,
    /// Windows Error Reporting filed a live kernel report of a display timeout
    /// (`LiveKernelEvent` 117 or 141; Application log, `Windows Error Reporting` 1001).
    LiveKernelEvent,
    /// The GPU is near or over its warning temperature (where throttling begins), or NVML
    /// names a thermal or power-brake reason for holding its clocks down.
    Thermal,
    /// A pod container uses the GPU without having been allocated it, and `isolation.policy` is
    /// `withdraw`: no signal of the catalogue, so not in [`Reason::ALL`].
    IsolationViolation,
}

impl Reason {
    /// Every reason a health signal gives, `healthy` first (the signals are the rest);
    /// [`Reason::IsolationViolation`] comes from the isolation policy and is not among them.
    pub const ALL: [Reason; 8] = [
        Reason::Healthy,
        Reason::ProblemCode,
        Reason::StatusUnreadable,
        Reason::DriverUpdate,
        Reason::Removed,
        Reason::Tdr,
        Reason::LiveKernelEvent,
        Reason::Thermal,
    ];

    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Healthy => "healthy",
            Reason::ProblemCode => "problem_code",
            Reason::StatusUnreadable => "status_unreadable",
            Reason::DriverUpdate => "driver_update",
            Reason::Removed => "removed",
            Reason::Tdr => "tdr",
            Reason::LiveKernelEvent => "live_kernel_event",
            Reason::Thermal => "thermal",
            Reason::IsolationViolation => "isolation_violation",
        }
    }

    /// The signal named `name` (not `healthy`, which is no signal).
    pub fn signal_named(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().skip(1).find(|r| r.as_str() == name)
    }

    /// Whether the signal is a condition of the device (it lasts as long as the condition does)
    /// rather than an event (a moment in the event log).
    pub fn is_condition(self) -> bool {
        matches!(
            self,
            Reason::ProblemCode
                | Reason::StatusUnreadable
                | Reason::DriverUpdate
                | Reason::Removed
                | Reason::Thermal
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
