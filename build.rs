//! Compiles the kubelet device plugin API (`proto/deviceplugin_v1beta1.proto`), the kubelet's
//! PodResources API (`proto/podresources_v1.proto`) and the part of the container runtime's CRI
//! that dxdp uses (`proto/cri_runtime_v1.proto`) with protox, a pure-Rust protobuf compiler, so
//! no system `protoc` is needed, and records the git commit and target for `dxdp --version`.
//!
//! The plugin's own `DevicePlugin` server is generated from a manual definition of the same
//! service ([`device_plugin_answering`]): identical routes and messages, except that Allocate
//! answers with `AllocateAnswer`, which is `AllocateResponse` on the wire with every container's
//! answer already encoded (see `src/kubelet/answering.rs`).

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
    tonic_build::manual::Builder::new()
        .build_client(false)
        .build_server(true)
        .compile(&[device_plugin_answering()]);
    Ok(())
}

/// `v1beta1.DevicePlugin` as `proto/deviceplugin_v1beta1.proto` declares it (same package,
/// service, routes, request types and streaming), with Allocate's answer pre-encoded.
fn device_plugin_answering() -> tonic_build::manual::Service {
    use tonic_build::manual::{Method, Service};
    const API: &str = "crate::kubelet::v1beta1";
    let method = |name: &str, route: &str, input: &str, output: &str| {
        Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("{API}::{input}"))
            .output_type(output)
            .codec_path("tonic_prost::ProstCodec")
    };
    Service::builder()
        .name("DevicePlugin")
        .package("v1beta1")
        .method(
            method(
                "get_device_plugin_options",
                "GetDevicePluginOptions",
                "Empty",
                &format!("{API}::DevicePluginOptions"),
            )
            .build(),
        )
        .method(
            method(
                "list_and_watch",
                "ListAndWatch",
                "Empty",
                &format!("{API}::ListAndWatchResponse"),
            )
            .server_streaming()
            .build(),
        )
        .method(
            method(
                "get_preferred_allocation",
                "GetPreferredAllocation",
                "PreferredAllocationRequest",
                &format!("{API}::PreferredAllocationResponse"),
            )
            .build(),
        )
        .method(
            method(
                "allocate",
                "Allocate",
                "AllocateRequest",
                "crate::kubelet::answering::AllocateAnswer",
            )
            .build(),
        )
        .method(
            method(
                "pre_start_container",
                "PreStartContainer",
                "PreStartContainerRequest",
                &format!("{API}::PreStartContainerResponse"),
            )
            .build(),
        )
        .build()
}
