//! How to reach a node-local gRPC API at its [`Endpoint`] (a Unix domain socket file, or a
//! Windows named pipe). Shared by the kubelet's PodResources client ([`super::podresources`]) and
//! the container runtime's CRI client ([`super::cri`]), and by their stand-ins, which [`serve`]
//! on the same kinds of endpoint (a real named pipe on Windows, under Wine too).

use std::io;

use crate::transport::Endpoint;
use crate::transport::{self, Transport};

/// A gRPC channel to `endpoint`.
pub(crate) async fn connect(
    endpoint: &Endpoint,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    match endpoint {
        Endpoint::Socket(path) => Transport::UnixSocket.channel(path).await,
        Endpoint::Pipe(name) => pipe::channel(name).await,
    }
}

/// Serves `router` at `endpoint` until the returned server is stopped: on a socket file
/// (replacing a stale one, creating its directory), or on a named pipe (Windows only; the first
/// instance is created before this returns, so a client can connect at once).
pub fn serve(
    endpoint: &Endpoint,
    router: tonic::transport::server::Router,
) -> io::Result<transport::Served> {
    match endpoint {
        Endpoint::Socket(path) => {
            transport::check_socket_path(path).map_err(io::Error::other)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let _ = std::fs::remove_file(path);
            let listener = Transport::UnixSocket.bind(path)?;
            Ok(transport::Served::spawn(listener, router))
        }
        Endpoint::Pipe(name) => pipe::serve(name, router),
    }
}

#[cfg(windows)]
mod pipe {
    use std::io;
    use std::time::Duration;

    use hyper_util::rt::TokioIo;
    use tokio::net::windows::named_pipe::{ClientOptions, NamedPipeClient};
    use tonic::transport::{Channel, Endpoint};

    pub(crate) use super::pipe_server::serve;

    /// `ERROR_PIPE_BUSY`: every instance of the pipe is in use; another comes shortly.
    pub(crate) const ERROR_PIPE_BUSY: i32 = 231;
    /// How often, and how far apart, a busy pipe is tried again (1 s in all).
    const BUSY_RETRIES: u32 = 20;
    const BUSY_PAUSE: Duration = Duration::from_millis(50);

    /// A gRPC channel over the named pipe `name`.
    pub(crate) async fn channel(name: &str) -> Result<Channel, tonic::transport::Error> {
        let name = name.to_string();
        Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_| {
                let name = name.clone();
                async move { open(&name).await.map(TokioIo::new) }
            }))
            .await
    }

    /// Opens the named pipe `name`, trying again while every instance is busy (1 s in all).
    pub(crate) async fn open(name: &str) -> io::Result<NamedPipeClient> {
        let mut tries = 0;
        loop {
            match ClientOptions::new().open(name) {
                Ok(client) => {
                    use std::os::windows::io::AsRawHandle;
                    crate::util::host_acl::check_pipe_server(client.as_raw_handle(), name)
                        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
                    return Ok(client);
                }
                Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) && tries < BUSY_RETRIES => {
                    tries += 1;
                    tokio::time::sleep(BUSY_PAUSE).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(windows)]
mod pipe_server {
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};
    use tonic::transport::server::Connected;

    use crate::transport;

    /// A connected instance of a named pipe.
    pub(crate) struct PipeConn(NamedPipeServer);

    impl AsyncRead for PipeConn {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for PipeConn {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    impl Connected for PipeConn {
        type ConnectInfo = ();

        fn connect_info(&self) -> Self::ConnectInfo {}
    }

    /// Serves `router` on the named pipe `name`: one instance waits for a client at a time, and
    /// the next is created as soon as one connects.
    pub(crate) fn serve(
        name: &str,
        router: tonic::transport::server::Router,
    ) -> io::Result<transport::Served> {
        let first = ServerOptions::new()
            .first_pipe_instance(true)
            .create(name)?;
        let waiting = Arc::new(tokio::sync::Mutex::new(Some(first)));
        let name = name.to_string();
        Ok(transport::Served::spawn_accepting(
            move || {
                let (waiting, name) = (waiting.clone(), name.clone());
                async move {
                    let mut slot = waiting.lock().await;
                    let server = match slot.take() {
                        Some(server) => server,
                        None => ServerOptions::new().create(&name)?,
                    };
                    server.connect().await?;
                    // The next instance, before this one is handed out; if it cannot be made,
                    // the next accept tries again.
                    match ServerOptions::new().create(&name) {
                        Ok(next) => *slot = Some(next),
                        Err(e) => {
                            tracing::warn!(pipe = %name, "cannot create the next pipe instance: {e}")
                        }
                    }
                    Ok(PipeConn(server))
                }
            },
            router,
        ))
    }
}

#[cfg(not(windows))]
mod pipe {
    use tonic::transport::{Channel, Endpoint};

    /// Named pipes exist only on Windows.
    pub(crate) fn serve(
        name: &str,
        _: tonic::transport::server::Router,
    ) -> std::io::Result<crate::transport::Served> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("{name} is a Windows named pipe"),
        ))
    }

    /// Named pipes exist only on Windows: connecting fails (with tonic's connection error).
    pub(crate) async fn channel(name: &str) -> Result<Channel, tonic::transport::Error> {
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

/// Endpoints for the crate's Windows tests (named pipes).
#[cfg(all(test, windows))]
pub(crate) mod testing {
    use std::path::Path;

    use super::Endpoint;

    /// Where a node-local API is served in a test, as on a node: a socket file `name` in `dir`
    /// on Unix, a named pipe unique to this process and moment on Windows (whose name ends in
    /// `name`).
    pub(crate) fn local(dir: &Path, name: &str) -> Endpoint {
        if cfg!(windows) {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            Endpoint::Pipe(format!(
                r"\\.\pipe\dxdp-test-{}-{nanos}-{name}",
                std::process::id()
            ))
        } else {
            Endpoint::Socket(dir.join(name))
        }
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

    /// The client of a real named pipe: a pipe that does not exist fails at once with the
    /// system's "file not found" (os error 2), naming nothing it cannot know; a pipe whose only
    /// instance is busy is tried again until the instance listens again, and fails with
    /// `ERROR_PIPE_BUSY` when it never does within the second of retries.
    #[cfg(windows)]
    #[tokio::test]
    async fn a_missing_pipe_fails_and_a_busy_one_is_tried_again() {
        use std::path::Path;
        use std::time::Duration;
        use tokio::net::windows::named_pipe::ServerOptions;

        let Endpoint::Pipe(missing) = testing::local(Path::new("."), "missing") else {
            unreachable!("pipes on Windows")
        };
        let started = std::time::Instant::now();
        let err = pipe::open(&missing).await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(2), "{err}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "no retry for a missing pipe"
        );
        let err = connect(&Endpoint::Pipe(missing.clone())).await.unwrap_err();
        assert!(
            crate::util::errors::chain(&err).contains("os error 2"),
            "{}",
            crate::util::errors::chain(&err)
        );

        // One instance, taken by a first client: the second client waits for it.
        let Endpoint::Pipe(name) = testing::local(Path::new("."), "busy") else {
            unreachable!("pipes on Windows")
        };
        let server = ServerOptions::new()
            .first_pipe_instance(true)
            .max_instances(1)
            .create(&name)
            .unwrap();
        let first = pipe::open(&name).await.unwrap();
        server.connect().await.unwrap();
        let started = std::time::Instant::now();
        let err = pipe::open(&name).await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(pipe::ERROR_PIPE_BUSY), "{err}");
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "retried for a second: {:?}",
            started.elapsed()
        );
        // Freed while the second client retries: it gets the instance.
        let second = tokio::spawn({
            let name = name.clone();
            async move { pipe::open(&name).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(first);
        server.disconnect().unwrap();
        let (connected, second) = tokio::join!(server.connect(), second);
        connected.unwrap();
        second
            .unwrap()
            .expect("the busy pipe, once free, is opened");
    }
}
