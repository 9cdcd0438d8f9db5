//! Password checks that untrusted clients cannot turn against the daemon: bcrypt runs on
//! dxdp's own [`VERIFIER_THREADS`] thread (never tokio's blocking pool, which also runs host
//! reads, reloads and registration), fed by a queue of [`VERIFIER_QUEUE`] waiting checks. A
//! check that finds the queue full is answered at once without hashing ([`Busy`]: the request
//! gets `429`), a check whose client went away before its turn is skipped, and after each hash
//! the thread rests [`REST_FACTOR`] times as long as the hash took, so that a flood of wrong
//! passwords costs at most a fifth of one CPU, at a low scheduling priority (Linux: nice 10; Windows: below normal).
//!
//! [`Remembered`] keeps the outcomes by digest in two least-recently-used caches, so that a
//! scrape every few seconds and the same wrong password sent again cost no hash: [`PASSES`]
//! pairs that passed, [`FAILURES`] that failed (each forgotten after [`FAILURE_TTL`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Threads that run bcrypt.
pub(crate) const VERIFIER_THREADS: usize = 1;

/// Checks that may wait for a verifier thread; beyond them a check is refused ([`Busy`]).
pub(crate) const VERIFIER_QUEUE: usize = 8;

/// After a hash that took `t`, the thread rests `REST_FACTOR * t`.
pub(crate) const REST_FACTOR: u32 = 4;

/// Pairs that passed, remembered.
pub(crate) const PASSES: usize = 64;

/// Pairs that failed, remembered.
pub(crate) const FAILURES: usize = 1024;

/// How long a failure is remembered.
pub(crate) const FAILURE_TTL: Duration = Duration::from_secs(60);

/// The verifier's queue is full: the check was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Busy;

struct Job {
    password: Vec<u8>,
    hash: Arc<str>,
    reply: oneshot::Sender<bool>,
}

/// What the verifier has done.
#[derive(Debug, Default)]
pub(crate) struct VerifierStats {
    hashes: AtomicU64,
    skipped: AtomicU64,
}

impl VerifierStats {
    /// Hashes computed.
    #[cfg(test)]
    pub(crate) fn hashes(&self) -> u64 {
        self.hashes.load(Ordering::SeqCst)
    }

    /// Checks skipped because their client was gone.
    #[cfg(test)]
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::SeqCst)
    }
}

/// Runs bcrypt checks on threads of its own; the threads end when it is dropped.
pub(crate) struct Verifier {
    queue: SyncSender<Job>,
    #[cfg_attr(not(test), allow(dead_code))] // read by the tests
    stats: Arc<VerifierStats>,
    /// Tests only: the receiving end when no thread was started yet.
    #[cfg(test)]
    idle: Mutex<Option<Receiver<Job>>>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").finish_non_exhaustive()
    }
}

impl Verifier {
    /// Starts [`VERIFIER_THREADS`] threads behind a queue of [`VERIFIER_QUEUE`].
    pub(crate) fn start() -> Verifier {
        let (queue, jobs) = sync_channel(VERIFIER_QUEUE);
        let stats = Arc::<VerifierStats>::default();
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..VERIFIER_THREADS {
            let (jobs, stats) = (jobs.clone(), stats.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("dxdp-bcrypt-{i}"))
                .spawn(move || work(&jobs, &stats));
            if let Err(e) = spawned {
                // Without a thread every check waits in the queue, then is refused as busy.
                tracing::error!("cannot start a password verifier thread: {e}; basic authentication answers 429 until dxdp restarts");
            }
        }
        Verifier {
            queue,
            stats,
            #[cfg(test)]
            idle: Mutex::new(None),
        }
    }

    /// What it has done.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> &VerifierStats {
        &self.stats
    }

    /// Whether `password` matches the bcrypt `hash`, or [`Busy`] at once when the queue is
    /// full. Dropping the future before its turn skips the hash.
    pub(crate) async fn verify(&self, password: &[u8], hash: Arc<str>) -> Result<bool, Busy> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            password: password.to_vec(),
            hash,
            reply,
        };
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => return Err(Busy),
        }
        // A verifier thread that died drops the sender: refused, never passed.
        answer.await.map_err(|_| Busy)
    }
}

fn work(jobs: &Mutex<Receiver<Job>>, stats: &VerifierStats) {
    lower_priority();
    loop {
        let job = {
            let jobs = jobs.lock().unwrap_or_else(|p| p.into_inner());
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        run(job, stats);
    }
}

/// Runs one check (or skips it when its client is gone), then rests.
fn run(job: Job, stats: &VerifierStats) {
    if job.reply.is_closed() {
        stats.skipped.fetch_add(1, Ordering::SeqCst);
        return;
    }
    let started = Instant::now();
    stats.hashes.fetch_add(1, Ordering::SeqCst);
    let passed = bcrypt::verify(&job.password, &job.hash).unwrap_or(false);
    let _ = job.reply.send(passed);
    std::thread::sleep(started.elapsed() * REST_FACTOR);
}

/// Linux: nice 10 for the calling thread, so that the daemon's other threads (Allocate, the
/// probes) run first when the CPU is short.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: gettid and setpriority take and return plain integers.
    let done = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10)
    };
    if done != 0 {
        tracing::debug!(
            "cannot lower the password verifier's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Windows: below-normal priority for the calling thread, for the same reason.
#[cfg(windows)]
fn lower_priority() {
    use windows::Win32::System::Threading::{
        GetCurrentThread, SetThreadPriority, THREAD_PRIORITY_BELOW_NORMAL,
    };
    // SAFETY: the current thread's pseudo handle needs no closing.
    if let Err(e) = unsafe { SetThreadPriority(GetCurrentThread(), THREAD_PRIORITY_BELOW_NORMAL) } {
        tracing::debug!("cannot lower the password verifier's priority: {e}");
    }
}

#[cfg(not(any(target_os = "linux", windows)))]
fn lower_priority() {}

/// A least-recently-used set of digests, each with when it was put in.
#[derive(Debug)]
struct Lru {
    capacity: usize,
    tick: u64,
    entries: HashMap<[u8; 32], (u64, Instant)>,
}

impl Lru {
    fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            tick: 0,
            entries: HashMap::with_capacity(capacity),
        }
    }

    /// Whether `digest` is in, put in less than `ttl` ago; marks it used.
    fn hit(&mut self, digest: &[u8; 32], ttl: Option<Duration>) -> bool {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(digest) {
            Some((_, at)) if ttl.is_some_and(|ttl| at.elapsed() >= ttl) => {
                self.entries.remove(digest);
                false
            }
            Some((used, _)) => {
                *used = tick;
                true
            }
            None => false,
        }
    }

    /// Puts `digest` in, the least recently used out when full.
    fn put(&mut self, digest: [u8; 32]) {
        self.tick += 1;
        if !self.entries.contains_key(&digest) && self.entries.len() >= self.capacity {
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(d, _)| *d)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(digest, (self.tick, Instant::now()));
    }
}

/// The outcomes of earlier checks, by digest of user, password and hash.
#[derive(Debug)]
pub(crate) struct Remembered {
    passes: Mutex<Lru>,
    failures: Mutex<Lru>,
}

impl Default for Remembered {
    fn default() -> Self {
        Remembered {
            passes: Mutex::new(Lru::new(PASSES)),
            failures: Mutex::new(Lru::new(FAILURES)),
        }
    }
}

impl Remembered {
    /// The remembered outcome of `digest`, if any.
    pub(crate) fn outcome(&self, digest: &[u8; 32]) -> Option<bool> {
        if lock(&self.passes).hit(digest, None) {
            return Some(true);
        }
        let failed = lock(&self.failures).hit(digest, Some(FAILURE_TTL));
        failed.then_some(false)
    }

    /// Remembers the outcome of `digest`.
    pub(crate) fn remember(&self, digest: [u8; 32], passed: bool) {
        let cache = if passed { &self.passes } else { &self.failures };
        lock(cache).put(digest);
    }
}

fn lock(m: &Mutex<Lru>) -> std::sync::MutexGuard<'_, Lru> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
impl Verifier {
    /// A verifier whose thread starts only with [`Verifier::start_thread`].
    pub(crate) fn idle() -> Verifier {
        let (queue, jobs) = sync_channel(VERIFIER_QUEUE);
        Verifier {
            queue,
            stats: Arc::default(),
            idle: Mutex::new(Some(jobs)),
        }
    }

    /// Starts the thread of a verifier made with [`Verifier::idle`].
    pub(crate) fn start_thread(&self) {
        let jobs = self.idle.lock().unwrap().take().expect("an idle verifier");
        let stats = self.stats.clone();
        std::thread::spawn(move || work(&Mutex::new(jobs), &stats));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt as _;

    /// A cost-4 hash of "right".
    fn hash() -> Arc<str> {
        bcrypt::hash("right", 4).unwrap().into()
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_without_hashing() {
        let verifier = Verifier::idle();
        let hash = hash();
        let mut waiting = Vec::new();
        for _ in 0..VERIFIER_QUEUE {
            let fut = Box::pin(verifier.verify(b"wrong", hash.clone()));
            waiting.push(fut);
        }
        // Each waiting check is queued when first polled.
        for fut in &mut waiting {
            assert!(fut.as_mut().now_or_never().is_none());
        }
        assert_eq!(verifier.verify(b"right", hash.clone()).await, Err(Busy));
        assert_eq!(verifier.stats().hashes(), 0);
        // The thread starts: the queued ones are checked, in order.
        verifier.start_thread();
        let outcomes = futures_util::future::join_all(waiting).await;
        assert_eq!(outcomes, vec![Ok(false); VERIFIER_QUEUE]);
        assert_eq!(verifier.verify(b"right", hash).await, Ok(true));
        assert_eq!(verifier.stats().hashes(), 9);
    }

    #[tokio::test]
    async fn a_check_whose_client_left_is_never_hashed() {
        let verifier = Verifier::idle();
        let hash = hash();
        let mut gone = Box::pin(verifier.verify(b"wrong", hash.clone()));
        assert!(gone.as_mut().now_or_never().is_none());
        drop(gone);
        verifier.start_thread();
        assert_eq!(verifier.verify(b"right", hash).await, Ok(true));
        assert_eq!(
            (verifier.stats().hashes(), verifier.stats().skipped()),
            (1, 1)
        );
    }

    #[test]
    fn the_least_recently_used_digest_goes_first() {
        let mut lru = Lru::new(2);
        let (a, b, c) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        lru.put(a);
        lru.put(b);
        assert!(lru.hit(&a, None)); // a is now more recent than b
        lru.put(c);
        assert_eq!(
            (lru.hit(&a, None), lru.hit(&b, None), lru.hit(&c, None)),
            (true, false, true)
        );
        assert_eq!(lru.entries.len(), 2);
    }

    #[test]
    fn failures_are_forgotten_after_their_time_and_never_evict_passes() {
        let remembered = Remembered::default();
        remembered.remember([7u8; 32], true);
        for i in 0..FAILURES + 10 {
            let mut d = [0u8; 32];
            d[..8].copy_from_slice(&(i as u64).to_le_bytes());
            d[31] = 1;
            remembered.remember(d, false);
        }
        assert_eq!(remembered.outcome(&[7u8; 32]), Some(true));
        assert_eq!(remembered.failures.lock().unwrap().entries.len(), FAILURES);
        let mut last = [0u8; 32];
        last[..8].copy_from_slice(&((FAILURES + 9) as u64).to_le_bytes());
        last[31] = 1;
        assert_eq!(remembered.outcome(&last), Some(false));
        let mut lru = Lru::new(1);
        lru.put(last);
        assert!(!lru.hit(&last, Some(Duration::ZERO)));
        assert!(lru.entries.is_empty());
    }
}
