//! Blocking work with a time limit: the one way the daemon reads host files and host facts
//! (the host snapshot, the Windows host scan, the configuration files).
//!
//! `run_blocking` runs a blocking closure on tokio's blocking threads ([`run_thread`] on a
//! thread of its own, before the async runtime exists) and waits for it at most a given time; past it the caller gets [`Overdue::TimedOut`], naming what timed out,
//! and goes on (the thread cannot be stopped: it is left to finish on its own). `Lane` is the
//! same for a caller that reads the same thing again and again (the refresher, the
//! configuration reload): while an earlier call that timed out has still not returned, it starts
//! no second one ([`Overdue::StillRunning`]), so a hung file system or driver costs one thread,
//! never one per retry, and it can wait for the hung call to return.

use std::time::Duration;

use tokio::task::JoinHandle;

/// Why blocking work gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Overdue {
    /// It did not return within its limit.
    #[error("{what} did not finish within {} (a hung file system, device or driver?); it is left running", secs(*.limit))]
    TimedOut {
        /// What was done (`reading host snapshot /x.yaml`).
        what: String,
        /// The limit.
        limit: Duration,
    },
    /// An earlier call that timed out has still not returned: no new one was started.
    #[error("{what} has still not returned (it did not finish within {}); not starting another until it does", secs(*.limit))]
    StillRunning {
        /// What is done.
        what: String,
        /// The limit the earlier call did not keep.
        limit: Duration,
    },
    /// It panicked.
    #[error("{what} failed: {message}")]
    Panicked {
        /// What was done.
        what: String,
        /// The panic.
        message: String,
    },
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 && s.fract() == 0.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Runs `f` on a blocking thread and waits at most `limit` for it. `what` names the work in the
/// error (`reading host snapshot /x.yaml`). Past the limit the thread is left running and its
/// result dropped.
pub(crate) async fn run_blocking<T, F>(limit: Duration, what: &str, f: F) -> Result<T, Overdue>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let mut handle = tokio::task::spawn_blocking(f);
    wait(&mut handle, limit, what).await
}

async fn wait<T>(handle: &mut JoinHandle<T>, limit: Duration, what: &str) -> Result<T, Overdue> {
    match tokio::time::timeout(limit, handle).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Overdue::Panicked {
            what: what.to_string(),
            message: e.to_string(),
        }),
        Err(_) => Err(Overdue::TimedOut {
            what: what.to_string(),
            limit,
        }),
    }
}

/// `run_blocking` for code that has no async runtime yet (the configuration read before the
/// daemon starts): `f` runs on a thread of its own, left running past `limit`.
pub fn run_thread<T, F>(limit: Duration, what: &str, f: F) -> Result<T, Overdue>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("dxdp-read".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if let Err(e) = spawned {
        return Err(Overdue::Panicked {
            what: what.to_string(),
            message: format!("cannot start a thread: {e}"),
        });
    }
    match rx.recv_timeout(limit) {
        Ok(v) => Ok(v),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Overdue::TimedOut {
            what: what.to_string(),
            limit,
        }),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Overdue::Panicked {
            what: what.to_string(),
            message: "it panicked".into(),
        }),
    }
}

/// Blocking calls of one kind, one at a time, each with a time limit (see the module
/// documentation).
#[derive(Debug)]
pub(crate) struct Lane<T> {
    what: String,
    limit: Duration,
    /// The call that timed out and has not returned yet.
    stuck: Option<JoinHandle<T>>,
}

impl<T: Send + 'static> Lane<T> {
    /// Calls described by `what`, each given `limit`.
    pub(crate) fn new(what: impl Into<String>, limit: Duration) -> Self {
        Lane {
            what: what.into(),
            limit,
            stuck: None,
        }
    }

    /// What the calls do.
    pub(crate) fn what(&self) -> &str {
        &self.what
    }

    /// Runs `f` as [`run_blocking`] does, unless an earlier call that timed out still runs.
    pub(crate) async fn run<F>(&mut self, f: F) -> Result<T, Overdue>
    where
        F: FnOnce() -> T + Send + 'static,
    {
        if let Some(handle) = &self.stuck {
            if !handle.is_finished() {
                return Err(Overdue::StillRunning {
                    what: self.what.clone(),
                    limit: self.limit,
                });
            }
            self.stuck = None;
        }
        let mut handle = tokio::task::spawn_blocking(f);
        let result = wait(&mut handle, self.limit, &self.what).await;
        if matches!(result, Err(Overdue::TimedOut { .. })) {
            self.stuck = Some(handle);
        }
        result
    }

    /// Whether a call that timed out has still not returned.
    pub(crate) fn is_stuck(&self) -> bool {
        self.stuck.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Waits until the call that timed out returns (its result is dropped: it may be stale);
    /// never returns while there is none. Cancel-safe.
    pub(crate) async fn unstuck(&mut self) {
        match &mut self.stuck {
            Some(handle) => {
                let _ = handle.await;
                self.stuck = None;
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[tokio::test]
    async fn a_call_within_its_limit_gives_its_result() {
        let got = run_blocking(Duration::from_secs(30), "adding", || 2 + 2).await;
        assert_eq!(got, Ok(4));
    }

    #[tokio::test]
    async fn a_call_that_never_returns_times_out_naming_what_it_did() {
        let (_release, blocked) = mpsc::channel::<()>();
        let got = run_blocking(
            Duration::from_millis(50),
            "reading host snapshot /x.yaml",
            move || {
                let _ = blocked.recv();
            },
        )
        .await;
        assert_eq!(
            got.unwrap_err().to_string(),
            "reading host snapshot /x.yaml did not finish within 50 ms (a hung file system, device or driver?); it is left running"
        );
    }

    #[tokio::test]
    async fn a_panic_is_an_error() {
        let got = run_blocking(Duration::from_secs(30), "reading", || -> u32 {
            panic!("boom")
        })
        .await;
        assert!(
            matches!(&got, Err(Overdue::Panicked { what, .. }) if what == "reading"),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn a_lane_starts_no_second_call_while_a_timed_out_one_runs() {
        let mut lane = Lane::new("reading the configuration", Duration::from_millis(50));
        let (release, blocked) = mpsc::channel::<()>();
        let first = lane
            .run(move || {
                let _ = blocked.recv();
                1
            })
            .await;
        assert!(matches!(first, Err(Overdue::TimedOut { .. })), "{first:?}");
        assert!(lane.is_stuck());
        let second = lane.run(|| 2).await;
        assert!(
            matches!(&second, Err(Overdue::StillRunning { what, .. }) if what == "reading the configuration"),
            "{second:?}"
        );
        release.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), lane.unstuck())
            .await
            .expect("the released call returns");
        assert!(!lane.is_stuck());
        assert_eq!(lane.run(|| 3).await, Ok(3));
    }

    #[test]
    fn a_thread_that_never_returns_times_out_and_one_that_does_gives_its_result() {
        assert_eq!(
            run_thread(Duration::from_secs(30), "adding", || 2 + 2),
            Ok(4)
        );
        let (_release, blocked) = mpsc::channel::<()>();
        let got = run_thread(
            Duration::from_millis(50),
            "reading the configuration",
            move || {
                let _ = blocked.recv();
            },
        );
        assert_eq!(
            got,
            Err(Overdue::TimedOut {
                what: "reading the configuration".into(),
                limit: Duration::from_millis(50)
            })
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(secs(Duration::from_secs(30)), "30 s");
        assert_eq!(secs(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(secs(Duration::from_millis(200)), "200 ms");
    }
}
