//! A client of a plugin socket that connects and never speaks (no HTTP/2 preface): a stopping
//! device-plugin server's gRPC server cannot finish it gracefully and keeps it until the server
//! closes its connections (`dxdp::plugin::servers::STOP_GRACE`). Plain sockets, read without the
//! async reactor, so that [`Silent::closed`] tells the socket's state at the moment it is called.
//! Shared by the integration tests and the plugin's unit tests. A socket file of the loopback
//! transport (the daemon tests under Wine) is dialled over TCP at the address it holds.

use std::path::Path;
use std::time::Duration;

#[cfg(unix)]
type UnixStream = std::os::unix::net::UnixStream;
#[cfg(windows)]
type UnixStream = uds_windows::UnixStream;

/// An AF_UNIX or a loopback TCP stream.
enum RawStream {
    Unix(UnixStream),
    Tcp(std::net::TcpStream),
}

impl RawStream {
    /// The loopback transport writes `dxdp-loopback-transport <address>` into its socket files.
    fn connect(socket: &Path) -> std::io::Result<RawStream> {
        let text = std::fs::read(socket).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        match text.strip_prefix("dxdp-loopback-transport ") {
            Some(addr) => {
                let addr: std::net::SocketAddr =
                    addr.trim().parse().map_err(std::io::Error::other)?;
                std::net::TcpStream::connect(addr).map(RawStream::Tcp)
            }
            None => UnixStream::connect(socket).map(RawStream::Unix),
        }
    }

    fn set_read_timeout(&self, limit: Option<Duration>) -> std::io::Result<()> {
        match self {
            RawStream::Unix(s) => s.set_read_timeout(limit),
            RawStream::Tcp(s) => s.set_read_timeout(limit),
        }
    }

    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            RawStream::Unix(s) => s.set_nonblocking(on),
            RawStream::Tcp(s) => s.set_nonblocking(on),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::Read;
        match self {
            RawStream::Unix(s) => s.read(buf),
            RawStream::Tcp(s) => s.read(buf),
        }
    }
}

/// The silent connection.
pub struct Silent(RawStream);

impl Silent {
    /// Connects to `socket` and waits (at most 10 s) until the server's first bytes (its HTTP/2
    /// settings) arrive: the server accepted the connection.
    pub async fn connect(socket: &Path) -> Silent {
        let socket = socket.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut stream = RawStream::connect(&socket).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut buf = [0u8; 256];
            let n = stream.read(&mut buf).expect("the server's first bytes");
            assert!(n > 0, "the server closed the connection at once");
            stream.set_nonblocking(true).unwrap();
            Silent(stream)
        })
        .await
        .unwrap()
    }

    /// Whether the server has closed the connection (reading, without blocking, what it sent).
    pub fn closed(&mut self) -> bool {
        let mut buf = [0u8; 1024];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }
}
