//! Compiles each vendored kubelet proto once, with protox (pure Rust, no system `protoc`)
//! and tonic-prost-build, clients and servers both: the device plugin serves
//! DevicePlugin and calls Registration and PodResourcesLister; the DRA driver serves
//! Registration and DRAPlugin; the tests play kubelet with the other side of each.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
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
