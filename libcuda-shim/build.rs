//! Generates the forwarding table and trampolines from symbols/libcuda.so.*.txt.
fn main() {
    vgpu_shimgen::build::ShimBuild {
        library: "libcuda.so",
        soname: "libcuda.so.1",
        prefix: "cu",
    }
    .run();
}
