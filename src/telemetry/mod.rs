//! GPU telemetry: reads the GPU performance counters on an interval, joins them with the
//! containers' processes (HCS), their pods (the runtime's CRI) and the kubelet's PodResources
//! answer, and publishes per-device and per-pod figures on `/metrics`.
//!
//! - the counter source: where counter samples come from (a host snapshot's recorded samples, or PDH on
//!   Windows): the backend's [`crate::backend::counters`];
//! - [`sampler`]: the sampling task ([`sampler::run`]: runs until cancelled, never fails, retries
//!   with backoff) and one sampling step for `dxdp top`;
//! - [`top`]: the table `dxdp top` prints, and the figures read back from a daemon's `/metrics`;
//! - [`audit`]: the isolation audit's tracker (starts and ends of violations, logged once,
//!   counted and published for the Kubernetes side) and `dxdp audit`'s table;
//! - `podinfo`: the `dxdp_pod_info` series (opt-in pod UID and labels, from CRI).
//!
//! The computation itself is pure and lives in `dxdp_core::telemetry`.

pub mod audit;
pub(crate) mod podinfo;
pub mod sampler;
pub mod top;
