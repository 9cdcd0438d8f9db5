//! The HTTP/1.1 servers of `--metrics-address`: `/metrics` (OpenMetrics text), `/healthz` and
//! `/readyz`, and of `--probe-address`: `/healthz` and `/readyz` alone (`Endpoints`); GET and
//! HEAD only, everything else 404 (unknown path) or 405 (other method). The paths are axum
//! routes (`routes`); hyper serves each connection, and the accept loop here caps connections.
//!
//! The probe listener exists so that metrics clients cannot starve the kubelet's probes: with
//! one listener, 128 connections that send nothing held every connection slot and `/healthz`
//! timed out until the kubelet restarted dxdp. It has its own `MAX_PROBE_CONNECTIONS` and a
//! short `PROBE_HEADER_TIMEOUT`; bound to 127.0.0.1 (as the chart does) only the node itself
//! reaches it.
//!
//! It is optional and must never cost the node its GPUs: `serve_forever_for` binds, and when the
//! address is taken logs once per distinct error and retries in the background with a capped
//! backoff. At most `MAX_CONNECTIONS` connections are served at once: a connection beyond that
//! is not accepted until one ends (it waits in the kernel's backlog, costing the process no
//! memory and no descriptor), and connections accepted near the cap are closed after one answer
//! so that waiting ones get their turn. The metrics listener also accepts at most
//! `ACCEPT_RATE` connections a second after a burst of `ACCEPT_BURST`, so that a flood of
//! connections (with or without passwords) waits in the backlog rather than taking the CPU
//! Allocate needs. An accept error (out of descriptors, `EMFILE`) backs off
//! (`ACCEPT_BACKOFF_FIRST` doubling to `ACCEPT_BACKOFF_MAX`) instead of spinning. The cap is on
//! connections, not requests: tower's `ConcurrencyLimit` bounds requests in flight, which would
//! leave idle connections accepted and holding memory and a descriptor each.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

use super::access::{Access, Denied, Verdict};
use super::state::PING_TIMEOUT;
use super::web::WebConfig;
use super::{metrics, Observe};
use crate::util::retry::Backoff;

const TEXT: &str = "text/plain; charset=utf-8";

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a probe client may take to send a request's headers (the kubelet sends its at once).
pub(crate) const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The most connections served at once (a scrape and the probes need a handful).
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// The most connections the probe listener serves at once (the kubelet opens one per probe).
pub(crate) const MAX_PROBE_CONNECTIONS: usize = 16;

/// The most connections the metrics listener accepts per second after a burst of
/// [`ACCEPT_BURST`] (a scrape, the probes and `dxdp top` need a few): a flood of connections
/// waits in the kernel's backlog instead of taking the CPU that Allocate needs.
pub(crate) const ACCEPT_RATE: f64 = 100.0;

/// Connections the metrics listener accepts at once before [`ACCEPT_RATE`] applies.
pub(crate) const ACCEPT_BURST: f64 = 64.0;

/// A token bucket of accepts: [`ACCEPT_BURST`] at once, [`ACCEPT_RATE`] a second.
struct Pace {
    tokens: f64,
    at: tokio::time::Instant,
}

impl Pace {
    fn new() -> Self {
        Pace {
            tokens: ACCEPT_BURST,
            at: tokio::time::Instant::now(),
        }
    }

    /// Waits until one more accept is allowed.
    async fn ready(&mut self) {
        let now = tokio::time::Instant::now();
        let earned = now.duration_since(self.at).as_secs_f64() * ACCEPT_RATE;
        self.tokens = (self.tokens + earned).min(ACCEPT_BURST);
        self.at = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / ACCEPT_RATE);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.at = tokio::time::Instant::now();
        }
    }

    /// One accept was made.
    fn spend(&mut self) {
        self.tokens -= 1.0;
    }
}

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoints {
    /// `/metrics`, `/healthz` and `/readyz` (`metrics.address`).
    All,
    /// `/healthz` and `/readyz` (`metrics.probeAddress`).
    Probes,
}

impl Endpoints {
    fn what(self) -> &'static str {
        match self {
            Endpoints::All => "/metrics, /healthz and /readyz",
            Endpoints::Probes => "the probes /healthz and /readyz",
        }
    }
}

/// The pause after a failed accept, doubling with each further failure.
pub(crate) const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(10);

/// The longest pause after failed accepts.
pub(crate) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The pause after a failed bind, doubling with each further failure.
pub(crate) const BIND_BACKOFF_FIRST: Duration = Duration::from_millis(500);

/// The longest pause between binds.
pub(crate) const BIND_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Pauses between binds that failed.
const BIND_BACKOFF: Backoff = Backoff::pauses(BIND_BACKOFF_FIRST, BIND_BACKOFF_MAX);

/// Pauses between accepts that failed.
const ACCEPT_BACKOFF: Backoff = Backoff::pauses(ACCEPT_BACKOFF_FIRST, ACCEPT_BACKOFF_MAX);

/// Why the server cannot listen.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve {} on {address}: {error}; choose a free address and port with {} (HOST:PORT, e.g. {}), or unset it to turn the endpoint off", .endpoints.what(), setting(*.endpoints), example(*.endpoints))]
pub struct BindError {
    /// The address asked for.
    pub(crate) address: SocketAddr,
    /// What the OS said.
    pub(crate) error: std::io::Error,
    /// What it was to serve.
    pub(crate) endpoints: Endpoints,
}

fn setting(endpoints: Endpoints) -> &'static str {
    match endpoints {
        Endpoints::All => "--metrics-address, metrics.address or DXDP_METRICS_ADDRESS",
        Endpoints::Probes => "--probe-address, metrics.probeAddress or DXDP_PROBE_ADDRESS",
    }
}

fn example(endpoints: Endpoints) -> &'static str {
    match endpoints {
        Endpoints::All => "0.0.0.0:9466",
        Endpoints::Probes => "127.0.0.1:9467",
    }
}

/// What the server has done: counted here, read by the unit tests.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    accepted: AtomicU64,
    accept_errors: AtomicU64,
    open: AtomicU64,
    most_open: AtomicU64,
    binds_failed: AtomicU64,
    changed: Notify,
}

impl Stats {
    fn bump(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn opened(&self) {
        self.accepted.fetch_add(1, Ordering::SeqCst);
        let open = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open.fetch_max(open, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

/// A bound, not yet serving, endpoint.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    address: SocketAddr,
    limit: usize,
    stats: Arc<Stats>,
    endpoints: Endpoints,
    access: Access,
}

/// Listens on `address` (port 0 picks a free port) for every endpoint.
pub async fn bind(address: SocketAddr) -> Result<Server, BindError> {
    bind_for(address, Endpoints::All).await
}

/// Listens on `address` for `endpoints`, with their connection limit.
pub(crate) async fn bind_for(
    address: SocketAddr,
    endpoints: Endpoints,
) -> Result<Server, BindError> {
    let err = |error| BindError {
        address,
        error,
        endpoints,
    };
    let listener = TcpListener::bind(address).await.map_err(err)?;
    let address = listener.local_addr().map_err(err)?;
    Ok(Server {
        listener,
        address,
        limit: match endpoints {
            Endpoints::All => MAX_CONNECTIONS,
            Endpoints::Probes => MAX_PROBE_CONNECTIONS,
        },
        stats: Arc::default(),
        endpoints,
        access: Access::default(),
    })
}

/// [`serve_forever_for`] guarded by `access` (TLS, basic authentication, Kubernetes authorization).
pub(crate) async fn serve_guarded_forever(address: SocketAddr, observe: Observe, access: Access) {
    serve_forever_for(address, Endpoints::All, observe, Arc::default(), access).await
}

/// [`serve_forever_for`] for the probes alone (`metrics.probeAddress`), with their own connections.
pub(crate) async fn serve_probes_forever(address: SocketAddr, observe: Observe) {
    serve_forever_for(
        address,
        Endpoints::Probes,
        observe,
        Arc::default(),
        Access::default(),
    )
    .await
}

/// Serves `observe`'s `endpoints` on `address` for as long as the future runs, never failing:
/// when the bind fails it logs the error (once per distinct error, with what to do), retries with
/// a backoff of [`BIND_BACKOFF_FIRST`] doubling to [`BIND_BACKOFF_MAX`], and serves once bound.
/// `observe.listening()` says where it listens. Never returns; drop (abort) it to stop.
async fn serve_forever_for(
    address: SocketAddr,
    endpoints: Endpoints,
    observe: Observe,
    stats: Arc<Stats>,
    access: Access,
) {
    let mut binds_failed = 0u32;
    let mut last_error: Option<String> = None;
    let what = endpoints.what();
    loop {
        match bind_for(address, endpoints).await {
            Ok(server) => {
                let server = server.with_stats(stats).with_access(access);
                let bound = server.local_addr();
                if last_error.is_some() {
                    tracing::info!(address = %bound, "bound at last: serving {what}");
                } else {
                    tracing::info!(address = %bound, "serving {what}");
                }
                if endpoints == Endpoints::All {
                    observe.set_listening(Some(bound));
                }
                server.serve(observe).await;
                return;
            }
            Err(e) => {
                stats.bump(&stats.binds_failed);
                binds_failed = binds_failed.saturating_add(1);
                let pause = BIND_BACKOFF.base(binds_failed);
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::error!(
                        "{text}; devices are served regardless, retrying the endpoint in the background (every {:?} at most)",
                        BIND_BACKOFF_MAX
                    );
                } else {
                    tracing::debug!("{text}; retrying in {pause:?}");
                }
                last_error = Some(text);
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// A source of connections: a TCP listener, or a scripted one in tests.
trait Accept {
    type Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

impl Accept for TcpListener {
    type Conn = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Conn> {
        TcpListener::accept(self)
            .await
            .map(|(stream, _peer)| stream)
    }
}

impl Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The same server counting into `stats`.
    pub(crate) fn with_stats(self, stats: Arc<Stats>) -> Self {
        Server { stats, ..self }
    }

    /// The same server guarded by `access`.
    pub fn with_access(self, access: Access) -> Self {
        Server { access, ..self }
    }

    /// Serves `observe` until the returned future is dropped (aborting the task that runs it
    /// closes every connection too).
    pub async fn serve(self, observe: Observe) {
        accept_loop(
            &self.listener,
            self.address,
            (self.limit, self.endpoints),
            &self.stats,
            observe,
            self.access,
        )
        .await
    }
}

/// Accepts up to `limit` connections at once and serves each on its own task; backs off after
/// a failed accept. Never returns.
async fn accept_loop<L: Accept>(
    listener: &L,
    address: SocketAddr,
    (limit, endpoints): (usize, Endpoints),
    stats: &Arc<Stats>,
    observe: Observe,
    access: Access,
) {
    let router = routes(endpoints, observe.clone());
    let permits = Arc::new(Semaphore::new(limit));
    let mut connections = JoinSet::new();
    let mut accepts_failed = 0u32;
    let mut failing: Option<(String, u64)> = None;
    let mut pace = Pace::new();
    loop {
        // A permit first: beyond the limit, connections wait in the backlog, not in memory.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        if endpoints == Endpoints::All {
            pace.ready().await;
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        match accepted {
            Ok(stream) => {
                pace.spend();
                if let Some((_, errors)) = failing.take() {
                    tracing::info!(%address, "accepting metrics connections again after {errors} failed accepts");
                }
                accepts_failed = 0;
                stats.opened();
                // Near the cap, a connection is closed after one answer, so that the waiting
                // ones get their turn rather than queue behind kept-alive clients.
                let keep_alive = permits.available_permits() >= limit / 4;
                let answers = (router.clone(), observe.clone());
                let stats = stats.clone();
                let access = access.clone();
                connections.spawn(async move {
                    let web = match &access.web {
                        Some(web) => Some(web.fresh().await),
                        None => None,
                    };
                    match web.as_ref().and_then(|w| w.tls()) {
                        Some(tls) => {
                            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                            match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream))
                                .await
                            {
                                Ok(Ok(stream)) => {
                                    let guard = Guard { access, web };
                                    serve_connection(stream, answers, keep_alive, endpoints, guard)
                                        .await
                                }
                                Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
                                Err(_) => tracing::debug!(
                                    "TLS handshake not done within {HEADER_TIMEOUT:?}"
                                ),
                            }
                        }
                        None => {
                            let guard = Guard { access, web };
                            serve_connection(stream, answers, keep_alive, endpoints, guard).await
                        }
                    }
                    stats.closed();
                    drop(permit);
                });
            }
            Err(e) => {
                stats.bump(&stats.accept_errors);
                let text = e.to_string();
                match &mut failing {
                    Some((last, errors)) if *last == text => {
                        *errors += 1;
                        tracing::debug!(%address, "cannot accept a metrics connection: {e}");
                    }
                    _ => {
                        tracing::warn!(%address, "cannot accept a metrics connection: {e}; backing off up to {ACCEPT_BACKOFF_MAX:?} between tries (if it says too many open files, raise the file limit: LimitNOFILE / ulimit -n)");
                        let errors = failing.as_ref().map_or(0, |(_, n)| *n);
                        failing = Some((text, errors + 1));
                    }
                }
                drop(permit);
                accepts_failed = accepts_failed.saturating_add(1);
                tokio::time::sleep(ACCEPT_BACKOFF.base(accepts_failed)).await;
            }
        }
    }
}

/// What guards one connection: the listener's access rules and the web configuration it was
/// accepted with.
#[derive(Clone)]
struct Guard {
    access: Access,
    web: Option<Arc<WebConfig>>,
}

async fn serve_connection(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    (router, observe): (Router, Observe),
    keep_alive: bool,
    endpoints: Endpoints,
    guard: Guard,
) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (router, observe, guard) = (router.clone(), observe.clone(), guard.clone());
        async move { Ok::<_, Infallible>(guarded_answer(req, router, &observe, &guard).await) }
    });
    let header_timeout = match endpoints {
        Endpoints::All => HEADER_TIMEOUT,
        Endpoints::Probes => PROBE_HEADER_TIMEOUT,
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(keep_alive)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!("metrics connection ended: {e}");
    }
}

/// The answer to `req` after the access checks: unknown paths and methods are answered first
/// (404, 405: nothing to guard, no password checked); then `rate_limit` (every path but the
/// probes: 429); `/healthz` and `/readyz` answer every client (a guarded listener gives the
/// status and one word only, unless the client is authorized); `/metrics` needs what the
/// listener's access rules ask for. The web configuration's headers are added to every answer.
async fn guarded_answer(
    req: Request<Incoming>,
    router: Router,
    observe: &Observe,
    guard: &Guard,
) -> Response {
    let answer = |req| async move { router.oneshot(req).await.unwrap_or_else(|e| match e {}) };
    let served = matches!(req.uri().path(), "/metrics" | "/healthz" | "/readyz")
        && matches!(*req.method(), Method::GET | Method::HEAD);
    let probe = matches!(req.uri().path(), "/healthz" | "/readyz");
    let limited = served && !probe && guard.web.as_ref().is_some_and(|web| !web.rate_allows());
    let mut response = if limited {
        observe.metrics.access().denied(Denied::RateLimited);
        refused(
            Denied::RateLimited,
            "too many requests: rate_limit of the web configuration; try again later\n".into(),
            guard,
        )
    } else if !served
        || guard.access.is_open()
        || !guard.access.needs_credentials(guard.web.as_deref())
    {
        answer(req).await
    } else {
        let path = req.uri().path();
        let authorization = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        let verb = if req.method() == Method::HEAD {
            "get"
        } else {
            &req.method().as_str().to_ascii_lowercase()
        };
        let verdict = if probe && authorization.is_none() {
            Verdict::Denied(Denied::Unauthenticated, String::new())
        } else {
            guard
                .access
                .check(guard.web.clone(), authorization, verb, path)
                .await
        };
        match verdict {
            Verdict::Allowed => answer(req).await,
            Verdict::Denied(..) if probe => {
                let full = answer(req).await;
                let word = if full.status() == StatusCode::OK {
                    "ok\n"
                } else {
                    "unavailable\n"
                };
                let mut r = text(full.status(), word);
                if let Some(allow) = full.headers().get(ALLOW) {
                    r.headers_mut().insert(ALLOW, allow.clone());
                }
                r
            }
            Verdict::Denied(why, body) => {
                observe.metrics.access().denied(why);
                refused(why, body, guard)
            }
        }
    };
    if let Some(web) = &guard.web {
        for (name, value) in web.headers() {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
}

/// The answer refusing a request for `why`, saying `body`.
fn refused(why: Denied, body: String, guard: &Guard) -> Response {
    let status = match why {
        Denied::Unauthenticated => StatusCode::UNAUTHORIZED,
        Denied::Forbidden => StatusCode::FORBIDDEN,
        Denied::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Denied::Busy | Denied::RateLimited => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut r = text(status, body);
    match why {
        Denied::Unauthenticated => {
            let scheme = if guard.access.authorizer.is_some() {
                "Bearer realm=\"dxdp\""
            } else {
                "Basic realm=\"dxdp\", charset=\"UTF-8\""
            };
            r.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                HeaderValue::from_static(scheme),
            );
        }
        Denied::Busy | Denied::RateLimited => {
            r.headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        Denied::Forbidden | Denied::Unavailable => {}
    }
    r
}

fn text(status: StatusCode, body: impl Into<Body>) -> Response {
    (status, [(CONTENT_TYPE, TEXT)], body.into()).into_response()
}

/// The routes of a listener serving `endpoints`: GET (and HEAD, answered without a body) on each
/// path, 405 with `Allow: GET, HEAD` for other methods, 404 with what is served elsewhere.
fn routes(endpoints: Endpoints, observe: Observe) -> Router {
    let probes = Router::new()
        .route("/healthz", get(healthz).fallback(method_not_allowed))
        .route("/readyz", get(readyz).fallback(method_not_allowed));
    match endpoints {
        Endpoints::All => probes
            .route("/metrics", get(metrics).fallback(method_not_allowed))
            .fallback(|| async {
                text(
                    StatusCode::NOT_FOUND,
                    "not found: dxdp serves /metrics, /healthz and /readyz\n",
                )
            }),
        Endpoints::Probes => probes.fallback(|| async {
            text(StatusCode::NOT_FOUND, "not found: this is dxdp's probe endpoint, serving /healthz and /readyz (/metrics is on metrics.address)\n")
        }),
    }
    .with_state(observe)
}

async fn method_not_allowed() -> Response {
    let mut r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: use GET or HEAD\n",
    );
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    r
}

async fn metrics(State(observe): State<Observe>) -> Response {
    (
        [(CONTENT_TYPE, metrics::CONTENT_TYPE)],
        observe.metrics.encode(),
    )
        .into_response()
}

async fn healthz(State(observe): State<Observe>) -> Response {
    match observe.health.check(PING_TIMEOUT).await {
        Ok(what) => text(StatusCode::OK, format!("{what}\n")),
        Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(observe): State<Observe>) -> Response {
    match observe.readiness.check() {
        Ok(()) => match observe.readiness.note() {
            Some(note) => text(StatusCode::OK, format!("ok ({note})\n")),
            None => text(StatusCode::OK, "ok\n"),
        },
        Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const WAIT: Duration = Duration::from_secs(10);

    /// What the server has done, read by the tests (the server only counts).
    impl Stats {
        /// Connections accepted so far.
        fn accepted(&self) -> u64 {
            self.accepted.load(Ordering::SeqCst)
        }

        /// Failed accepts so far.
        fn accept_errors(&self) -> u64 {
            self.accept_errors.load(Ordering::SeqCst)
        }

        /// Connections being served now.
        fn open(&self) -> u64 {
            self.open.load(Ordering::SeqCst)
        }

        /// The most connections ever served at once.
        fn most_open(&self) -> u64 {
            self.most_open.load(Ordering::SeqCst)
        }

        /// Failed binds so far.
        fn binds_failed(&self) -> u64 {
            self.binds_failed.load(Ordering::SeqCst)
        }

        /// Waits until `done(self)` holds, woken by every change of the counters; false after
        /// `timeout`.
        async fn wait_for(&self, timeout: Duration, done: impl Fn(&Stats) -> bool) -> bool {
            tokio::time::timeout(timeout, async {
                loop {
                    let changed = self.changed.notified();
                    if done(self) {
                        return;
                    }
                    changed.await;
                }
            })
            .await
            .is_ok()
        }
    }

    impl Server {
        /// The same server serving at most `limit` connections at once (at least 1).
        fn with_connection_limit(self, limit: usize) -> Self {
            Server {
                limit: limit.max(1),
                ..self
            }
        }

        /// What it has done so far.
        fn stats(&self) -> Arc<Stats> {
            self.stats.clone()
        }
    }

    /// Serves everything on `address` counting into `stats`.
    async fn serve_forever_with(address: SocketAddr, observe: Observe, stats: Arc<Stats>) {
        serve_forever_for(address, Endpoints::All, observe, stats, Access::default()).await
    }

    /// Sends a request for an unknown path and reads the status line of the answer.
    async fn ask(stream: &mut tokio::net::TcpStream) -> String {
        stream
            .write_all(b"GET /nothing HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 512];
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_until_one_ends() {
        let server = bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap()
            .with_connection_limit(2);
        let address = server.local_addr();
        let stats = server.stats();
        let task = tokio::spawn(server.serve(Observe::new()));
        let mut first = tokio::net::TcpStream::connect(address).await.unwrap();
        let mut second = tokio::net::TcpStream::connect(address).await.unwrap();
        assert_eq!(ask(&mut first).await, "HTTP/1.1 404 Not Found");
        assert_eq!(ask(&mut second).await, "HTTP/1.1 404 Not Found");
        // Both kept alive: the third connects (the kernel's backlog) but is not served...
        let mut third = tokio::net::TcpStream::connect(address).await.unwrap();
        let answer = tokio::spawn(async move { ask(&mut third).await });
        assert_eq!((stats.accepted(), stats.open()), (2, 2));
        // ...until one of the others ends.
        drop(first);
        assert_eq!(answer.await.unwrap(), "HTTP/1.1 404 Not Found");
        assert!(stats.wait_for(WAIT, |s| s.accepted() == 3).await);
        assert_eq!(stats.most_open(), 2);
        drop(second);
        assert!(stats.wait_for(WAIT, |s| s.open() == 1).await);
        task.abort();
    }

    /// A listener whose accepts fail `errors` times, then never complete; it notes when each
    /// accept was asked for.
    struct Failing {
        errors: usize,
        calls: Mutex<Vec<tokio::time::Instant>>,
        called: Notify,
    }

    impl Accept for Failing {
        type Conn = tokio::io::DuplexStream;
        async fn accept(&self) -> std::io::Result<Self::Conn> {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                calls.push(tokio::time::Instant::now());
                calls.len()
            };
            self.called.notify_waiters();
            if n <= self.errors {
                return Err(std::io::Error::other("Too many open files (os error 24)"));
            }
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_accepts_back_off_instead_of_spinning() {
        let listener = Arc::new(Failing {
            errors: 8,
            calls: Mutex::default(),
            called: Notify::new(),
        });
        let stats = Arc::new(Stats::default());
        let task = {
            let (listener, stats) = (listener.clone(), stats.clone());
            tokio::spawn(async move {
                accept_loop(
                    &*listener,
                    "127.0.0.1:1".parse().unwrap(),
                    (4, Endpoints::All),
                    &stats,
                    Observe::new(),
                    Access::default(),
                )
                .await
            })
        };
        // The ninth accept is the first that waits for a connection.
        tokio::time::timeout(WAIT, async {
            loop {
                let called = listener.called.notified();
                if listener.calls.lock().unwrap().len() == 9 {
                    return;
                }
                called.await;
            }
        })
        .await
        .expect("nine accepts");
        assert_eq!(stats.accept_errors(), 8);
        let calls = listener.calls.lock().unwrap().clone();
        let gaps: Vec<u128> = calls
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(gaps, [10, 20, 40, 80, 160, 320, 640, 1000]);
        task.abort();
    }

    /// A listener with a connection always waiting.
    struct Flooded;

    impl Accept for Flooded {
        type Conn = tokio::io::DuplexStream;
        async fn accept(&self) -> std::io::Result<Self::Conn> {
            // The far end is dropped: each connection ends at once.
            Ok(tokio::io::duplex(64).0)
        }
    }

    /// A flood of connections is accepted at ACCEPT_BURST at once, then ACCEPT_RATE a second
    /// (64, then one every 10 ms), the rest left waiting in the backlog.
    #[tokio::test(start_paused = true)]
    async fn the_metrics_listener_accepts_a_burst_then_a_hundred_a_second() {
        let stats = Arc::new(Stats::default());
        let task = {
            let stats = stats.clone();
            tokio::spawn(async move {
                accept_loop(
                    &Flooded,
                    "127.0.0.1:1".parse().unwrap(),
                    (1000, Endpoints::All),
                    &stats,
                    Observe::new(),
                    Access::default(),
                )
                .await
            })
        };
        assert!(stats.wait_for(WAIT, |s| s.accepted() == 64).await);
        tokio::time::sleep(Duration::from_millis(995)).await;
        assert_eq!(stats.accepted(), 64 + 99);
        task.abort();
    }

    /// What each listener's routes answer, written out: GET and HEAD on its paths (HEAD with the
    /// length of the body it leaves out), 405 with `Allow: GET, HEAD` for other methods, its own
    /// 404 elsewhere, every answer plain text.
    #[tokio::test]
    async fn the_routes_answer_methods_and_paths_as_documented() {
        async fn ask(
            endpoints: Endpoints,
            method: &str,
            path: &str,
        ) -> (u16, Option<String>, Option<String>, Option<String>, String) {
            let r = routes(endpoints, Observe::new())
                .oneshot(
                    Request::builder()
                        .method(method)
                        .uri(path)
                        .body(Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            let header = |name| {
                r.headers()
                    .get(name)
                    .map(|v: &HeaderValue| v.to_str().unwrap().to_string())
            };
            let (allow, kind, length) = (
                header(ALLOW),
                header(CONTENT_TYPE),
                header(hyper::header::CONTENT_LENGTH),
            );
            let status = r.status().as_u16();
            let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
            (
                status,
                allow,
                kind,
                length,
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
        let plain = Some("text/plain; charset=utf-8".to_string());
        let not_allowed = "method not allowed: use GET or HEAD\n";
        for (endpoints, path) in [
            (Endpoints::All, "/metrics"),
            (Endpoints::All, "/readyz"),
            (Endpoints::Probes, "/healthz"),
        ] {
            assert_eq!(
                ask(endpoints, "POST", path).await,
                (
                    405,
                    Some("GET, HEAD".to_string()),
                    plain.clone(),
                    Some(not_allowed.len().to_string()),
                    not_allowed.to_string()
                ),
                "POST {path}"
            );
        }
        // A fresh Observe has no plugin yet: /readyz says so with 503, and HEAD gives the same
        // status and length without the body.
        let (status, _, kind, length, body) = ask(Endpoints::All, "GET", "/readyz").await;
        assert_eq!((status, kind.clone()), (503, plain.clone()));
        assert_eq!(length, Some(body.len().to_string()));
        assert_eq!(
            ask(Endpoints::All, "HEAD", "/readyz").await,
            (503, None, kind, length, String::new())
        );
        let all = "not found: dxdp serves /metrics, /healthz and /readyz\n";
        assert_eq!(
            ask(Endpoints::All, "GET", "/metrics/").await,
            (
                404,
                None,
                plain.clone(),
                Some(all.len().to_string()),
                all.to_string()
            )
        );
        let probes = "not found: this is dxdp's probe endpoint, serving /healthz and /readyz (/metrics is on metrics.address)\n";
        assert_eq!(
            ask(Endpoints::Probes, "GET", "/metrics").await,
            (
                404,
                None,
                plain,
                Some(probes.len().to_string()),
                probes.to_string()
            )
        );
        let (status, _, kind, _, _) = ask(Endpoints::All, "GET", "/metrics").await;
        assert_eq!(
            (status, kind.as_deref()),
            (200, Some(metrics::CONTENT_TYPE))
        );
    }

    /// The probe listener's cap is its own: a metrics listener whose every connection is held
    /// by clients that send nothing leaves the probes answering (issue 36: 128 idle
    /// connections made `/healthz` time out).
    #[tokio::test]
    async fn probes_answer_on_their_own_listener_while_idle_clients_hold_the_metrics_one() {
        let observe = Observe::new();
        let metrics = bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap()
            .with_connection_limit(4);
        let metrics_address = metrics.local_addr();
        let metrics_stats = metrics.stats();
        let probes = bind_for("127.0.0.1:0".parse().unwrap(), Endpoints::Probes)
            .await
            .unwrap();
        let probe_address = probes.local_addr();
        let tasks = [
            tokio::spawn(metrics.serve(observe.clone())),
            tokio::spawn(probes.serve(observe)),
        ];
        let mut idle = Vec::new();
        for _ in 0..8 {
            idle.push(
                tokio::net::TcpStream::connect(metrics_address)
                    .await
                    .unwrap(),
            );
        }
        assert!(metrics_stats.wait_for(WAIT, |s| s.open() == 4).await);
        for _ in 0..5 {
            let mut probe = tokio::net::TcpStream::connect(probe_address).await.unwrap();
            probe
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
                .await
                .unwrap();
            let mut buf = vec![0u8; 512];
            let n = tokio::time::timeout(Duration::from_secs(1), probe.read(&mut buf))
                .await
                .expect("a probe answered within 1 s")
                .unwrap();
            let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        }
        // Metrics are not served there.
        let mut other = tokio::net::TcpStream::connect(probe_address).await.unwrap();
        assert_eq!(ask(&mut other).await, "HTTP/1.1 404 Not Found");
        let r = routes(Endpoints::Probes, Observe::new())
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        for t in tasks {
            t.abort();
        }
    }

    #[tokio::test]
    async fn serve_forever_retries_a_taken_address_and_serves_once_it_is_free() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap();
        let observe = Observe::new();
        let mut listening = observe.listening();
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(serve_forever_with(address, observe, stats.clone()));
        assert!(stats.wait_for(WAIT, |s| s.binds_failed() >= 1).await);
        assert_eq!(*listening.borrow(), None);
        drop(taken);
        let bound = tokio::time::timeout(WAIT, listening.wait_for(Option::is_some))
            .await
            .expect("bound")
            .unwrap()
            .expect("an address");
        assert_eq!(bound, address);
        let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
        assert_eq!(ask(&mut client).await, "HTTP/1.1 404 Not Found");
        task.abort();
    }
}
