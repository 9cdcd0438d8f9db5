//! Compiles the kubelet device plugin API (`proto/deviceplugin_v1beta1.proto`) with protox, a
//! pure-Rust protobuf compiler, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin_v1beta1.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
