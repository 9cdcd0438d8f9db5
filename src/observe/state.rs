//! What `/healthz` and `/readyz` answer: the daemon's liveness (its supervisor answers, it
//! finished starting within its start deadline, no host read is hung past its time limit) and
//! readiness (every served resource name is registered with the current kubelet and, when
//! `health::capacity` checks it, the Node shows the capacity: [`Capacity`]), with the reason
//! when not.
//!
//! The supervisor reports what happens (kubelet missing, a device-plugin server started, a
//! registration outcome, a server stopped); every report carries the server's generation, so
//! that a late report of a server already replaced (after a kubelet restart) cannot make the
//! daemon look ready.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

/// Where the daemon is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Checking the configuration and collecting host facts.
    #[default]
    Starting,
    /// The supervisor loop runs.
    Running,
    /// The daemon stopped (or failed).
    Stopped,
}

/// How one served name stands with the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Standing {
    /// Its server could not listen.
    NotListening(String),
    /// Listening; the first Register call is under way.
    Registering,
    /// Registered with the current kubelet, which has not (or no longer) a `ListAndWatch`
    /// stream open.
    Registered,
    /// Registered, and the kubelet watches the device list.
    Watched,
    /// The last Register call failed; retrying.
    Failed(String),
}

/// Whether `/readyz` also waits for the Node to show the served resources as allocatable
/// (set by `health::capacity`, which follows the Node).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Capacity {
    /// Not checked and nothing to say (nobody set it: tests, tools).
    #[default]
    Unset,
    /// Not checked, for this reason (no API server client): `/readyz` keeps its meaning and
    /// says so in its body.
    NotChecked(String),
    /// Checked: `Ok` when the Node's `status.allocatable` shows every served resource that has
    /// healthy devices, otherwise why not.
    Checked(Result<(), String>),
}

#[derive(Debug, Default)]
struct State {
    phase: Phase,
    /// The Node's allocatable capacity (checked after every name is registered and watched).
    capacity: Capacity,
    /// `kubelet.sock`, while it does not exist.
    kubelet_missing: Option<String>,
    /// The served names, in the order they are served.
    wanted: Vec<String>,
    /// Each name's server generation (0 when it has none) and standing.
    servers: BTreeMap<String, (u64, Standing)>,
    /// Why the daemon serves the last-served configuration kept on the host instead of the
    /// configured one (rejected at start), until a valid one is read.
    config_fallback: Option<String>,
}

/// Whether every served name is registered with the kubelet. Clones share the state.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    state: Arc<Mutex<State>>,
    /// Bumped after every change of the state.
    changed: Arc<tokio::sync::watch::Sender<()>>,
}

/// Bumps the change signal when the state's lock is released.
struct Changing<'a> {
    guard: MutexGuard<'a, State>,
    changed: &'a tokio::sync::watch::Sender<()>,
}

impl std::ops::Deref for Changing<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for Changing<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        self.changed.send_replace(());
    }
}

impl Readiness {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state, to change it: waiters on [`Readiness::changes`] wake afterwards.
    fn change(&self) -> Changing<'_> {
        Changing {
            guard: self.lock(),
            changed: &self.changed,
        }
    }

    /// Wakes after every change of the readiness (to wait for it without polling).
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// `Ok` when ready; otherwise why not, one reason per line cause joined with `; `.
    pub fn check(&self) -> Result<(), String> {
        let s = self.lock();
        match s.phase {
            Phase::Starting => {
                return Err("starting: checking the configuration and collecting host facts".into())
            }
            Phase::Stopped => return Err("the device plugin stopped".into()),
            Phase::Running => {}
        }
        if let Some(why) = &s.config_fallback {
            return Err(why.clone());
        }
        if let Some(sock) = &s.kubelet_missing {
            return Err(format!("waiting for the kubelet: {sock} does not exist"));
        }
        let reasons: Vec<String> = s
            .wanted
            .iter()
            .filter_map(|name| match s.servers.get(name).map(|(_, st)| st) {
                Some(Standing::Watched) => None,
                Some(Standing::Registered) => Some(format!(
                    "{name}: registered; waiting for the kubelet to watch the device list"
                )),
                Some(Standing::Registering) => {
                    Some(format!("{name}: registering with the kubelet"))
                }
                Some(Standing::Failed(e)) => {
                    Some(format!("{name}: registration failed: {e}, retrying"))
                }
                Some(Standing::NotListening(e)) => Some(format!("{name}: {e}, retrying")),
                None => Some(format!("{name}: not serving yet")),
            })
            .collect();
        if !reasons.is_empty() {
            return Err(reasons.join("; "));
        }
        match &s.capacity {
            Capacity::Checked(Err(why)) => Err(why.clone()),
            _ => Ok(()),
        }
    }

    /// What `/readyz` adds to `ok` (why the Node's capacity is not checked), if anything.
    pub(crate) fn note(&self) -> Option<String> {
        match &self.lock().capacity {
            Capacity::NotChecked(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Sets whether, and how, the Node's allocatable capacity counts (`health::capacity`).
    pub fn set_capacity(&self, capacity: Capacity) {
        if self.lock().capacity == capacity {
            return;
        }
        self.change().capacity = capacity;
    }

    /// The served names and those of them registered with the current kubelet.
    pub(crate) fn registered(&self) -> (Vec<String>, Vec<String>) {
        let s = self.lock();
        let registered = s
            .wanted
            .iter()
            .filter(|n| {
                s.kubelet_missing.is_none()
                    && matches!(
                        s.servers.get(*n),
                        Some((_, Standing::Registered | Standing::Watched))
                    )
            })
            .cloned()
            .collect();
        (s.wanted.clone(), registered)
    }

    /// Sets the phase.
    pub(crate) fn set_phase(&self, phase: Phase) {
        self.change().phase = phase;
    }

    /// The daemon serves the last-served configuration for this reason (`Some`: `/readyz` fails
    /// with it), or the configured one (`None`).
    pub(crate) fn set_config_fallback(&self, why: Option<String>) {
        if self.lock().config_fallback == why {
            return;
        }
        self.change().config_fallback = why;
    }

    /// Sets the served names (forgetting servers of other names).
    pub(crate) fn set_wanted(&self, names: Vec<String>) {
        let mut s = self.change();
        s.servers.retain(|n, _| names.contains(n));
        s.wanted = names;
    }

    /// `kubelet.sock` does not exist (`Some`) or does (`None`).
    pub(crate) fn set_kubelet_missing(&self, socket: Option<&Path>) {
        self.change().kubelet_missing = socket.map(|p| p.display().to_string());
    }

    /// A server of `name` with `generation` listens and registers.
    pub(crate) fn server_started(&self, name: &str, generation: u64) {
        self.change()
            .servers
            .insert(name.to_string(), (generation, Standing::Registering));
    }

    /// A server of `name` could not listen.
    pub(crate) fn server_not_listening(&self, name: &str, why: String) {
        self.change()
            .servers
            .insert(name.to_string(), (0, Standing::NotListening(why)));
    }

    /// The server of `name` with `generation` stopped.
    pub(crate) fn server_stopped(&self, name: &str, generation: u64) {
        let mut s = self.change();
        if s.servers.get(name).is_some_and(|(g, _)| *g == generation) {
            s.servers.remove(name);
        }
    }

    /// The kubelet opened (`true`) or closed every (`false`) `ListAndWatch` stream of the server
    /// `generation` of `name`, which it registered.
    pub(crate) fn watching(&self, name: &str, generation: u64, watching: bool) {
        let mut s = self.change();
        if let Some((g, standing)) = s.servers.get_mut(name) {
            if *g == generation && matches!(standing, Standing::Registered | Standing::Watched) {
                *standing = if watching {
                    Standing::Watched
                } else {
                    Standing::Registered
                };
            }
        }
    }

    /// A Register call of the server `generation` of `name` ended with `result`. Returns whether
    /// it concerned the current server (a late report of a replaced server changes nothing).
    pub(crate) fn registration(
        &self,
        name: &str,
        generation: u64,
        result: Result<(), String>,
    ) -> bool {
        let mut s = self.change();
        match s.servers.get_mut(name) {
            Some((g, standing)) if *g == generation => {
                *standing = match result {
                    Ok(()) => Standing::Registered,
                    Err(e) => Standing::Failed(e),
                };
                true
            }
            _ => false,
        }
    }
}

/// A request to the supervisor to show it is alive: it answers on the sender.
pub(crate) type Ping = oneshot::Sender<()>;

/// How long `/healthz` waits for the supervisor to answer.
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The start: since when, its deadline, and what it is doing.
#[derive(Debug)]
struct Start {
    since: Instant,
    deadline: Duration,
    step: String,
}

#[derive(Debug)]
struct HealthInner {
    phase: AtomicU8,
    /// Required tasks that are down, with why.
    down: Mutex<BTreeMap<String, String>>,
    /// Blocking reads that did not return within their time limit, with why.
    stalled: Mutex<BTreeMap<String, String>>,
    /// The start's deadline, once the daemon set one.
    start: Mutex<Option<Start>>,
    pings: mpsc::Sender<Ping>,
    receiver: Mutex<Option<mpsc::Receiver<Ping>>>,
}

/// Whether the daemon's supervisor is alive. Clones share the state.
#[derive(Debug, Clone)]
pub struct Health {
    inner: Arc<HealthInner>,
}

impl Default for Health {
    fn default() -> Self {
        let (pings, receiver) = mpsc::channel(16);
        Health {
            inner: Arc::new(HealthInner {
                phase: AtomicU8::new(0),
                down: Mutex::default(),
                stalled: Mutex::default(),
                start: Mutex::default(),
                pings,
                receiver: Mutex::new(Some(receiver)),
            }),
        }
    }
}

impl Health {
    /// The pings to answer, for the supervisor (once: later calls get `None`).
    pub(crate) fn take_pings(&self) -> Option<mpsc::Receiver<Ping>> {
        self.inner
            .receiver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The required task `name` is down for `reason` (until [`Health::task_up`]).
    pub(crate) fn task_down(&self, name: &str, reason: &str) {
        self.down().insert(name.to_string(), reason.to_string());
    }

    /// The task `name` runs.
    pub(crate) fn task_up(&self, name: &str) {
        self.down().remove(name);
    }

    fn down(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.inner.down.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why `/healthz` fails for a required task that is down (`None` while all run).
    pub(crate) fn required_down(&self) -> Option<String> {
        let down = self.down();
        (!down.is_empty()).then(|| {
            down.iter()
                .map(|(name, why)| format!("required task {name} is down: {why}; restarting"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// The daemon starts now and must be running within `deadline`: past it, while still
    /// starting, `/healthz` fails with what the start is doing.
    pub(crate) fn start_deadline(&self, deadline: Duration) {
        *self.start() = Some(Start {
            since: Instant::now(),
            deadline,
            step: "starting".into(),
        });
    }

    /// What the start is doing now (`reading host facts from host snapshot /x.yaml`).
    pub(crate) fn start_step(&self, step: impl Into<String>) {
        if let Some(s) = self.start().as_mut() {
            s.step = step.into();
        }
    }

    fn start(&self) -> MutexGuard<'_, Option<Start>> {
        self.inner.start.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the start is late (`None` while within its deadline, or with no deadline).
    pub(crate) fn start_overdue(&self) -> Option<String> {
        let start = self.start();
        let s = start.as_ref()?;
        let elapsed = s.since.elapsed();
        (elapsed > s.deadline).then(|| {
            format!(
                "the device plugin has not finished starting after {} s (start deadline {} s): {}",
                elapsed.as_secs(),
                s.deadline.as_secs_f64(),
                s.step
            )
        })
    }

    /// A blocking read `name` did not return within its time limit (`Some(why)`), or returned
    /// (`None`). While one has not returned, `/healthz` fails with why.
    pub(crate) fn stalled(&self, name: &str, why: Option<String>) {
        let mut stalled = self.inner.stalled.lock().unwrap_or_else(|p| p.into_inner());
        match why {
            Some(why) => stalled.insert(name.to_string(), why),
            None => stalled.remove(name),
        };
    }

    /// Why `/healthz` fails for reads that have not returned (`None` while there are none).
    pub(crate) fn stalled_reads(&self) -> Option<String> {
        let stalled = self.inner.stalled.lock().unwrap_or_else(|p| p.into_inner());
        (!stalled.is_empty()).then(|| stalled.values().cloned().collect::<Vec<_>>().join("; "))
    }

    /// Sets the phase.
    pub(crate) fn set_phase(&self, phase: Phase) {
        let n = match phase {
            Phase::Starting => 0,
            Phase::Running => 1,
            Phase::Stopped => 2,
        };
        self.inner.phase.store(n, Ordering::Release);
    }

    /// The phase.
    pub(crate) fn phase(&self) -> Phase {
        match self.inner.phase.load(Ordering::Acquire) {
            0 => Phase::Starting,
            1 => Phase::Running,
            _ => Phase::Stopped,
        }
    }

    /// `Ok` with what to say when alive (starting within the start deadline, or the
    /// supervisor answered within `timeout`), otherwise why not.
    pub async fn check(&self, timeout: Duration) -> Result<&'static str, String> {
        match self.phase() {
            Phase::Starting => {
                return match self.start_overdue() {
                    Some(why) => Err(why),
                    None => Ok("ok: starting"),
                }
            }
            Phase::Stopped => return Err("the device plugin stopped".into()),
            Phase::Running => {}
        }
        if let Some(why) = self.required_down() {
            return Err(why);
        }
        if let Some(why) = self.stalled_reads() {
            return Err(why);
        }
        let (tx, rx) = oneshot::channel();
        let asked = async {
            self.inner.pings.send(tx).await.map_err(|_| ())?;
            rx.await.map_err(|_| ())
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(Ok(())) => Ok("ok"),
            Ok(Err(())) => Err("the supervisor is gone".into()),
            Err(_) => Err(format!(
                "the supervisor did not answer within {} s",
                timeout.as_secs_f64()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_running_with_the_kubelet_and_every_name_registered() {
        let r = Readiness::default();
        assert!(r.check().unwrap_err().starts_with("starting"));
        r.set_phase(Phase::Running);
        r.set_wanted(vec!["a.example/x".into(), "a.example/y".into()]);
        r.set_kubelet_missing(Some(Path::new("/k/kubelet.sock")));
        assert_eq!(
            r.check(),
            Err("waiting for the kubelet: /k/kubelet.sock does not exist".into())
        );
        r.set_kubelet_missing(None);
        assert_eq!(
            r.check(),
            Err("a.example/x: not serving yet; a.example/y: not serving yet".into())
        );
        r.server_started("a.example/x", 1);
        r.server_not_listening("a.example/y", "cannot listen: denied".into());
        assert_eq!(
            r.check(),
            Err("a.example/x: registering with the kubelet; a.example/y: cannot listen: denied, retrying".into())
        );
        r.server_started("a.example/y", 2);
        assert!(r.registration("a.example/x", 1, Err("refused".into())));
        assert!(r.registration("a.example/y", 2, Ok(())));
        assert_eq!(
            r.check(),
            Err("a.example/x: registration failed: refused, retrying; a.example/y: registered; waiting for the kubelet to watch the device list".into())
        );
        assert!(r.registration("a.example/x", 1, Ok(())));
        assert_eq!(
            r.check(),
            Err("a.example/x: registered; waiting for the kubelet to watch the device list; a.example/y: registered; waiting for the kubelet to watch the device list".into())
        );
        r.watching("a.example/x", 1, true);
        r.watching("a.example/y", 2, true);
        // A stream of a replaced server says nothing about the current one.
        r.watching("a.example/y", 1, false);
        assert_eq!(r.check(), Ok(()));
        // The kubelet stopped watching one (it dropped the registration): not ready until the
        // server registered again and is watched.
        r.watching("a.example/x", 1, false);
        assert_eq!(
            r.check(),
            Err("a.example/x: registered; waiting for the kubelet to watch the device list".into())
        );
        r.watching("a.example/x", 1, true);
        assert_eq!(
            r.registered(),
            (
                vec!["a.example/x".to_string(), "a.example/y".to_string()],
                vec!["a.example/x".to_string(), "a.example/y".to_string()]
            )
        );
        r.set_phase(Phase::Stopped);
        assert_eq!(r.check(), Err("the device plugin stopped".into()));
    }

    #[test]
    fn a_late_report_of_a_replaced_server_changes_nothing() {
        let r = Readiness::default();
        r.set_phase(Phase::Running);
        r.set_wanted(vec!["a.example/x".into()]);
        r.server_started("a.example/x", 1);
        // A kubelet restart: the server is replaced by generation 2.
        r.server_started("a.example/x", 2);
        assert!(!r.registration("a.example/x", 1, Ok(())));
        r.server_stopped("a.example/x", 1);
        assert_eq!(
            r.check(),
            Err("a.example/x: registering with the kubelet".into())
        );
        assert_eq!(r.registered().1, Vec::<String>::new());
        assert!(r.registration("a.example/x", 2, Ok(())));
        r.watching("a.example/x", 1, true);
        assert_eq!(
            r.check(),
            Err("a.example/x: registered; waiting for the kubelet to watch the device list".into())
        );
        r.watching("a.example/x", 2, true);
        assert_eq!(r.check(), Ok(()));
        // A name no longer served is forgotten; a new one is not ready.
        r.set_wanted(vec!["a.example/z".into()]);
        assert_eq!(r.check(), Err("a.example/z: not serving yet".into()));
    }

    #[tokio::test]
    async fn liveness_fails_past_the_start_deadline_with_what_the_start_is_doing() {
        let h = Health::default();
        h.start_deadline(Duration::ZERO);
        h.start_step("reading host facts from host snapshot /x.yaml");
        std::thread::sleep(Duration::from_millis(5));
        let why = h.check(Duration::from_secs(2)).await.unwrap_err();
        assert!(
            why.starts_with("the device plugin has not finished starting after 0 s (start deadline 0 s): reading host facts from host snapshot /x.yaml"),
            "{why}"
        );
        // Within the deadline: alive, starting.
        h.start_deadline(Duration::from_secs(3600));
        assert_eq!(h.check(Duration::from_secs(2)).await, Ok("ok: starting"));
    }

    #[tokio::test]
    async fn a_stalled_read_fails_liveness_until_it_returns() {
        let h = Health::default();
        let mut pings = h.take_pings().unwrap();
        h.set_phase(Phase::Running);
        tokio::spawn(async move {
            while let Some(p) = pings.recv().await {
                let _ = p.send(());
            }
        });
        h.stalled(
            "host read",
            Some("reading host snapshot /x.yaml did not finish".into()),
        );
        assert_eq!(
            h.check(Duration::from_secs(30)).await,
            Err("reading host snapshot /x.yaml did not finish".into())
        );
        h.stalled("host read", None);
        assert_eq!(h.check(Duration::from_secs(30)).await, Ok("ok"));
    }

    #[tokio::test]
    async fn health_follows_the_phase_and_the_supervisor_answering() {
        let h = Health::default();
        assert_eq!(h.check(Duration::from_secs(5)).await, Ok("ok: starting"));
        let mut pings = h.take_pings().unwrap();
        assert!(h.take_pings().is_none(), "one supervisor answers");
        h.set_phase(Phase::Running);
        let answering = tokio::spawn(async move {
            let ping = pings.recv().await.unwrap();
            ping.send(()).unwrap();
            pings
        });
        assert_eq!(h.check(Duration::from_secs(30)).await, Ok("ok"));
        // A supervisor that holds its receiver but never answers: a paused clock makes the
        // timeout immediate and exact.
        let _silent = answering.await.unwrap();
        tokio::time::pause();
        assert_eq!(
            h.check(Duration::from_secs(2)).await,
            Err("the supervisor did not answer within 2 s".into())
        );
        h.set_phase(Phase::Stopped);
        assert_eq!(
            h.check(Duration::from_secs(2)).await,
            Err("the device plugin stopped".into())
        );
    }
}
