//! Who may change the host files dxdp trusts (Windows; nothing to do elsewhere).
//!
//! A tenant of a shared GPU node can be assumed to reach the node (process isolation is not a
//! security boundary), so what dxdp reads and runs from the host must be beyond a local user's
//! reach:
//! - [`check_owner`]: a file dxdp reads as configuration (the configuration file, the web
//!   configuration and the certificates it names, the kept configuration) or a directory it
//!   writes into must be owned by SYSTEM, the Administrators group or the account dxdp runs
//!   as. A file any other account owns was placed by that account and is refused, naming the
//!   owner and what to do.
//! - [`protect_dir`]: a directory dxdp creates on the host (`%ProgramData%\dxdp`, its lock
//!   directory, the validation directory the validation Job mounts) gets a protected access
//!   list: full control for SYSTEM and Administrators only, read and execute for everyone where
//!   a container must read it ([`Readers::Everyone`]). Without it the directory inherits what
//!   its parent grants (`C:\` lets every signed-in user create files in new directories), and
//!   a local user could plant a DLL beside the validation executable or hold the lock file.
//! - `check_pipe_server` (Windows): the kubelet's and the container runtime's named pipes must
//!   be served by SYSTEM or dxdp's own account.

use std::path::Path;

/// Who may read a protected directory besides SYSTEM and Administrators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readers {
    /// Nobody else.
    AdministratorsOnly,
    /// Everyone may read and execute (the validation container reads dxdp.exe from it).
    Everyone,
}

/// Why a host file or directory is not trusted, or its protection could not be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(not(windows), allow(dead_code))] // Only Windows finds an owner or a pipe server.
pub(crate) enum AclError {
    /// A named pipe served by a process of another account.
    #[error("the named pipe {pipe} is served by a process (ID {pid}) running as {user}, not as SYSTEM or dxdp's account: another account may have taken the kubelet's or container runtime's pipe name; find the process (`Get-Process -Id {pid}`) and stop it, then restart dxdp")]
    UntrustedPipe {
        /// The pipe's name.
        pipe: String,
        /// The server's process ID.
        pid: u32,
        /// The server's account SID.
        user: String,
    },
    /// Owned by an account that is not SYSTEM, Administrators or dxdp's own.
    #[error("{path} is owned by {owner}, not by SYSTEM or the Administrators group: dxdp does not trust a file another account could have placed; if it is yours, give it to Administrators (`icacls \"{path}\" /setowner Administrators`), else delete it")]
    Untrusted {
        /// The file.
        path: String,
        /// The owner's SID (`S-1-5-21-…`).
        owner: String,
    },
    /// The owner or access list could not be read or set.
    #[error("cannot {what} of {path}: {reason}")]
    Os {
        /// `read the owner`, `set the access list`.
        what: &'static str,
        /// The file.
        path: String,
        /// What Windows said.
        reason: String,
    },
}

/// Whether `path` is owned by SYSTEM, the Administrators group or the account this process
/// runs as. Always true outside Windows (file modes are the operator's there).
pub(crate) fn check_owner(path: &Path) -> Result<(), AclError> {
    #[cfg(windows)]
    {
        windows_acl::check_owner(path)
    }
    #[cfg(not(windows))]
    {
        let _ = path;
        Ok(())
    }
}

/// Whether the server of the named pipe `pipe` (a connected client handle) runs as SYSTEM or
/// as the account dxdp runs as: a pipe another account serves (a local user who created
/// `\\.\pipe\kubelet-pod-resources` before the kubelet) is refused. Where Windows does not
/// tell (the server's process cannot be opened), it is not refused: the kubelet's and
/// containerd's pipes are created at boot by services, before any user could take the name.
#[cfg(windows)]
pub(crate) fn check_pipe_server(
    pipe: std::os::windows::io::RawHandle,
    name: &str,
) -> Result<(), AclError> {
    windows_acl::check_pipe_server(pipe, name)
}

/// Creates `dir` (and its parents) if needed; when dxdp created it, or it already exists,
/// checks its owner (another account's: `PermissionDenied`) and sets its protected access list
/// ([`Readers`]; a failure to: any other kind). Outside Windows it only
/// creates the directory.
pub(crate) fn create_protected_dir(dir: &Path, readers: Readers) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(windows)]
    {
        // Another account's directory is refused (PermissionDenied); an access list Windows
        // would not set is another error kind, which a caller on the kubelet's path may
        // survive.
        windows_acl::check_owner(dir).map_err(|e| match e {
            AclError::Untrusted { .. } => {
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, e)
            }
            other => std::io::Error::other(other),
        })?;
        windows_acl::protect(dir, readers).map_err(std::io::Error::other)?;
    }
    #[cfg(not(windows))]
    let _ = readers;
    Ok(())
}

/// The access list of [`Readers`], in SDDL: `P` protected (nothing inherited from the parent),
/// full control (`FA`) for SYSTEM (`SY`) and Administrators (`BA`) on the directory and
/// everything in it (`OICI`), and for [`Readers::Everyone`] read and execute
/// (`0x1200a9`: FILE_GENERIC_READ | FILE_GENERIC_EXECUTE) for Everyone (`WD`).
#[cfg_attr(not(windows), allow(dead_code))]
pub(crate) fn sddl(readers: Readers) -> &'static str {
    match readers {
        Readers::AdministratorsOnly => "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)",
        Readers::Everyone => "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;OICI;0x1200a9;;;WD)",
    }
}

#[cfg(windows)]
mod windows_acl {
    use std::path::Path;

    use windows::core::{HSTRING, PWSTR};
    use windows::Win32::Foundation::{CloseHandle, LocalFree, HANDLE, HLOCAL};
    use windows::Win32::Security::Authorization::{
        ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW,
        GetNamedSecurityInfoW, SetNamedSecurityInfoW, SDDL_REVISION_1, SE_FILE_OBJECT,
    };
    use windows::Win32::Security::{
        EqualSid, GetSecurityDescriptorDacl, GetTokenInformation, IsWellKnownSid, TokenUser,
        WinBuiltinAdministratorsSid, WinLocalSystemSid, ACL, DACL_SECURITY_INFORMATION,
        OWNER_SECURITY_INFORMATION, PROTECTED_DACL_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR,
        PSID, TOKEN_QUERY, TOKEN_USER,
    };
    use windows::Win32::System::Pipes::GetNamedPipeServerProcessId;
    use windows::Win32::System::Threading::{
        GetCurrentProcess, OpenProcess, OpenProcessToken, PROCESS_QUERY_LIMITED_INFORMATION,
    };

    use super::{sddl, AclError, Readers};

    /// A security descriptor Windows allocated, freed on drop.
    struct Descriptor(PSECURITY_DESCRIPTOR);

    impl Drop for Descriptor {
        fn drop(&mut self) {
            if !self.0 .0.is_null() {
                // SAFETY: allocated by Windows with LocalAlloc, freed once.
                unsafe {
                    LocalFree(Some(HLOCAL(self.0 .0)));
                }
            }
        }
    }

    fn os(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> AclError {
        AclError::Os {
            what,
            path: path.display().to_string(),
            reason: reason.to_string(),
        }
    }

    /// The SID as `S-1-…`.
    fn sid_text(sid: PSID) -> String {
        let mut text = PWSTR::null();
        // SAFETY: `sid` is a valid SID; the string is freed with LocalFree.
        unsafe {
            if ConvertSidToStringSidW(sid, &mut text).is_err() || text.is_null() {
                return "an unknown account".into();
            }
            let s = text
                .to_string()
                .unwrap_or_else(|_| "an unknown account".into());
            LocalFree(Some(HLOCAL(text.0.cast())));
            s
        }
    }

    /// The user SID of `process`'s token (a TOKEN_USER in an 8-byte aligned buffer).
    fn token_user(process: HANDLE) -> Option<Vec<u64>> {
        let mut token = HANDLE::default();
        // SAFETY: a process handle with query rights; the token is closed below.
        unsafe { OpenProcessToken(process, TOKEN_QUERY, &mut token) }.ok()?;
        let mut buffer = vec![0u64; 128];
        let mut len = 0u32;
        // SAFETY: the buffer is 1 KiB, 8-byte aligned, and its size is passed.
        let got = unsafe {
            GetTokenInformation(
                token,
                TokenUser,
                Some(buffer.as_mut_ptr().cast()),
                (buffer.len() * 8) as u32,
                &mut len,
            )
        };
        // SAFETY: opened above.
        unsafe {
            let _ = CloseHandle(token);
        }
        got.ok().map(|()| buffer)
    }

    /// The SID in a [`token_user`] buffer.
    fn user_sid(buffer: &[u64]) -> PSID {
        // SAFETY: GetTokenInformation filled a TOKEN_USER at the buffer's start.
        unsafe { (*(buffer.as_ptr() as *const TOKEN_USER)).User.Sid }
    }

    /// Whether `sid` is this process's user.
    fn is_own_user(sid: PSID) -> bool {
        // SAFETY: the current process's pseudo handle needs no closing.
        let Some(own) = token_user(unsafe { GetCurrentProcess() }) else {
            return false;
        };
        // SAFETY: both are valid SIDs.
        unsafe { EqualSid(user_sid(&own), sid) }.is_ok()
    }

    pub(super) fn check_pipe_server(
        pipe: std::os::windows::io::RawHandle,
        name: &str,
    ) -> Result<(), AclError> {
        let mut pid = 0u32;
        // SAFETY: `pipe` is a connected client handle of a named pipe.
        if unsafe { GetNamedPipeServerProcessId(HANDLE(pipe), &mut pid) }.is_err() {
            return Ok(());
        }
        // SAFETY: closed below.
        let Ok(process) = (unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, false, pid) })
        else {
            return Ok(());
        };
        let user = token_user(process);
        // SAFETY: opened above.
        unsafe {
            let _ = CloseHandle(process);
        }
        let Some(user) = user else {
            return Ok(());
        };
        let sid = user_sid(&user);
        // SAFETY: a valid SID in `user`.
        let trusted =
            unsafe { IsWellKnownSid(sid, WinLocalSystemSid).as_bool() } || is_own_user(sid);
        if trusted {
            Ok(())
        } else {
            Err(AclError::UntrustedPipe {
                pipe: name.to_string(),
                pid,
                user: sid_text(sid),
            })
        }
    }

    pub(super) fn check_owner(path: &Path) -> Result<(), AclError> {
        let name = HSTRING::from(path.as_os_str());
        let mut owner = PSID::default();
        let mut sd = Descriptor(PSECURITY_DESCRIPTOR::default());
        // SAFETY: out pointers to locals; the descriptor is freed by `Descriptor`.
        let status = unsafe {
            GetNamedSecurityInfoW(
                &name,
                SE_FILE_OBJECT,
                OWNER_SECURITY_INFORMATION,
                Some(&mut owner),
                None,
                None,
                None,
                &mut sd.0,
            )
        };
        if status.is_err() || owner.0.is_null() {
            return Err(os(
                "read the owner",
                path,
                windows::core::Error::from(status.to_hresult()),
            ));
        }
        // SAFETY: `owner` points into `sd`, alive here.
        let trusted = unsafe {
            IsWellKnownSid(owner, WinLocalSystemSid).as_bool()
                || IsWellKnownSid(owner, WinBuiltinAdministratorsSid).as_bool()
        } || is_own_user(owner);
        if trusted {
            Ok(())
        } else {
            Err(AclError::Untrusted {
                path: path.display().to_string(),
                owner: sid_text(owner),
            })
        }
    }

    /// The access list of `path` in SDDL (`D:P(A;…)…`), for the tests.
    #[cfg(test)]
    pub(super) fn dacl_sddl(path: &Path) -> String {
        use windows::Win32::Security::Authorization::ConvertSecurityDescriptorToStringSecurityDescriptorW;
        let name = HSTRING::from(path.as_os_str());
        let mut sd = Descriptor(PSECURITY_DESCRIPTOR::default());
        // SAFETY: out pointers to locals; the descriptor is freed by `Descriptor`.
        let status = unsafe {
            GetNamedSecurityInfoW(
                &name,
                SE_FILE_OBJECT,
                DACL_SECURITY_INFORMATION,
                None,
                None,
                None,
                None,
                &mut sd.0,
            )
        };
        assert!(status.is_ok(), "GetNamedSecurityInfoW: {status:?}");
        let mut text = PWSTR::null();
        // SAFETY: a valid descriptor; the string is freed with LocalFree.
        unsafe {
            ConvertSecurityDescriptorToStringSecurityDescriptorW(
                sd.0,
                SDDL_REVISION_1,
                DACL_SECURITY_INFORMATION,
                &mut text,
                None,
            )
            .expect("the access list as SDDL");
            let s = text.to_string().expect("UTF-16");
            LocalFree(Some(HLOCAL(text.0.cast())));
            s
        }
    }

    pub(super) fn protect(dir: &Path, readers: Readers) -> Result<(), AclError> {
        let mut sd = Descriptor(PSECURITY_DESCRIPTOR::default());
        // SAFETY: a constant SDDL string; the descriptor is freed by `Descriptor`.
        unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                &HSTRING::from(sddl(readers)),
                SDDL_REVISION_1,
                &mut sd.0,
                None,
            )
        }
        .map_err(|e| os("set the access list", dir, e))?;
        let mut present = windows::core::BOOL::default();
        let mut defaulted = windows::core::BOOL::default();
        let mut dacl: *mut ACL = std::ptr::null_mut();
        // SAFETY: `sd` is a valid descriptor; the ACL points into it.
        unsafe { GetSecurityDescriptorDacl(sd.0, &mut present, &mut dacl, &mut defaulted) }
            .map_err(|e| os("set the access list", dir, e))?;
        let name = HSTRING::from(dir.as_os_str());
        // SAFETY: `dacl` points into `sd`, alive here.
        let status = unsafe {
            SetNamedSecurityInfoW(
                &name,
                SE_FILE_OBJECT,
                DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION,
                None,
                None,
                Some(dacl),
                None,
            )
        };
        if status.is_err() {
            return Err(os(
                "set the access list",
                dir,
                windows::core::Error::from(status.to_hresult()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_access_lists_grant_what_their_docs_say() {
        assert_eq!(
            sddl(Readers::AdministratorsOnly),
            "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)"
        );
        assert_eq!(
            sddl(Readers::Everyone),
            "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;OICI;0x1200a9;;;WD)"
        );
    }

    #[test]
    fn a_file_this_process_made_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "x: 1\n").unwrap();
        assert_eq!(check_owner(&file), Ok(()));
        let protected = dir.path().join("dxdp").join("locks");
        create_protected_dir(&protected, Readers::AdministratorsOnly).unwrap();
        assert!(protected.is_dir());
        assert_eq!(check_owner(&protected), Ok(()));
        // Protecting again (a restart) is fine.
        create_protected_dir(&protected, Readers::Everyone).unwrap();
    }

    /// What Windows (and Wine) read back is the protected list asked for: nothing inherited,
    /// SYSTEM and Administrators in full, Everyone read and execute for the validation directory.
    #[cfg(windows)]
    #[test]
    fn a_protected_directory_reads_back_its_access_list() {
        let dir = tempfile::tempdir().unwrap();
        let admins = dir.path().join("admins");
        create_protected_dir(&admins, Readers::AdministratorsOnly).unwrap();
        let read = windows_acl::dacl_sddl(&admins);
        if crate::util::under_wine() && !read.starts_with("D:P") {
            eprintln!("skipped a_protected_directory_reads_back_its_access_list: Wine accepts SetNamedSecurityInfoW but keeps no access list on this file system (it reads back {read}, made from the Unix mode); the native Windows jobs run it");
            return;
        }
        assert_eq!(
            windows_acl::dacl_sddl(&admins),
            "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)"
        );
        let everyone = dir.path().join("validation");
        create_protected_dir(&everyone, Readers::Everyone).unwrap();
        assert_eq!(
            windows_acl::dacl_sddl(&everyone),
            "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;OICI;0x1200a9;;;WD)"
        );
    }

    #[test]
    fn an_untrusted_owner_is_named_with_what_to_do() {
        let e = AclError::Untrusted {
            path: r"C:\etc\dxdp\config.yaml".into(),
            owner: "S-1-5-21-1-2-3-1001".into(),
        };
        assert_eq!(
            e.to_string(),
            r#"C:\etc\dxdp\config.yaml is owned by S-1-5-21-1-2-3-1001, not by SYSTEM or the Administrators group: dxdp does not trust a file another account could have placed; if it is yours, give it to Administrators (`icacls "C:\etc\dxdp\config.yaml" /setowner Administrators`), else delete it"#
        );
    }
}
