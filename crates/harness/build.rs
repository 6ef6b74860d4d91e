//! Records the git commit the `weft` binary was built from (results files carry it).
use std::process::Command;

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The work tree's sources too (cargo scans a directory recursively): an uncommitted edit must
    // make the next build say "-dirty", not keep the clean commit of the last describe.
    for p in [
        ".git/HEAD",
        ".git/index",
        ".git/refs/heads",
        "crates",
        "kernels",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=WEFT_COMMIT");
    let commit = std::env::var("WEFT_COMMIT").ok().or_else(|| {
        let out = Command::new("git")
            .args(["describe", "--always", "--dirty", "--abbrev=12"])
            .current_dir(&root)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    println!(
        "cargo:rustc-env=WEFT_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
