use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Regenerates the prost code from `proto/` and fails when the committed copy differs.
#[test]
fn bootstrap() {
    let root = workspace_root();
    let proto_dir = root.join("proto");
    let mut files: Vec<PathBuf> = std::fs::read_dir(proto_dir.join("bw/v1"))
        .expect("proto/bw/v1 exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "proto"))
        .collect();
    files.sort();
    let fds = protox::compile(&files, [&proto_dir]).expect("protos compile");
    let out = tempfile::tempdir().expect("tempdir");
    prost_build::Config::new().out_dir(out.path()).btree_map(["."]).compile_fds(fds).expect("prost generates code");
    let generated = std::fs::read_to_string(out.path().join("bw.v1.rs")).expect("generated file");
    let committed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gen/bw.v1.rs");
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    if generated != committed {
        if std::env::var_os("BW_BLESS").is_some() {
            std::fs::write(&committed_path, generated).expect("write generated code");
        } else {
            panic!("src/gen/bw.v1.rs is stale: run `BW_BLESS=1 cargo test -p bw-proto bootstrap`");
        }
    }
}

#[test]
fn categories_split_into_lanes() {
    use crate::v1::Category;
    assert!(Category::Authentication.is_priority());
    assert!(Category::Transactional.is_priority());
    assert!(Category::Support.is_priority());
    assert!(!Category::Marketing.is_priority());
    assert!(!Category::Unspecified.is_priority());
}
