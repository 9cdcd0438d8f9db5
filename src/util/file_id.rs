//! What a file or directory *is*, whatever it is called: its volume and its number on that
//! volume (device and inode on Unix; volume serial number and file ID on Windows). Every spelling
//! of one directory (a symlink, `..`, a bind mount, another case on Windows) has one identity; a
//! directory removed, or renamed away, and created again under the same name has a new one, even
//! where NTFS tunnelling gives it the old one's creation time.

use std::io;
use std::path::Path;

/// The identity of a file or directory (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FileId {
    /// The device (`st_dev`) on Unix, the volume serial number on Windows.
    pub(crate) volume: u64,
    /// The inode on Unix, the file ID on Windows (128 bits on ReFS, 64 on NTFS).
    pub(crate) file: u128,
}

impl std::fmt::Display for FileId {
    /// `<volume>-<file>` in hex, e.g. `803-1a2b` (usable in a file name).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}-{:x}", self.volume, self.file)
    }
}

/// The identity of what `path` names (symbolic links followed).
pub(crate) fn file_id(path: &Path) -> io::Result<FileId> {
    imp::file_id(path)
}

#[cfg(unix)]
impl FileId {
    /// The identity of the file `meta` describes (e.g. of an open handle: no window between
    /// opening and asking). Unix only: on Windows the standard metadata does not carry it.
    pub(crate) fn of_metadata(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            volume: meta.dev(),
            file: u128::from(meta.ino()),
        }
    }
}

#[cfg(unix)]
mod imp {
    use super::FileId;
    use std::io;
    use std::path::Path;

    pub(crate) fn file_id(path: &Path) -> io::Result<FileId> {
        Ok(FileId::of_metadata(&std::fs::metadata(path)?))
    }
}

#[cfg(windows)]
mod imp {
    use super::FileId;
    use std::io;
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use std::path::Path;

    use windows::Win32::Foundation::HANDLE;
    use windows::Win32::Storage::FileSystem::{
        FileIdInfo, GetFileInformationByHandle, GetFileInformationByHandleEx,
        BY_HANDLE_FILE_INFORMATION, FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT,
        FILE_ID_INFO, FILE_READ_ATTRIBUTES, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE,
    };

    /// `ERROR_CANT_ACCESS_FILE`: a reparse point that cannot be followed (an AF_UNIX socket
    /// such as `kubelet.sock`, an app execution alias) exists but cannot be opened through.
    const ERROR_CANT_ACCESS_FILE: i32 = 1920;

    /// `FileIdInfo` (the 128-bit ID and 64-bit volume serial number, Windows 8 / Server 2012
    /// and later), else `GetFileInformationByHandle`'s volume serial number and file index. The
    /// handle shares everything (a directory being watched or deleted is not disturbed) and is
    /// closed at once; `FILE_FLAG_BACKUP_SEMANTICS` opens directories. A reparse point that
    /// cannot be followed (an AF_UNIX socket) is opened itself, as `std::fs::metadata` does.
    pub(crate) fn file_id(path: &Path) -> io::Result<FileId> {
        let open = |flags: u32| {
            std::fs::OpenOptions::new()
                .access_mode(FILE_READ_ATTRIBUTES.0)
                .share_mode(FILE_SHARE_READ.0 | FILE_SHARE_WRITE.0 | FILE_SHARE_DELETE.0)
                .custom_flags(flags)
                .open(path)
        };
        let file = match open(FILE_FLAG_BACKUP_SEMANTICS.0) {
            Err(e) if e.raw_os_error() == Some(ERROR_CANT_ACCESS_FILE) => {
                open(FILE_FLAG_BACKUP_SEMANTICS.0 | FILE_FLAG_OPEN_REPARSE_POINT.0)?
            }
            opened => opened?,
        };
        let handle = HANDLE(file.as_raw_handle());
        let mut info = FILE_ID_INFO::default();
        // SAFETY: the handle is open for the call; the buffer is a FILE_ID_INFO of the size given.
        let ex = unsafe {
            GetFileInformationByHandleEx(
                handle,
                FileIdInfo,
                (&mut info as *mut FILE_ID_INFO).cast(),
                std::mem::size_of::<FILE_ID_INFO>() as u32,
            )
        };
        if ex.is_ok() && info.FileId.Identifier != [0; 16] {
            return Ok(FileId {
                volume: info.VolumeSerialNumber,
                file: u128::from_le_bytes(info.FileId.Identifier),
            });
        }
        let mut by_handle = BY_HANDLE_FILE_INFORMATION::default();
        // SAFETY: the handle is open for the call; the out pointer is valid.
        unsafe { GetFileInformationByHandle(handle, &mut by_handle) }.map_err(|e| {
            io::Error::other(format!(
                "GetFileInformationByHandle({}): {e}",
                path.display()
            ))
        })?;
        Ok(FileId {
            volume: u64::from(by_handle.dwVolumeSerialNumber),
            file: (u128::from(by_handle.nFileIndexHigh) << 32)
                | u128::from(by_handle.nFileIndexLow),
        })
    }
}

#[cfg(not(any(unix, windows)))]
mod imp {
    use super::FileId;
    use std::io;
    use std::path::Path;

    pub(crate) fn file_id(_path: &Path) -> io::Result<FileId> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "file identities are known on Unix and Windows only",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_renamed_away_and_created_again_has_a_new_identity() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("device-plugins");
        std::fs::create_dir(&dir).unwrap();
        let first = file_id(&dir).unwrap();
        assert_eq!(file_id(&dir).unwrap(), first, "stable while it stays");
        // Renamed away, so the old directory still exists and its number cannot be reused.
        std::fs::rename(&dir, top.path().join("old")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let second = file_id(&dir).unwrap();
        assert_ne!(second, first);
        assert_eq!(file_id(&top.path().join("old")).unwrap(), first);
        // Another spelling of the same directory.
        assert_eq!(
            file_id(&dir.join("..").join("device-plugins")).unwrap(),
            second
        );
        assert!(file_id(&top.path().join("missing")).is_err());
    }
}
