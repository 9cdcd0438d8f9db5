//! Compiles the kubelet device plugin API (`proto/deviceplugin_v1beta1.proto`), the kubelet's
//! PodResources API (`proto/podresources_v1.proto`) and the part of the container runtime's CRI
//! that dxdp uses (`proto/cri_runtime_v1.proto`) with protox, a pure-Rust protobuf compiler, so
//! no system `protoc` is needed, and records the git commit and target for `dxdp --version`.
//!
//! `v1beta1.DevicePlugin` has one server and one client, both generated from the same compiled
//! descriptor ([`device_plugin`]): every route, message and streaming kind the proto declares.
//! The server (the plugin's, `src/plugin/answer.rs`) answers Allocate with `AllocateAnswer`,
//! which is `AllocateResponse` on the wire with every container's answer already encoded; the
//! client (the kubelet's side, used by the stand-in and the tests) decodes `AllocateResponse`.
//! tonic's own generation gets the descriptor without that service, so that there is one
//! `DevicePlugin` server trait, not two.

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
    let mut fds = protox::compile(protos, ["proto"])?;
    let server = device_plugin(&fds, Side::Plugin)?;
    let client = device_plugin(&fds, Side::Kubelet)?;
    for file in fds.file.iter_mut().filter(|f| f.package() == "v1beta1") {
        file.service.retain(|s| s.name() != "DevicePlugin");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // Both are written as `v1beta1.DevicePlugin.rs`: one directory each.
    for (service, dir, server) in [(server, "plugin", true), (client, "kubelet", false)] {
        let dir = out.join(dir);
        std::fs::create_dir_all(&dir)?;
        tonic_build::manual::Builder::new()
            .build_client(!server)
            .build_server(server)
            .out_dir(dir)
            .compile(&[service]);
    }
    Ok(())
}

/// Which side of `v1beta1.DevicePlugin` is generated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The server, answering Allocate with the pre-encoded `AllocateAnswer`.
    Plugin,
    /// The client, decoding Allocate's answer as `AllocateResponse`.
    Kubelet,
}

/// `v1beta1.DevicePlugin` generated from the compiled proto's descriptor (same package,
/// service, routes, request types and streaming, for every method the proto declares). A
/// method added to the proto is in the server, so the build fails until the plugin implements
/// it; nothing is listed by hand.
fn device_plugin(
    fds: &prost_types::FileDescriptorSet,
    side: Side,
) -> Result<tonic_build::manual::Service, Box<dyn std::error::Error>> {
    use tonic_build::manual::{Method, Service};
    const API: &str = "crate::kubelet::v1beta1";
    let file = fds
        .file
        .iter()
        .find(|f| f.package() == "v1beta1")
        .ok_or("proto/deviceplugin_v1beta1.proto: no package v1beta1")?;
    let service = file
        .service
        .iter()
        .find(|s| s.name() == "DevicePlugin")
        .ok_or("proto/deviceplugin_v1beta1.proto: no service DevicePlugin")?;
    let rust_type = |proto: &str| -> Result<String, String> {
        proto
            .strip_prefix(".v1beta1.")
            .map(|t| format!("{API}::{t}"))
            .ok_or_else(|| format!("{proto}: not a v1beta1 message"))
    };
    let mut builder = Service::builder().name("DevicePlugin").package("v1beta1");
    for m in &service.method {
        let output = if m.name() == "Allocate" && side == Side::Plugin {
            "crate::plugin::answer::AllocateAnswer".to_string()
        } else {
            rust_type(m.output_type())?
        };
        let mut method = Method::builder()
            .name(snake_case(m.name()))
            .route_name(m.name())
            .input_type(rust_type(m.input_type())?)
            .output_type(output)
            .codec_path("tonic_prost::ProstCodec");
        if m.client_streaming() {
            method = method.client_streaming();
        }
        if m.server_streaming() {
            method = method.server_streaming();
        }
        builder = builder.method(method.build());
    }
    Ok(builder.build())
}

/// `GetDevicePluginOptions` → `get_device_plugin_options`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
