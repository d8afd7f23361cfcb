//! Generates the forwarding table and trampolines from symbols/libnvidia-ml.so.*.txt.
fn main() {
    vgpu_shimgen::build::ShimBuild {
        library: "libnvidia-ml.so",
        soname: "libnvidia-ml.so.1",
        prefix: "nvml",
    }
    .run();
}
