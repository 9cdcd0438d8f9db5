//! The one shape of a long-lived task of the daemon ([`Task`]), which the supervisor starts and
//! restarts (`supervisor::TaskSpec::task`).

use std::future::Future;

/// A long-lived task of the daemon: a value holding everything it reads (channels, clients,
/// settings, by name), run from a clone on its first start and on every restart. Every feature
/// contributes its tasks in this one shape (`supervisor::TaskSpec::task`).
pub trait Task: Clone + Send + 'static {
    /// Runs until the daemon stops it; returning (or panicking) has the supervisor restart it.
    fn run(self) -> impl Future<Output = ()> + Send + 'static;
}
