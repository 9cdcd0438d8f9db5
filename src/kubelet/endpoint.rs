//! Where a node-local gRPC API is served and how to reach it: a Unix domain socket file, or a
//! Windows named pipe. Shared by the kubelet's PodResources client ([`super::podresources`]) and
//! the container runtime's CRI client ([`super::cri`]).

use std::path::PathBuf;

use crate::transport;

/// Where a node-local gRPC API is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix domain socket file (Linux, and AF_UNIX on Windows).
    Socket(PathBuf),
    /// A Windows named pipe (`\\.\pipe\…`).
    Pipe(String),
}

impl Endpoint {
    /// A named pipe when `text` starts with `\\.\pipe\` (or `//./pipe/`), else a socket path.
    pub fn parse(text: &str) -> Endpoint {
        let lower = text.to_ascii_lowercase();
        if lower.starts_with(r"\\.\pipe\") || lower.starts_with("//./pipe/") {
            Endpoint::Pipe(text.to_string())
        } else {
            Endpoint::Socket(PathBuf::from(text))
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Socket(p) => write!(f, "{}", p.display()),
            Endpoint::Pipe(p) => f.write_str(p),
        }
    }
}

/// An error and its sources, joined with `: ` (tonic's connection errors hide the cause in the
/// chain).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A gRPC channel to `endpoint`.
pub async fn connect(
    endpoint: &Endpoint,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    match endpoint {
        Endpoint::Socket(path) => transport::channel(path).await,
        Endpoint::Pipe(name) => pipe::channel(name).await,
    }
}

#[cfg(windows)]
mod pipe {
    use std::io;
    use std::time::Duration;

    use hyper_util::rt::TokioIo;
    use tonic::transport::{Channel, Endpoint};

    /// `ERROR_PIPE_BUSY`: every instance of the pipe is in use; another comes shortly.
    const ERROR_PIPE_BUSY: i32 = 231;
    /// How often, and how far apart, a busy pipe is tried again (1 s in all).
    const BUSY_RETRIES: u32 = 20;
    const BUSY_PAUSE: Duration = Duration::from_millis(50);

    /// A gRPC channel over the named pipe `name`.
    pub async fn channel(name: &str) -> Result<Channel, tonic::transport::Error> {
        let name = name.to_string();
        Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_| {
                let name = name.clone();
                async move {
                    let mut tries = 0;
                    loop {
                        match tokio::net::windows::named_pipe::ClientOptions::new().open(&name) {
                            Ok(client) => return Ok::<_, io::Error>(TokioIo::new(client)),
                            Err(e)
                                if e.raw_os_error() == Some(ERROR_PIPE_BUSY)
                                    && tries < BUSY_RETRIES =>
                            {
                                tries += 1;
                                tokio::time::sleep(BUSY_PAUSE).await;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
            }))
            .await
    }
}

#[cfg(not(windows))]
mod pipe {
    use tonic::transport::{Channel, Endpoint};

    /// Named pipes exist only on Windows: connecting fails (with tonic's connection error).
    pub async fn channel(name: &str) -> Result<Channel, tonic::transport::Error> {
        let name = name.to_string();
        Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_| {
                let name = name.clone();
                async move {
                    Err::<hyper_util::rt::TokioIo<tokio::net::TcpStream>, _>(std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        format!("{name} is a Windows named pipe"),
                    ))
                }
            }))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_pipes_or_socket_files() {
        assert_eq!(
            Endpoint::parse(r"\\.\pipe\kubelet-pod-resources"),
            Endpoint::Pipe(r"\\.\pipe\kubelet-pod-resources".into())
        );
        assert_eq!(
            Endpoint::parse("//./pipe/containerd-containerd"),
            Endpoint::Pipe("//./pipe/containerd-containerd".into())
        );
        assert_eq!(
            Endpoint::parse("/var/lib/kubelet/pod-resources/kubelet.sock"),
            Endpoint::Socket("/var/lib/kubelet/pod-resources/kubelet.sock".into())
        );
    }

    #[test]
    fn an_error_chain_names_every_cause() {
        #[derive(Debug, thiserror::Error)]
        #[error("transport error")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(
            error_chain(&Outer(std::io::Error::other("access denied"))),
            "transport error: access denied"
        );
    }
}
