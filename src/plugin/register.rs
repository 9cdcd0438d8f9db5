//! Registration with the kubelet: one `Register` call per served name, retried with capped
//! exponential backoff and jitter until it succeeds, in its own task so that the supervisor keeps
//! watching while a registration hangs or fails.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use crate::kubelet::v1beta1::registration_client::RegistrationClient;
use crate::kubelet::v1beta1::RegisterRequest;
use crate::kubelet::API_VERSION;
use crate::transport::Transport;

use super::service;

use crate::util::errors::chain;
use crate::util::retry::{random, Backoff};

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    /// The kubelet's socket could not be reached.
    #[error("cannot connect to the kubelet at {}: {}", path.display(), chain(error))]
    Connect {
        /// `kubelet.sock`.
        path: std::path::PathBuf,
        /// What went wrong (its causes are in the message, not repeated as a source).
        error: tonic::transport::Error,
    },
    /// The kubelet answered with an error.
    #[error("the kubelet refused: {}", .0.message())]
    Refused(tonic::Status),
    /// The kubelet did not answer in time.
    #[error("the kubelet did not answer within {0:?}")]
    Timeout(Duration),
}

/// Registers `resource_name` served at `endpoint` (a file name in the kubelet's directory).
pub(crate) async fn register(
    transport: Transport,
    kubelet_sock: &Path,
    endpoint: &str,
    resource_name: &str,
    timeout: Duration,
) -> Result<(), RegisterError> {
    let call = async {
        let channel =
            transport
                .channel(kubelet_sock)
                .await
                .map_err(|error| RegisterError::Connect {
                    path: kubelet_sock.to_path_buf(),
                    error,
                })?;
        let request = RegisterRequest {
            version: API_VERSION.to_string(),
            endpoint: endpoint.to_string(),
            resource_name: resource_name.to_string(),
            options: Some(service::options()),
        };
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(RegisterError::Refused)?;
        Ok(())
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| RegisterError::Timeout(timeout))?
}

/// The pause between attempts while the kubelet's socket exists but nothing accepts on it yet
/// (the kubelet is starting): short, so that registration follows within a few milliseconds of
/// the kubelet listening.
pub(crate) const FAST_RETRY: Duration = Duration::from_millis(10);
/// The first of those pauses, doubling up to [`FAST_RETRY`] (1, 2, 4, 8, then 10 ms): a
/// kubelet's socket file appears when it binds, a moment before it listens, so the attempt that
/// the file's event starts can be refused by a kubelet that accepts a few microseconds later
/// (measured: 1-2 % of 300 kubelet restarts then waited a whole 10 ms pause, BENCHMARKS.md).
pub(crate) const FAST_FIRST: Duration = Duration::from_millis(1);
/// How long after the first attempt connection failures are retried fast ([`FAST_FIRST`] up to
/// [`FAST_RETRY`]);
/// after that, and for every other failure, the backoff applies.
pub(crate) const FAST_WINDOW: Duration = Duration::from_secs(2);

/// Calls `attempt` until it succeeds and reports every outcome to `report` (the attempt's number
/// from 1, its result, and the pause before the next attempt). While the kubelet cannot be
/// connected to within [`FAST_WINDOW`] of the first attempt, the pause is [`FAST_FIRST`],
/// doubling up to [`FAST_RETRY`];
/// otherwise it is [`Backoff::delay`], counted over the failures that were not fast retries.
pub(crate) async fn until_registered<A, F>(
    backoff: Backoff,
    mut attempt: A,
    mut report: impl FnMut(u32, &Result<(), RegisterError>, Option<Duration>),
) where
    A: FnMut() -> F,
    F: Future<Output = Result<(), RegisterError>>,
{
    let started = tokio::time::Instant::now();
    let mut attempts = 0u32;
    let mut slow_failures = 0u32;
    let mut fast_failures = 0u32;
    loop {
        let result = attempt().await;
        attempts = attempts.saturating_add(1);
        if result.is_ok() {
            report(attempts, &result, None);
            return;
        }
        let connecting = matches!(result, Err(RegisterError::Connect { .. }));
        let delay = if connecting && started.elapsed() < FAST_WINDOW {
            let doublings = fast_failures.min(4);
            fast_failures = fast_failures.saturating_add(1);
            (FAST_FIRST * (1 << doublings)).min(FAST_RETRY)
        } else {
            slow_failures = slow_failures.saturating_add(1);
            backoff.delay(slow_failures, random())
        };
        report(attempts, &result, Some(delay));
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    const B: Backoff = Backoff {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(30),
        timeout: Duration::from_secs(30),
    };

    #[test]
    fn base_delay_doubles_up_to_the_cap() {
        let expected_ms = [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000];
        for (i, ms) in expected_ms.iter().enumerate() {
            assert_eq!(
                B.base(i as u32 + 1),
                Duration::from_millis(*ms),
                "retry {}",
                i + 1
            );
        }
        assert_eq!(B.base(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn jitter_stays_between_half_and_the_whole_base_delay() {
        for failures in 1..10 {
            let base = B.base(failures);
            for random in [0, 1, u64::MAX, 0x1234_5678_9abc_def0, random()] {
                let d = B.delay(failures, random);
                assert!(d >= base / 2 && d <= base, "{failures} {random}: {d:?}");
            }
        }
        assert_eq!(B.delay(1, 0), Duration::from_millis(250));
        assert_eq!(
            B.delay(1, 250_000_000),
            Duration::from_millis(500),
            "the top of the range is reachable"
        );
    }

    #[test]
    fn two_processes_do_not_retry_in_lockstep() {
        // RandomState keys differ per instance, so draws differ (a collision of 64-bit values
        // in eight draws would be astronomically unlikely).
        let draws: std::collections::BTreeSet<u64> = (0..8).map(|_| random()).collect();
        assert!(draws.len() > 1);
    }

    #[test]
    fn errors_name_the_socket_and_print_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::new(std::io::ErrorKind::NotFound, "gone"));
        assert_eq!(chain(&e), "outer: gone");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_backoff_until_the_kubelet_accepts() {
        let start = Instant::now();
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = attempts.clone();
        let mut reports = Vec::new();
        until_registered(
            B,
            || {
                let seen = seen.clone();
                async move {
                    let mut at = seen.lock().unwrap();
                    at.push(Instant::now());
                    if at.len() < 5 {
                        Err(RegisterError::Timeout(Duration::ZERO))
                    } else {
                        Ok(())
                    }
                }
            },
            |n, r, delay| reports.push((n, r.is_ok(), delay)),
        )
        .await;
        let at = attempts.lock().unwrap();
        assert_eq!(at.len(), 5, "stops after the first success");
        for i in 1..at.len() {
            let gap = at[i] - at[i - 1];
            let base = Duration::from_millis(500 * (1 << (i - 1)));
            assert!(
                gap >= base / 2 && gap <= base,
                "gap {i}: {gap:?} vs base {base:?}"
            );
        }
        assert!(at[4] - start <= Duration::from_millis(500 + 1000 + 2000 + 4000));
        assert_eq!(reports.len(), 5);
        assert_eq!(reports.last().map(|r| r.1), Some(true));
        assert!(reports[..4].iter().all(|r| !r.1 && r.2.is_some()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_kubelet_that_does_not_accept_yet_is_retried_every_10_ms_for_2_s_then_backed_off() {
        let start = Instant::now();
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = attempts.clone();
        let mut delays = Vec::new();
        until_registered(
            B,
            || {
                let seen = seen.clone();
                async move {
                    let n = {
                        let mut at = seen.lock().unwrap();
                        at.push(Instant::now() - start);
                        at.len()
                    };
                    if n < 207 {
                        Err(RegisterError::Connect {
                            path: "/k/kubelet.sock".into(),
                            error: refused().await,
                        })
                    } else {
                        Ok(())
                    }
                }
            },
            |_, _, delay| delays.extend(delay),
        )
        .await;
        // Attempts at 0, 1, 3 and 7 ms, then 10 ms apart (15 ms .. 1995 ms) fill the 2 s
        // window: 203 fast pauses; then the backoff: 250-500 ms, 500-1000 ms, 1-2 s.
        let ms = Duration::from_millis;
        assert_eq!(delays[..4], [ms(1), ms(2), ms(4), ms(8)]);
        assert_eq!(delays[4..203], [ms(10); 199]);
        let slow = &delays[203..];
        assert_eq!(slow.len(), 3);
        for (d, base) in slow.iter().zip([500, 1000, 2000]) {
            let base = Duration::from_millis(base);
            assert!(*d >= base / 2 && *d <= base, "{d:?} vs {base:?}");
        }
        // A refusal by a listening kubelet is never retried fast.
        let mut delays = Vec::new();
        let mut n = 0;
        until_registered(
            B,
            || {
                n += 1;
                let fail = n < 2;
                async move {
                    if fail {
                        Err(RegisterError::Refused(tonic::Status::invalid_argument(
                            "no",
                        )))
                    } else {
                        Ok(())
                    }
                }
            },
            |_, _, delay| delays.extend(delay),
        )
        .await;
        assert_eq!(delays.len(), 1);
        assert!(delays[0] >= Duration::from_millis(250), "{delays:?}");
    }

    /// A real connection error (nothing listens at that path).
    async fn refused() -> tonic::transport::Error {
        let dir = tempfile::tempdir().unwrap();
        Transport::UnixSocket
            .channel(&dir.path().join("none.sock"))
            .await
            .unwrap_err()
    }
}
