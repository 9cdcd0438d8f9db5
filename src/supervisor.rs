//! The daemon's task supervisor: every long-lived task runs under it, and none can end or panic
//! unnoticed.
//!
//! A task that ends (it never should) or panics is logged with the reason, counted
//! (`dxdp_task_restarts_total`), and started again after a backoff (100 ms doubling to 30 s;
//! the count starts over once a task has run for [`HEALTHY_RUN`]). What else happens depends on
//! its [`Role`]:
//!
//! - [`Role::Required`] (device serving depends on it: the inventory refresher, the configuration
//!   reload): while it is down `/healthz` fails with the reason; after [`MAX_FAILURES`] failures
//!   without a healthy run in between, the daemon exits non-zero so that the kubelet restarts
//!   the pod.
//! - [`Role::Optional`] (metrics endpoint, node labels, following the node, device gauges):
//!   restarted for ever; it never fails `/healthz` and never stops the daemon.
//!
//! The device-plugin servers (socket, gRPC server and registration per served name) are kept by
//! `servers::Servers`, which restarts a server whose gRPC server or registration ends; the
//! supervisor loop itself is the daemon's main task.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::task::{Id, JoinSet};
use tokio::time::Instant;

use crate::observe::Observe;
use crate::util::retry::Backoff;
use crate::util::task::Task;

/// How much device serving depends on a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Device serving depends on it: `/healthz` fails while it is down, and the daemon exits
    /// non-zero when it keeps failing.
    Required,
    /// Nothing the kubelet needs depends on it: restarted for ever, never fatal.
    Optional,
}

impl Role {
    /// `required` or `optional`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Required => "required",
            Role::Optional => "optional",
        }
    }
}

/// A boxed task future.
pub(crate) type TaskFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Makes a task's future, for its first start and for every restart.
pub(crate) type Factory = Box<dyn FnMut() -> TaskFuture + Send + 'static>;

/// A task for the supervisor: its name (in logs, metrics and `/healthz`), role and factory.
pub(crate) struct TaskSpec {
    /// The task's name, e.g. `refresher`.
    pub(crate) name: &'static str,
    /// What depends on it.
    pub(crate) role: Role,
    /// Makes its future.
    pub(crate) factory: Factory,
}

impl std::fmt::Debug for TaskSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSpec")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish()
    }
}

impl TaskSpec {
    /// `task`, started from a clone of it on every (re)start.
    pub(crate) fn task(name: &'static str, role: Role, task: impl Task) -> Self {
        TaskSpec::new(name, role, move || task.clone().run())
    }

    /// A task made by `factory`.
    pub(crate) fn new<F, Fut>(name: &'static str, role: Role, mut factory: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        TaskSpec {
            name,
            role,
            factory: Box::new(move || Box::pin(factory())),
        }
    }
}

/// The first restart delay.
pub(crate) const RESTART_MIN: Duration = Duration::from_millis(100);
/// The longest restart delay.
pub(crate) const RESTART_MAX: Duration = Duration::from_secs(30);
/// A run this long resets a task's failure count.
pub(crate) const HEALTHY_RUN: Duration = Duration::from_secs(300);
/// Failures of a required task, without a healthy run between them, after which the daemon
/// exits (5 failures take about 1.5 s of backoff in all: a task that fails at once on every
/// start is not worth a node that looks alive).
pub(crate) const MAX_FAILURES: u32 = 5;

/// The delay before restart number `failures` (1 for the first).
pub(crate) fn restart_delay(failures: u32) -> Duration {
    Backoff::pauses(RESTART_MIN, RESTART_MAX).base(failures)
}

/// A required task kept failing: the daemon must stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {task} task failed {failures} times in a row (last: {reason}); exiting so that the kubelet restarts dxdp")]
pub struct Fatal {
    /// The task.
    pub(crate) task: &'static str,
    /// Its failures in a row.
    pub(crate) failures: u32,
    /// The last one.
    pub(crate) reason: String,
}

struct Slot {
    spec: TaskSpec,
    started: Instant,
    failures: u32,
    restart_at: Option<Instant>,
}

/// Runs and restarts the daemon's tasks.
pub(crate) struct Tasks {
    set: JoinSet<()>,
    slots: Vec<Slot>,
    running: HashMap<Id, usize>,
    observe: Observe,
}

impl Tasks {
    /// No tasks yet.
    pub(crate) fn new(observe: Observe) -> Self {
        Tasks {
            set: JoinSet::new(),
            slots: Vec::new(),
            running: HashMap::new(),
            observe,
        }
    }

    /// Starts `spec` now.
    pub(crate) fn spawn(&mut self, spec: TaskSpec) {
        self.observe.metrics.init_task(spec.name);
        self.slots.push(Slot {
            spec,
            started: Instant::now(),
            failures: 0,
            restart_at: None,
        });
        self.start(self.slots.len() - 1);
    }

    fn start(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.started = Instant::now();
        slot.restart_at = None;
        let future = (slot.spec.factory)();
        let handle = self.set.spawn(future);
        self.running.insert(handle.id(), index);
        self.observe.task_up(slot.spec.name);
    }

    /// Waits for the next thing to do and does it: restarts a task whose backoff is over, or
    /// handles a task that ended. Never returns while all is well (cancel-safe, for a
    /// `select!`); returns [`Fatal`] when a required task keeps failing.
    pub(crate) async fn run(&mut self) -> Fatal {
        loop {
            let next_restart = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.restart_at.map(|t| (t, i)))
                .min();
            let restart = async {
                match next_restart {
                    Some((t, i)) => {
                        tokio::time::sleep_until(t).await;
                        i
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                i = restart => {
                    tracing::info!(task = self.slots[i].spec.name, "restarting the task");
                    self.start(i);
                }
                Some(ended) = self.set.join_next_with_id() => {
                    let (id, reason) = match ended {
                        Ok(id) => (id.0, "it ended".to_string()),
                        Err(e) if e.is_panic() => (e.id(), format!("it panicked: {}", panic_text(e.into_panic()))),
                        Err(e) => (e.id(), format!("it was cancelled: {e}")),
                    };
                    if let Some(fatal) = self.ended(id, reason) {
                        return fatal;
                    }
                }
            }
        }
    }

    fn ended(&mut self, id: Id, reason: String) -> Option<Fatal> {
        let index = self.running.remove(&id)?;
        let slot = &mut self.slots[index];
        let name = slot.spec.name;
        if slot.started.elapsed() >= HEALTHY_RUN {
            slot.failures = 0;
        }
        slot.failures += 1;
        let delay = restart_delay(slot.failures);
        self.observe.metrics.task_restart(name);
        self.observe
            .task_down(name, slot.spec.role == Role::Required, &reason);
        if slot.spec.role == Role::Required && slot.failures >= MAX_FAILURES {
            tracing::error!(
                task = name,
                failures = slot.failures,
                "required task failed: {reason}; giving up"
            );
            return Some(Fatal {
                task: name,
                failures: slot.failures,
                reason,
            });
        }
        tracing::error!(
            task = name,
            role = slot.spec.role.as_str(),
            restart_in = ?delay,
            "task stopped unexpectedly: {reason}; restarting it"
        );
        slot.restart_at = Some(Instant::now() + delay);
        None
    }

    /// Stops every task (at the daemon's end).
    pub(crate) async fn shutdown(&mut self) {
        self.set.shutdown().await;
        self.running.clear();
    }
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn restart_delays_double_from_100_ms_to_30_s() {
        let ms = |n| restart_delay(n).as_millis();
        assert_eq!(
            [ms(1), ms(2), ms(3), ms(4), ms(9), ms(10), ms(40)],
            [100, 200, 400, 800, 25_600, 30_000, 30_000]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_optional_task_is_restarted_and_health_stays_ok() {
        let observe = Observe::new();
        let mut tasks = Tasks::new(observe.clone());
        let starts = Arc::new(AtomicU32::new(0));
        let s = starts.clone();
        tasks.spawn(TaskSpec::new("gauges", Role::Optional, move || {
            let n = s.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 3 {
                    panic!("boom {n}");
                }
                std::future::pending::<()>().await
            }
        }));
        let run = tokio::time::timeout(Duration::from_secs(60), tasks.run()).await;
        assert!(run.is_err(), "an optional task is never fatal: {run:?}");
        assert_eq!(starts.load(Ordering::SeqCst), 4);
        assert_eq!(observe.health.required_down(), None);
        let text = observe.metrics.encode();
        assert!(
            text.contains("dxdp_task_restarts_total{task=\"gauges\"} 3"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_required_task_down_fails_health_until_restarted_and_is_fatal_when_it_keeps_failing()
    {
        let observe = Observe::new();
        let mut tasks = Tasks::new(observe.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        tasks.spawn(TaskSpec::new("refresher", Role::Required, move || {
            let tx = tx.clone();
            async move {
                let _ = tx.send(());
                panic!("bad facts");
            }
        }));
        rx.recv().await.unwrap();
        // The first failure: down, with the reason, until restarted 100 ms later.
        let first = tokio::time::timeout(Duration::from_millis(50), tasks.run()).await;
        assert!(first.is_err());
        assert_eq!(
            observe.health.required_down(),
            Some("required task refresher is down: it panicked: bad facts; restarting".into())
        );
        let fatal = tokio::time::timeout(Duration::from_secs(60), tasks.run())
            .await
            .expect("fatal after five failures");
        assert_eq!(
            fatal,
            Fatal {
                task: "refresher",
                failures: 5,
                reason: "it panicked: bad facts".into()
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_task_is_up_again() {
        let observe = Observe::new();
        let mut tasks = Tasks::new(observe.clone());
        let starts = Arc::new(AtomicU32::new(0));
        let s = starts.clone();
        tasks.spawn(TaskSpec::new("reload", Role::Required, move || {
            let n = s.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    return;
                }
                std::future::pending::<()>().await
            }
        }));
        let _ = tokio::time::timeout(Duration::from_secs(1), tasks.run()).await;
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        assert_eq!(observe.health.required_down(), None);
    }
}
