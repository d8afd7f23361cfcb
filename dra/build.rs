//! Compiles the vendored kubelet protos (dra v1 and v1beta1, pluginregistration v1) with
//! protox (pure Rust, no system `protoc`) and tonic-prost-build, clients and servers
//! both: the plugin serves Registration and DRAPlugin; the tests call them as kubelet.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
