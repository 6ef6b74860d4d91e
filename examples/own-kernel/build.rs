//! Compiles ring_put.cu, a kernel of this crate's own, against weft's device headers: the folder
//! and the nvcc come from weft-kernels' build script (`links = "weft_kernels"`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let include = std::env::var("DEP_WEFT_KERNELS_INCLUDE")
        .expect("DEP_WEFT_KERNELS_INCLUDE: depend on weft-kernels, whose build script sets it");
    let nvcc = std::env::var("DEP_WEFT_KERNELS_NVCC")
        .expect("DEP_WEFT_KERNELS_NVCC: depend on weft-kernels, whose build script sets it");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("ring_put.cubin");
    println!("cargo:rerun-if-changed=ring_put.cu");
    let status = Command::new(&nvcc)
        .args([
            "-gencode=arch=compute_90a,code=sm_90a",
            "-cubin",
            "-O3",
            "-std=c++17",
        ])
        .arg(format!("-I{include}"))
        .arg("ring_put.cu")
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {nvcc}: {e}"));
    assert!(status.success(), "{nvcc} failed on ring_put.cu");
}
