//! Compiles the kubelet device plugin API (`proto/deviceplugin_v1beta1.proto`), the kubelet's
//! PodResources API (`proto/podresources_v1.proto`) and the part of the container runtime's CRI
//! that dxdp uses (`proto/cri_runtime_v1.proto`) with protox, a pure-Rust protobuf compiler, so
//! no system `protoc` is needed, and records the git commit and target for `dxdp --version`.

use std::process::Command;

/// `git` with `args` in the source tree, or `None` when git or the repository is missing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn version_facts() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DXDP_GIT_COMMIT={commit}");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=DXDP_TARGET={target}");
    // Rebuild when HEAD moves: the HEAD file, and the branch it points at.
    for path in [
        Some("HEAD".to_string()),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(file) = git(&["rev-parse", "--git-path", &path]) {
            println!("cargo:rerun-if-changed={file}");
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    version_facts();
    let protos = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/podresources_v1.proto",
        "proto/cri_runtime_v1.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
