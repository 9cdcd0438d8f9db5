//! AF_UNIX transport for gRPC, the only place that differs between Unix and Windows.
//!
//! The kubelet talks to device plugins over Unix domain socket *files* on both systems. On Unix
//! this is tokio's `UnixListener`/`UnixStream`; tokio has no AF_UNIX on Windows, so there it is
//! `uds_windows` driven by `async-io`, adapted to tokio's I/O traits.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// `sun_path` holds 108 bytes including the terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// Why a socket path cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("socket path {} is {len} bytes; AF_UNIX allows at most {MAX_SOCKET_PATH}: use a shorter --kubelet-dir", path.display())]
pub struct SocketPathTooLong {
    /// The path.
    pub path: PathBuf,
    /// Its length in bytes.
    pub len: usize,
}

/// Checks that `path` fits in `sun_path`.
pub fn check_socket_path(path: &Path) -> Result<(), SocketPathTooLong> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(SocketPathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    Ok(())
}

/// A gRPC channel to the socket at `path` (the address in the URI is not used).
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(imp::connect(&path).await?)) }
        }))
        .await
}

/// Whether something accepts connections on the socket at `path` (a stale socket file left by
/// a dead process refuses them).
pub async fn probe(path: &Path) -> io::Result<()> {
    imp::connect(path).await.map(drop)
}

pub use imp::{bind, Conn, Listener};

#[cfg(unix)]
mod imp {
    use std::io;
    use std::path::Path;

    use tokio_stream::wrappers::UnixListenerStream;
    use tokio_stream::Stream;

    /// An accepted connection.
    pub type Conn = tokio::net::UnixStream;

    /// A listening socket.
    #[derive(Debug)]
    pub struct Listener(tokio::net::UnixListener);

    /// Binds a listening socket at `path` (which must not exist).
    pub fn bind(path: &Path) -> io::Result<Listener> {
        tokio::net::UnixListener::bind(path).map(Listener)
    }

    impl Listener {
        /// The stream of accepted connections.
        pub fn incoming(self) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
            UnixListenerStream::new(self.0)
        }
    }

    pub(super) async fn connect(path: &Path) -> io::Result<Conn> {
        tokio::net::UnixStream::connect(path).await
    }
}

#[cfg(windows)]
mod imp {
    use std::io;
    use std::os::windows::io::{AsRawSocket, AsSocket, BorrowedSocket};
    use std::path::Path;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use async_io::Async;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_stream::Stream;
    use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};
    use tonic::transport::server::Connected;

    /// `uds_windows::UnixListener` lacks `AsSocket`, which `async-io` needs.
    #[derive(Debug)]
    struct SocketListener(uds_windows::UnixListener);

    impl AsSocket for SocketListener {
        fn as_socket(&self) -> BorrowedSocket<'_> {
            // SAFETY: the socket is owned by self.0 and lives as long as the borrow of self.
            unsafe { BorrowedSocket::borrow_raw(self.0.as_raw_socket()) }
        }
    }

    /// `uds_windows::UnixStream` with the `IoSafe` marker `async-io` needs for owned I/O.
    #[derive(Debug)]
    struct SocketStream(uds_windows::UnixStream);

    // SAFETY: `SocketStream` never closes or replaces its socket while borrowed; it is only read,
    // written and dropped, which is what `IoSafe` requires.
    unsafe impl async_io::IoSafe for SocketStream {}

    impl AsSocket for SocketStream {
        fn as_socket(&self) -> BorrowedSocket<'_> {
            self.0.as_socket()
        }
    }

    impl io::Read for SocketStream {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.0.read(buf)
        }
    }

    impl io::Write for SocketStream {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.write(buf)
        }

        fn flush(&mut self) -> io::Result<()> {
            self.0.flush()
        }
    }

    /// An accepted or connected AF_UNIX stream with tokio's I/O traits.
    #[derive(Debug)]
    pub struct Conn(Compat<Async<SocketStream>>);

    impl Conn {
        fn new(stream: uds_windows::UnixStream) -> io::Result<Self> {
            Ok(Conn(FuturesAsyncReadCompatExt::compat(Async::new(
                SocketStream(stream),
            )?)))
        }
    }

    impl AsyncRead for Conn {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Conn {
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

    impl Connected for Conn {
        type ConnectInfo = ();

        fn connect_info(&self) -> Self::ConnectInfo {}
    }

    /// A listening socket.
    #[derive(Debug)]
    pub struct Listener(Async<SocketListener>);

    /// Binds a listening socket at `path` (which must not exist).
    pub fn bind(path: &Path) -> io::Result<Listener> {
        let listener = uds_windows::UnixListener::bind(path)?;
        Ok(Listener(Async::new(SocketListener(listener))?))
    }

    impl Listener {
        /// The stream of accepted connections.
        pub fn incoming(self) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
            async_stream::stream! {
                loop {
                    match self.0.read_with(|l| l.0.accept()).await {
                        Ok((stream, _)) => yield Conn::new(stream),
                        Err(e) => yield Err(e),
                    }
                }
            }
        }
    }

    pub(super) async fn connect(path: &Path) -> io::Result<Conn> {
        let path = path.to_path_buf();
        let stream = tokio::task::spawn_blocking(move || uds_windows::UnixStream::connect(path))
            .await
            .map_err(io::Error::other)??;
        Conn::new(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_path_limit() {
        let ok = PathBuf::from(format!("/{}", "a".repeat(MAX_SOCKET_PATH - 1)));
        let long = PathBuf::from(format!("/{}", "a".repeat(MAX_SOCKET_PATH)));
        assert!(check_socket_path(&ok).is_ok());
        let err = check_socket_path(&long).unwrap_err().to_string();
        assert!(err.contains("108") || err.contains("107"), "{err}");
        assert!(err.contains("--kubelet-dir"));
    }
}
