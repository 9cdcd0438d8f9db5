//! AF_UNIX transport for gRPC, the only place that differs between Unix and Windows.
//!
//! The kubelet talks to device plugins over Unix domain socket *files* on both systems. On Unix
//! this is tokio's `UnixListener`/`UnixStream`; tokio has no AF_UNIX on Windows, so there it is
//! `uds_windows` driven by `async-io`, adapted to tokio's I/O traits.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
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

/// A raw connection to the socket at `path`.
pub async fn connect(path: &Path) -> io::Result<Conn> {
    imp::connect(path).await
}

pub use imp::{bind, Conn, Listener};

/// The first pause after a failed `accept` (doubled per failure in a row, up to
/// [`ACCEPT_BACKOFF_MAX`]): at the file-descriptor limit every `accept` fails at once, and
/// retrying without a pause would spin a core and starve the rest of the process.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest pause after failed `accept` calls.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The connections accepted on `listener`, for a gRPC server, until `close` turns true. A failed
/// `accept` (file-descriptor limit, a connection reset before it was accepted) is logged once per
/// distinct error, counted in `accept_errors`, and followed by a pause that doubles per failure in
/// a row ([`ACCEPT_BACKOFF_MIN`] to [`ACCEPT_BACKOFF_MAX`]); it never ends the stream. When
/// `close` turns true, every connection accepted here fails its next read or write, so that the
/// server's connection tasks end and their sockets close even when a client never reads.
pub fn incoming(
    listener: Listener,
    close: tokio::sync::watch::Receiver<bool>,
    accept_errors: Arc<AtomicU64>,
) -> impl tokio_stream::Stream<Item = io::Result<Closable<Conn>>> + Send + 'static {
    let listener = Arc::new(listener);
    accept_loop(
        move || {
            let listener = listener.clone();
            async move { listener.accept().await }
        },
        close,
        accept_errors,
    )
}

/// [`incoming`] over any `accept`.
fn accept_loop<C, A, F>(
    mut accept: A,
    close: tokio::sync::watch::Receiver<bool>,
    accept_errors: Arc<AtomicU64>,
) -> impl tokio_stream::Stream<Item = io::Result<Closable<C>>> + Send + 'static
where
    C: Send + 'static,
    A: FnMut() -> F + Send + 'static,
    F: Future<Output = io::Result<C>> + Send,
{
    async_stream::stream! {
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        loop {
            match accept().await {
                Ok(conn) => {
                    if failures > 0 {
                        tracing::info!("accepting connections again after {failures} failed accept calls");
                    }
                    failures = 0;
                    last_error = None;
                    yield Ok(Closable::new(conn, close.clone()));
                }
                Err(e) => {
                    accept_errors.fetch_add(1, Ordering::Relaxed);
                    failures = failures.saturating_add(1);
                    let text = e.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!("cannot accept a connection: {text}; pausing before the next accept (at the file-descriptor limit, raise it or close connections)");
                        last_error = Some(text);
                    }
                    tokio::time::sleep(accept_backoff(failures)).await;
                }
            }
        }
    }
}

/// The pause after `failures` failed `accept` calls in a row (1 for the first).
pub fn accept_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    ACCEPT_BACKOFF_MIN
        .saturating_mul(1u32 << doublings)
        .min(ACCEPT_BACKOFF_MAX)
}

/// A connection that fails its reads and writes once its `close` signal turns true.
pub struct Closable<C> {
    inner: C,
    closed: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    done: bool,
}

impl<C> Closable<C> {
    /// Wraps `inner`; it fails from the moment `close` turns true (or its sender is gone).
    pub fn new(inner: C, mut close: tokio::sync::watch::Receiver<bool>) -> Self {
        Closable {
            inner,
            closed: Box::pin(async move {
                let _ = close.wait_for(|c| *c).await;
            }),
            done: false,
        }
    }

    /// Whether the close signal came (registers the waker when not).
    fn is_closed(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.done && self.closed.as_mut().poll(cx).is_ready() {
            self.done = true;
        }
        self.done
    }
}

fn closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the server closed this connection (its socket stopped)",
    )
}

impl<C: AsyncRead + Unpin> AsyncRead for Closable<C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.is_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Closable<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.is_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.is_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.is_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<C: Connected> Connected for Closable<C> {
    type ConnectInfo = C::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(unix)]
mod imp {
    use std::io;
    use std::path::Path;

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
        /// The next accepted connection.
        pub async fn accept(&self) -> io::Result<Conn> {
            self.0.accept().await.map(|(conn, _)| conn)
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
        /// The next accepted connection.
        pub async fn accept(&self) -> io::Result<Conn> {
            let (stream, _) = self.0.read_with(|l| l.0.accept()).await?;
            Conn::new(stream)
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

    #[tokio::test(start_paused = true)]
    async fn failed_accepts_pause_with_backoff_and_never_end_the_stream() {
        use tokio_stream::StreamExt;
        let start = tokio::time::Instant::now();
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = calls.clone();
        let errors = Arc::new(AtomicU64::new(0));
        let (_close, closed) = tokio::sync::watch::channel(false);
        let stream = accept_loop(
            move || {
                let seen = seen.clone();
                async move {
                    let n = {
                        let mut c = seen.lock().unwrap();
                        c.push(tokio::time::Instant::now() - start);
                        c.len()
                    };
                    if n <= 5 {
                        Err(io::Error::other("Too many open files (os error 24)"))
                    } else {
                        let (a, _b) = tokio::io::duplex(8);
                        Ok(a)
                    }
                }
            },
            closed,
            errors.clone(),
        );
        tokio::pin!(stream);
        // The first item is the connection: the five failures were absorbed.
        let first = stream.next().await.expect("a connection");
        assert!(first.is_ok());
        assert_eq!(errors.load(Ordering::Relaxed), 5);
        let at: Vec<u64> = calls
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.as_millis() as u64)
            .collect();
        // Pauses of 5, 10, 20, 40 and 80 ms after the failures.
        assert_eq!(at, [0, 5, 15, 35, 75, 155]);
        assert_eq!(accept_backoff(20), ACCEPT_BACKOFF_MAX);
    }

    #[tokio::test]
    async fn a_closed_connection_fails_its_reads_and_writes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = tokio::io::duplex(64);
        let (close, closed) = tokio::sync::watch::channel(false);
        let mut conn = Closable::new(a, closed);
        conn.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        b.read_exact(&mut buf).await.unwrap();
        close.send_replace(true);
        let err = conn.write_all(b"x").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        assert!(conn.read(&mut buf).await.is_err());
    }
}
