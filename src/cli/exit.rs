//! The exit codes of every command, in one place (documented per command in docs/tools.md and
//! `dxdp --help`).
//!
//! | Code | Meaning |
//! |---|---|
//! | 0 | success; for a check (`doctor`, `hcs`, `audit`, `config check`): passed |
//! | 1 | an error (a file that cannot be read, a daemon that stopped on a failure); for a check: it failed (what it found is printed) |
//! | 2 | usage error: an unknown option or a bad option value (clap's code) |
//! | 3 | a check could not tell: it could not collect what it judges (why is printed) |
//!
//! `mounts --run` exits with `ctr`'s own exit code.

use std::process::ExitCode;

/// An error, or a check that failed.
pub(crate) const FAILED: u8 = 1;
/// A usage error (clap exits with this code on its own; a bad log level too).
pub(crate) const USAGE: u8 = 2;
/// A check could not tell.
pub(crate) const COULD_NOT_TELL: u8 = 3;

/// The text appended to the long help of every command: its exit codes.
pub(crate) const HELP: &str = "Exit codes: 0 success, 1 error, 2 usage error.";

/// An error in how a command was asked (no device selected, a selector that is not one): the
/// command exits with [`USAGE`], as for clap's own usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// `code` as an [`ExitCode`].
pub(crate) fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn could_not_tell_is_not_a_usage_error() {
        assert_eq!(
            [FAILED, COULD_NOT_TELL],
            [1, 3],
            "documented in docs/tools.md#exit-codes"
        );
        // 2 is clap's, for every usage error.
        let usage = clap::Error::new(clap::error::ErrorKind::InvalidValue).exit_code();
        assert_eq!(i32::from(USAGE), usage);
        assert_ne!(i32::from(COULD_NOT_TELL), usage);
    }
}
