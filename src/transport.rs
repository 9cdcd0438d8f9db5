//! The transport under the daemon: how a socket *file* is bound, dialled and probed, and the
//! [`Endpoint`] of a node-local API (a socket file or a named pipe).
//!
//! The kubelet talks to device plugins over Unix domain socket files on both systems, and that
//! is the only transport the `dxdp` binary uses ([`Transport::UnixSocket`]): on Unix tokio's
//! `UnixListener`/`UnixStream`; tokio has no AF_UNIX on Windows, so there it is `uds_windows`
//! driven by `async-io`, adapted to tokio's I/O traits.
//!
//! [`Transport::Loopback`] exists for tests where AF_UNIX does not (Wine 8 has none): the
//! listener is loopback TCP, and the socket path is still a file, written at bind time with the
//! port in it, so that everything the daemon does with socket *files* (stale-file removal, the
//! file watch that notices a kubelet restart, the one-daemon-per-directory probe) runs for real.
//! Nothing in the command line selects it: only code that builds a
//! [`PluginConfig`](crate::plugin::PluginConfig) or a kubelet stand-in by hand can.

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
use tonic::transport::Channel;

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
    pub(crate) fn parse(text: &str) -> Endpoint {
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

/// `sun_path` holds 108 bytes including the terminating NUL.
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// Why a socket path cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("socket path {} is {len} bytes; AF_UNIX allows at most {MAX_SOCKET_PATH}: use a shorter --kubelet-dir", path.display())]
pub struct SocketPathTooLong {
    /// The path.
    pub(crate) path: PathBuf,
    /// Its length in bytes.
    pub(crate) len: usize,
}

/// Checks that `path` fits in `sun_path`.
pub(crate) fn check_socket_path(path: &Path) -> Result<(), SocketPathTooLong> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(SocketPathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    Ok(())
}

/// How socket files are bound and dialled: AF_UNIX in production, loopback TCP behind the same
/// files in tests that run where AF_UNIX is missing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// AF_UNIX sockets, as the kubelet uses: the only transport of the `dxdp` binary.
    #[default]
    UnixSocket,
    /// Loopback TCP, addressed through a file at the socket path (for tests; see the module
    /// documentation).
    Loopback,
}

impl Transport {
    /// Binds a listener at `path`, which must not exist (as for an AF_UNIX socket, an existing
    /// file fails with [`io::ErrorKind::AddrInUse`]).
    pub fn bind(self, path: &Path) -> io::Result<Listener> {
        match self {
            Transport::UnixSocket => imp::bind(path).map(Listener::Unix),
            Transport::Loopback => loopback::bind(path).map(Listener::Loopback),
        }
    }

    /// A raw connection to the listener at `path`.
    pub async fn connect(self, path: &Path) -> io::Result<Conn> {
        match self {
            Transport::UnixSocket => imp::connect(path).await.map(Conn::Unix),
            Transport::Loopback => loopback::connect(path).await.map(Conn::Loopback),
        }
    }

    /// Whether something accepts connections at `path` (a stale socket file left by a dead
    /// process refuses them).
    pub(crate) async fn probe(self, path: &Path) -> io::Result<()> {
        self.connect(path).await.map(drop)
    }

    /// A gRPC channel to the listener at `path` (the address in the URI is not used).
    pub async fn channel(self, path: &Path) -> Result<Channel, tonic::transport::Error> {
        let path = path.to_path_buf();
        tonic::transport::Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move { Ok::<_, io::Error>(TokioIo::new(self.connect(&path).await?)) }
            }))
            .await
    }
}

/// A listener of a [`Transport`].
#[derive(Debug)]
pub enum Listener {
    /// An AF_UNIX socket.
    Unix(imp::Listener),
    /// A loopback TCP listener.
    Loopback(tokio::net::TcpListener),
}

impl Listener {
    /// The next accepted connection.
    pub async fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Unix(l) => l.accept().await.map(Conn::Unix),
            Listener::Loopback(l) => {
                let (conn, _) = l.accept().await?;
                conn.set_nodelay(true)?;
                Ok(Conn::Loopback(conn))
            }
        }
    }
}

/// A connection of a [`Transport`], accepted or dialled.
#[derive(Debug)]
pub enum Conn {
    /// An AF_UNIX stream.
    Unix(imp::Conn),
    /// A loopback TCP stream.
    Loopback(tokio::net::TcpStream),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(c) => Pin::new(c).poll_read(cx, buf),
            Conn::Loopback(c) => Pin::new(c).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(c) => Pin::new(c).poll_write(cx, buf),
            Conn::Loopback(c) => Pin::new(c).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(c) => Pin::new(c).poll_write_vectored(cx, bufs),
            Conn::Loopback(c) => Pin::new(c).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Unix(c) => c.is_write_vectored(),
            Conn::Loopback(c) => c.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(c) => Pin::new(c).poll_flush(cx),
            Conn::Loopback(c) => Pin::new(c).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(c) => Pin::new(c).poll_shutdown(cx),
            Conn::Loopback(c) => Pin::new(c).poll_shutdown(cx),
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// The first pause after a failed `accept` (doubled per failure in a row, up to
/// [`ACCEPT_BACKOFF_MAX`]): at the file-descriptor limit every `accept` fails at once, and
/// retrying without a pause would spin a core and starve the rest of the process.
pub(crate) const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest pause after failed `accept` calls.
pub(crate) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The connections accepted on `listener`, for a gRPC server, until `close` turns true. A failed
/// `accept` (file-descriptor limit, a connection reset before it was accepted) is logged once per
/// distinct error, counted in `accept_errors`, and followed by a pause that doubles per failure in
/// a row ([`ACCEPT_BACKOFF_MIN`] to [`ACCEPT_BACKOFF_MAX`]); it never ends the stream. When
/// `close` turns true, every connection accepted here fails its next read or write, so that the
/// server's connection tasks end and their sockets close even when a client never reads; the
/// sender's [`closed`](tokio::sync::watch::Sender::closed) then tells when the stream and every
/// connection it accepted are dropped.
pub(crate) fn incoming(
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

/// [`incoming`] over any `accept` (a named pipe server's, say).
pub(crate) fn accept_loop<C, A, F>(
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

/// A gRPC server on a socket of this module, as the stand-ins (kubelet, PodResources, CRI) run
/// one: it serves `router` until [`Served::stop`], then closes the connections it accepted.
pub struct Served {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    /// Serves `router` on `listener` in a task of its own.
    pub fn spawn(listener: Listener, router: tonic::transport::server::Router) -> Self {
        let listener = Arc::new(listener);
        Self::spawn_accepting(
            move || {
                let listener = listener.clone();
                async move { listener.accept().await }
            },
            router,
        )
    }

    /// Serves `router` on the connections `accept` returns, in a task of its own.
    pub(crate) fn spawn_accepting<C, A, F>(
        accept: A,
        router: tonic::transport::server::Router,
    ) -> Self
    where
        C: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        A: FnMut() -> F + Send + 'static,
        F: Future<Output = io::Result<C>> + Send,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (close, closed) = tokio::sync::watch::channel(false);
        let incoming = accept_loop(accept, closed, Arc::default());
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            close.send_replace(true);
        });
        Served {
            stop: Some(stop),
            task,
        }
    }

    /// Stops serving and waits for the server to end: at most `limit` (then it is aborted), or
    /// as long as it takes with `None`.
    pub async fn stop(&mut self, limit: Option<Duration>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match limit {
            None => {
                let _ = (&mut self.task).await;
            }
            Some(limit) => {
                let abort = self.task.abort_handle();
                if tokio::time::timeout(limit, &mut self.task).await.is_err() {
                    abort.abort();
                }
            }
        }
    }
}

/// The pause after `failures` failed `accept` calls in a row (1 for the first).
pub(crate) fn accept_backoff(failures: u32) -> Duration {
    crate::util::retry::Backoff::pauses(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX).base(failures)
}

/// A connection that fails its reads and writes once its `close` signal turns true.
///
/// It holds a receiver of that signal until it is dropped, so the sender's
/// [`closed`](tokio::sync::watch::Sender::closed) completes only once every connection given
/// the signal (and the accept stream of [`incoming`], which holds one too) is gone.
pub(crate) struct Closable<C> {
    inner: C,
    closed: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    done: bool,
    _open: tokio::sync::watch::Receiver<bool>,
}

impl<C> Closable<C> {
    /// Wraps `inner`; it fails from the moment `close` turns true (or its sender is gone).
    pub(crate) fn new(inner: C, close: tokio::sync::watch::Receiver<bool>) -> Self {
        let mut signal = close.clone();
        Closable {
            inner,
            closed: Box::pin(async move {
                let _ = signal.wait_for(|c| *c).await;
            }),
            done: false,
            _open: close,
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

/// AF_UNIX sockets on Unix (tokio).
#[cfg(unix)]
pub(crate) mod imp {
    use std::io;
    use std::path::Path;

    /// An accepted connection.
    pub(crate) type Conn = tokio::net::UnixStream;

    /// A listening socket.
    #[derive(Debug)]
    pub struct Listener(tokio::net::UnixListener);

    /// Binds a listening socket at `path` (which must not exist).
    pub(crate) fn bind(path: &Path) -> io::Result<Listener> {
        tokio::net::UnixListener::bind(path).map(Listener)
    }

    impl Listener {
        /// The next accepted connection.
        pub(crate) async fn accept(&self) -> io::Result<Conn> {
            self.0.accept().await.map(|(conn, _)| conn)
        }
    }

    /// A connection to the socket at `path`.
    pub(crate) async fn connect(path: &Path) -> io::Result<Conn> {
        tokio::net::UnixStream::connect(path).await
    }
}

/// AF_UNIX sockets on Windows (`uds_windows` driven by `async-io`).
#[cfg(windows)]
pub(crate) mod imp {
    use std::io;
    use std::os::windows::io::{AsRawSocket, AsSocket, BorrowedSocket};
    use std::path::Path;

    use async_io::Async;
    use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};

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
    pub struct SocketStream(uds_windows::UnixStream);

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

    /// An accepted or connected AF_UNIX stream with tokio's I/O traits (through the `futures`
    /// ones `async-io` gives).
    pub type Conn = Compat<Async<SocketStream>>;

    fn conn(stream: uds_windows::UnixStream) -> io::Result<Conn> {
        Ok(Async::new(SocketStream(stream))?.compat())
    }

    /// A listening socket.
    #[derive(Debug)]
    pub struct Listener(Async<SocketListener>);

    /// Binds a listening socket at `path` (which must not exist).
    pub(crate) fn bind(path: &Path) -> io::Result<Listener> {
        let listener = uds_windows::UnixListener::bind(path)?;
        Ok(Listener(Async::new(SocketListener(listener))?))
    }

    impl Listener {
        /// The next accepted connection.
        pub(crate) async fn accept(&self) -> io::Result<Conn> {
            let (stream, _) = self.0.read_with(|l| l.0.accept()).await?;
            conn(stream)
        }
    }

    /// A connection to the socket at `path`.
    pub(crate) async fn connect(path: &Path) -> io::Result<Conn> {
        let path = path.to_path_buf();
        let stream = tokio::task::spawn_blocking(move || uds_windows::UnixStream::connect(path))
            .await
            .map_err(io::Error::other)??;
        conn(stream)
    }
}

/// Loopback TCP behind a file at the socket path, for [`Transport::Loopback`].
mod loopback {
    use std::io::{self, Write};
    use std::net::{Ipv4Addr, SocketAddr};
    use std::path::Path;

    /// The first word of an address file; anything else at the path refuses connections.
    const MAGIC: &str = "dxdp-loopback-transport";

    /// Listens on 127.0.0.1 (a port the OS picks) and writes the address to a new file at
    /// `path`: an existing file fails as `bind` on an AF_UNIX socket does.
    pub(crate) fn bind(path: &Path) -> io::Result<tokio::net::TcpListener> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => io::Error::new(io::ErrorKind::AddrInUse, e),
                _ => e,
            })?;
        file.write_all(format!("{MAGIC} {addr}\n").as_bytes())?;
        tokio::net::TcpListener::from_std(listener)
    }

    /// The address in the file at `path`: missing is `NotFound`, anything but a complete address
    /// file (still being written, or not ours) is `ConnectionRefused`.
    pub(crate) fn address(path: &Path) -> io::Result<SocketAddr> {
        let text = std::fs::read_to_string(path)?;
        text.strip_prefix(MAGIC)
            .and_then(|rest| rest.strip_suffix('\n'))
            .and_then(|addr| addr.trim().parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "{} is not a loopback transport address file",
                        path.display()
                    ),
                )
            })
    }

    /// A connection to the listener whose address file is `path`.
    pub(crate) async fn connect(path: &Path) -> io::Result<tokio::net::TcpStream> {
        let addr = address(path)?;
        let conn = tokio::net::TcpStream::connect(addr).await?;
        conn.set_nodelay(true)?;
        Ok(conn)
    }
}

/// What the crate's unit tests of the daemon's parts run on.
#[cfg(test)]
pub(crate) mod testing {
    use super::Transport;

    /// AF_UNIX where it works (Linux, Windows), the loopback transport where it does not (Wine
    /// 8), said once per test binary so that a run shows which one it tested;
    /// `DXDP_TEST_TRANSPORT=loopback` asks for the loopback transport anywhere.
    pub(crate) fn transport() -> Transport {
        static CHOSEN: std::sync::OnceLock<Transport> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            if std::env::var("DXDP_TEST_TRANSPORT").as_deref() == Ok("loopback") {
                eprintln!("daemon tests run over the loopback transport (DXDP_TEST_TRANSPORT=loopback)");
                return Transport::Loopback;
            }
            let dir = socket_dir();
            match super::imp::bind(&dir.path().join("probe.sock")) {
                Ok(_) => Transport::UnixSocket,
                Err(e) => {
                    eprintln!("daemon tests run over the loopback transport: AF_UNIX sockets are not available here ({e})");
                    Transport::Loopback
                }
            }
        })
    }

    /// A temporary directory short enough for AF_UNIX socket paths.
    pub(crate) fn socket_dir() -> tempfile::TempDir {
        #[cfg(unix)]
        let base = std::path::PathBuf::from("/tmp");
        #[cfg(not(unix))]
        let base = std::env::temp_dir();
        tempfile::Builder::new()
            .prefix("dxdp")
            .tempdir_in(base)
            .unwrap_or_else(|e| panic!("temporary directory: {e}"))
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
    async fn the_close_signal_tells_when_every_connection_is_dropped() {
        use futures_util::FutureExt;
        use tokio::io::AsyncReadExt;
        let (close, closed) = tokio::sync::watch::channel(false);
        let (a, _a) = tokio::io::duplex(8);
        let (b, _b) = tokio::io::duplex(8);
        let mut first = Closable::new(a, closed.clone());
        let second = Closable::new(b, closed);
        close.send_replace(true);
        // The first one saw the signal (its read fails), yet it is still there.
        let mut buf = [0u8; 1];
        assert!(first.read(&mut buf).await.is_err());
        assert!(close.closed().now_or_never().is_none());
        drop(first);
        assert!(close.closed().now_or_never().is_none(), "one is left");
        drop(second);
        assert!(close.closed().now_or_never().is_some());
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

    /// What the daemon relies on of a socket file, checked for both transports: a second bind
    /// on the same path fails, a dial reaches the listener, a missing file is `NotFound`, and a
    /// file whose listener is gone refuses connections.
    async fn socket_file_contract(transport: Transport) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        let listener = transport.bind(&path).unwrap();
        assert!(
            path.exists(),
            "{transport:?}: bind leaves a file at the path"
        );
        let again = transport.bind(&path).unwrap_err();
        assert_eq!(
            again.kind(),
            io::ErrorKind::AddrInUse,
            "{transport:?}: {again}"
        );
        let (accepted, dialled) = tokio::join!(listener.accept(), transport.connect(&path));
        let (mut accepted, mut dialled) = (accepted.unwrap(), dialled.unwrap());
        dialled.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        let missing = transport
            .connect(&dir.path().join("none.sock"))
            .await
            .unwrap_err();
        assert_eq!(
            missing.kind(),
            io::ErrorKind::NotFound,
            "{transport:?}: {missing}"
        );
        drop(listener);
        let stale = transport.probe(&path).await.unwrap_err();
        assert_eq!(
            stale.kind(),
            io::ErrorKind::ConnectionRefused,
            "{transport:?}: {stale}"
        );
    }

    #[tokio::test]
    async fn loopback_behaves_as_a_socket_file() {
        socket_file_contract(Transport::Loopback).await;
    }

    #[tokio::test]
    async fn unix_sockets_behave_as_the_loopback_transport_assumes() {
        let dir = tempfile::tempdir().unwrap();
        if let Err(e) = imp::bind(&dir.path().join("probe.sock")) {
            eprintln!("skipped unix_sockets_behave_as_the_loopback_transport_assumes: AF_UNIX sockets are not available here ({e})");
            return;
        }
        socket_file_contract(Transport::UnixSocket).await;
    }

    #[tokio::test]
    async fn a_file_that_is_no_address_file_refuses_connections() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("empty", ""),
            ("half", "dxdp-loopback-transport 127.0.0.1:"),
            ("other", "something else 127.0.0.1:80\n"),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let err = Transport::Loopback.connect(&path).await.unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::ConnectionRefused,
                "{name}: {err}"
            );
        }
    }
}
