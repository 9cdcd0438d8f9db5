//! One daemon per kubelet directory across processes (issue 36): the real `dxdp plugin` started
//! twice, with different `TMPDIR`s, on one directory spelled differently. The lock lives where
//! every instance on the host sees it, so the second refuses at once, naming the first.

#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// `dxdp plugin` on `kubelet_dir` with its own temporary directory, stderr piped.
fn daemon(kubelet_dir: &Path, tmp: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args([
            "plugin",
            "--host-snapshot",
            "builtin:sample",
            "--kubelet-dir",
        ])
        .arg(kubelet_dir)
        .env("TMPDIR", tmp)
        .env("TMP", tmp)
        .env("TEMP", tmp)
        .env_remove("DXDP_KUBELET_DIR")
        .env_remove("DXDP_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dxdp starts")
}

/// The lines of a child's stderr, as they come.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line containing `text`; returns every line seen.
fn wait_for(rx: &mpsc::Receiver<String>, text: &str) -> Result<Vec<String>, Vec<String>> {
    let deadline = std::time::Instant::now() + WAIT;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                let hit = line.contains(text);
                seen.push(line);
                if hit {
                    return Ok(seen);
                }
            }
            Err(_) => break,
        }
    }
    Err(seen)
}

/// Waits for `child` to exit; kills it if it does not.
fn exit_code(child: &mut Child) -> Option<i32> {
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A second daemon on `spelling` with its own `TMPDIR` refuses, naming the first daemon.
fn second_refuses(spelling: &Path, tmp: &Path, first: &Child) {
    let mut second = daemon(spelling, tmp);
    let rx = lines(&mut second);
    let code = exit_code(&mut second);
    let text: Vec<String> = rx.try_iter().collect();
    assert_eq!(
        code,
        Some(1),
        "a second daemon on {} (TMPDIR {}) must refuse at once; it ran on: {text:#?}",
        spelling.display(),
        tmp.display()
    );
    let text = text.join("\n");
    assert!(
        text.contains("another dxdp already serves")
            && text.contains(&format!("pid {} serving", first.id())),
        "{text}"
    );
}

#[test]
fn two_daemons_with_different_tmpdirs_and_spellings_of_one_kubelet_directory_do_not_both_run() {
    let top = tempfile::tempdir().unwrap();
    let (tmp1, tmp2, tmp3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    // The daemon starts before the kubelet: the directory does not exist yet.
    let kubelet = top.path().join("device-plugins");
    let mut first = daemon(&kubelet, tmp1.path());
    let rx = lines(&mut first);
    if let Err(seen) = wait_for(&rx, "the kubelet directory does not exist yet") {
        let _ = first.kill();
        panic!("the first daemon did not start: {seen:#?}");
    }
    // Another TMPDIR, another spelling of the missing directory.
    std::fs::create_dir(top.path().join("x")).unwrap();
    let dotdot = top.path().join("x").join("..").join("device-plugins");
    second_refuses(&dotdot, tmp2.path(), &first);
    // The kubelet creates it; a third daemon through a symlink, with a third TMPDIR.
    std::fs::create_dir(&kubelet).unwrap();
    let link = top.path().join("link");
    std::os::unix::fs::symlink(&kubelet, &link).unwrap();
    second_refuses(&link, tmp3.path(), &first);
    assert_eq!(
        first.try_wait().unwrap(),
        None,
        "the first daemon still runs"
    );
    let _ = first.kill();
    let _ = first.wait();
}
