//! Small utilities shared across the layers: retry backoff ([`retry`]), error text
//! (`errors`), reading files that may be mid-write (`stable_read`), blocking work with a
//! time limit ([`bounded`]), what a file or directory is whatever it is called (`file_id`) and
//! where a HostProcess container's volumes are ([`host_process`]), who may change the host files
//! dxdp trusts (`host_acl`), the one shape of a
//! long-lived task ([`task`]) and an optional deadline (`sleep_until`).
//! Nothing here knows of the kubelet, the cluster or the configuration.

pub mod bounded;
pub(crate) mod errors;
pub(crate) mod file_id;
pub(crate) mod host_acl;
pub mod host_process;
pub mod retry;
pub(crate) mod stable_read;
pub mod task;

/// Waits until `at`, or for ever without one: an optional deadline as one branch of a
/// `tokio::select!` (a retry, a planned step, the end of a grace period).
pub(crate) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Whether the tests run under Wine (its ntdll exports `wine_get_version`): a test of something
/// Wine lacks says so and skips only there.
#[cfg(all(test, windows))]
pub(crate) fn under_wine() -> bool {
    use windows::Win32::System::LibraryLoader::{GetModuleHandleW, GetProcAddress};
    // SAFETY: ntdll is loaded in every process; both names are NUL-terminated literals.
    unsafe {
        GetModuleHandleW(windows::core::w!("ntdll.dll"))
            .ok()
            .and_then(|m| GetProcAddress(m, windows::core::s!("wine_get_version")))
            .is_some()
    }
}
