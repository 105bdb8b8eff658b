//! Writes the Rust of TEI's `tei.v1` proto (servers only) and its file descriptor set (for
//! gRPC reflection) into `src/api/grpc/pb/`. Run by `scripts/gen-grpc.sh`, which provides
//! `protoc` (PyPI's grpcio-tools): the output is committed, so neither a build nor CI needs
//! protoc.

fn main() {
    let root = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: grpc-codegen REPO_ROOT"));
    let out = root.join("src/api/grpc/pb");
    std::fs::create_dir_all(&out).expect("create src/api/grpc/pb");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .file_descriptor_set_path(out.join("tei_descriptor.bin"))
        .out_dir(&out)
        .compile_protos(&[root.join("proto/tei.proto")], &[root.join("proto")])
        .unwrap_or_else(|e| panic!("protobuf compilation failed: {e}"));
}
