//! A client of a plugin socket that connects and never speaks (no HTTP/2 preface): a stopping
//! unit's server cannot finish it gracefully and keeps it until the unit closes its connections
//! (`dxdp::plugin::units::STOP_GRACE`). Plain sockets, read without the async reactor, so that
//! [`Silent::closed`] tells the socket's state at the moment it is called. Shared by the
//! integration tests and the plugin's unit tests.

use std::path::Path;
use std::time::Duration;

#[cfg(unix)]
type RawStream = std::os::unix::net::UnixStream;
#[cfg(windows)]
type RawStream = uds_windows::UnixStream;

/// The silent connection.
pub struct Silent(RawStream);

impl Silent {
    /// Connects to `socket` and waits (at most 10 s) until the server's first bytes (its HTTP/2
    /// settings) arrive: the server accepted the connection.
    pub async fn connect(socket: &Path) -> Silent {
        let socket = socket.to_path_buf();
        tokio::task::spawn_blocking(move || {
            use std::io::Read;
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
        use std::io::Read;
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
