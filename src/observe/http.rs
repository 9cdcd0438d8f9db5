//! The HTTP/1.1 server of `--metrics-address`: `/metrics` (OpenMetrics text), `/healthz` and
//! `/readyz`; GET and HEAD only, everything else 404 (unknown path) or 405 (other method).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::state::PING_TIMEOUT;
use super::{metrics, Observe};

const TEXT: &str = "text/plain; charset=utf-8";

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the server cannot listen.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics and probes on {address}: {error}; choose a free address and port with --metrics-address, metrics.address or DXDP_METRICS_ADDRESS (HOST:PORT, e.g. 0.0.0.0:9466), or unset it to turn the endpoint off")]
pub struct BindError {
    /// The address asked for.
    pub address: SocketAddr,
    /// What the OS said.
    pub error: std::io::Error,
}

/// A bound, not yet serving, endpoint.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    address: SocketAddr,
}

/// Listens on `address` (port 0 picks a free port).
pub async fn bind(address: SocketAddr) -> Result<Server, BindError> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|error| BindError { address, error })?;
    let address = listener
        .local_addr()
        .map_err(|error| BindError { address, error })?;
    Ok(Server { listener, address })
}

impl Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Serves `observe` until the returned future is dropped (aborting the task that runs it
    /// closes every connection too).
    pub async fn serve(self, observe: Observe) {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let observe = observe.clone();
                        connections.spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                let observe = observe.clone();
                                async move { Ok::<_, Infallible>(respond(&req, &observe).await) }
                            });
                            let served = hyper::server::conn::http1::Builder::new()
                                .timer(TokioTimer::new())
                                .header_read_timeout(HEADER_TIMEOUT)
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                            if let Err(e) = served {
                                tracing::debug!("metrics connection ended: {e}");
                            }
                        });
                    }
                    Err(e) => {
                        // Out of file descriptors or similar: back off briefly, keep serving.
                        tracing::warn!(address = %self.address, "cannot accept a metrics connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
    response
}

/// The answer to one request.
pub async fn respond(req: &Request<Incoming>, observe: &Observe) -> Response<Full<Bytes>> {
    answer(req.method(), req.uri().path(), observe).await
}

/// The answer to `method` on `path`.
pub async fn answer(method: &Method, path: &str, observe: &Observe) -> Response<Full<Bytes>> {
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
    if !known {
        return text(
            StatusCode::NOT_FOUND,
            "not found: dxdp serves /metrics, /healthz and /readyz\n",
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET or HEAD\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match path {
        "/metrics" => {
            let mut r = text(StatusCode::OK, observe.metrics.encode());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            r
        }
        "/healthz" => match observe.health.check(PING_TIMEOUT).await {
            Ok(what) => text(StatusCode::OK, format!("{what}\n")),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => match observe.readiness.check() {
            Ok(()) => text(StatusCode::OK, "ok\n"),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
    }
}
