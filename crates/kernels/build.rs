//! Compiles the `kernels/<folder>/*.cu` of every folder whose cargo feature is on (each library
//! crate enables its own) for sm_90a into a cubin each, embeds them, and
//! binds the plain-old-data structs and WEFT_HD functions of `kernels/include/weft/abi.h` with
//! bindgen (the functions' host copies compiled with cc from bindgen's wrappers).
//!
//! This is the one place weft finds nvcc: `NVCC`, then `.toolchain/cuda` where `ci/setup.sh`
//! installs the CUDA 13.0 wheels, then `CUDA_HOME`/`CUDA_PATH`, then `PATH`. The nvcc used and
//! its version are printed as a cargo warning (a warning too when it is not CUDA 13.0). ptxas resource usage
//! (registers, shared memory, stack, spills) is kept in `$OUT_DIR/ptxas.log` and in this build
//! script's output; any spill is raised as a cargo warning.
//!
//! Exports (`links = "weft_kernels"`): `DEP_WEFT_KERNELS_INCLUDE` (the device headers,
//! `kernels/include`) and `DEP_WEFT_KERNELS_NVCC` (this nvcc) to the build scripts of crates
//! that depend on weft-kernels.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernels/ folders, one cargo feature each.
const FOLDERS: [&str; 7] = [
    "barrier",
    "collectives",
    "gemm",
    "grpcoll",
    "harness",
    "pgl",
    "sync",
];

/// Hopper with the architecture-specific features (wgmma, setmaxnreg). The -gencode form is the
/// one that does not also run a plain sm_90 pass.
const GENCODE: &str = "-gencode=arch=compute_90a,code=sm_90a";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    // `cuda` is a link to the workspace's kernels/ (the one place the CUDA sources live); a
    // packaged crate holds a copy of it there.
    let kernels = manifest
        .join("cuda")
        .canonicalize()
        .expect("crates/kernels/cuda (a link to kernels/)");
    let root = manifest.join("../..");
    let include = kernels.join("include");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());

    println!("cargo:rerun-if-changed={}", kernels.display());
    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let nvcc = find_nvcc(&root).unwrap_or_else(|searched| {
        panic!(
            "\n\nweft-kernels: nvcc (CUDA 13.0) not found. Searched: {searched}.\n\
             In the weft repository: bash ci/setup.sh (installs it into .toolchain/). Elsewhere:\n    \
             python3 -m pip install --no-deps --target $HOME/.cuda13 nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
             nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85\n\
             then NVCC=$HOME/.cuda13/nvidia/cu13/bin/nvcc, or point NVCC at any CUDA 13 nvcc.\n"
        )
    });

    // For dependents that compile kernels of their own against weft's device headers (the
    // `links` convention: their build scripts read DEP_WEFT_KERNELS_INCLUDE and
    // DEP_WEFT_KERNELS_NVCC), and for NVRTC users (weft_kernels::INCLUDE_DIR).
    println!("cargo:include={}", include.display());
    println!("cargo:nvcc={}", nvcc.display());
    println!(
        "cargo:rustc-env=WEFT_KERNELS_INCLUDE_DIR={}",
        include.display()
    );

    let release = nvcc_release(&nvcc);
    println!(
        "cargo:warning=weft-kernels: compiling with {} ({release})",
        nvcc.display()
    );
    if !release.starts_with("release 13.0") {
        println!("cargo:warning=weft-kernels: weft is built and tested with CUDA 13.0; this nvcc is {release} (bash ci/setup.sh installs 13.0; NVCC picks another)");
    }

    // The folders this build embeds: those whose feature a dependent enabled. A folder without
    // a feature would never be built: refused.
    for entry in std::fs::read_dir(&kernels).expect("reading kernels/") {
        let path = entry.expect("reading kernels/").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() && name != "include" && !FOLDERS.contains(&name.as_str()) {
            panic!("kernels/{name}: a folder without a cargo feature; add it to FOLDERS in crates/kernels/build.rs and to [features] in crates/kernels/Cargo.toml");
        }
    }
    let mut sources = Vec::new();
    for folder in FOLDERS {
        if std::env::var_os(format!("CARGO_FEATURE_{}", folder.to_uppercase())).is_some() {
            collect_sources(&kernels.join(folder), &mut sources);
        }
    }
    sources.sort();

    // nvcc runs for several files at once (one per available core); results are reported in
    // source order so the log and the generated constants are deterministic.
    let outputs = compile_all(&nvcc, &include, &out, &kernels, &sources);
    let mut ptxas_log = String::new();
    let mut consts = String::new();
    for (src, (cubin, output)) in sources.iter().zip(outputs) {
        let rel = src.strip_prefix(&kernels).unwrap();
        let name = rel
            .with_extension("")
            .to_string_lossy()
            .replace(['/', '-'], "_");
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            panic!(
                "\n\nweft-kernels: nvcc failed on kernels/{}:\n{stderr}\n",
                rel.display()
            );
        }
        ptxas_log.push_str(&format!("== kernels/{}\n{stderr}", rel.display()));
        for line in stderr.lines() {
            println!("ptxas: kernels/{}: {line}", rel.display());
            if line.contains("spill")
                && !line.contains(" 0 bytes spill stores, 0 bytes spill loads")
            {
                println!(
                    "cargo:warning=kernels/{}: register spills: {}",
                    rel.display(),
                    line.trim()
                );
            }
            if line.contains("setmaxnreg' ignored") {
                println!("cargo:warning=kernels/{}: {}", rel.display(), line.trim());
            }
        }
        consts.push_str(&format!(
            "/// `kernels/{}` compiled for sm_90a.\npub const {}: Cubin = Cubin {{ source: \"kernels/{}\", image: include_bytes!({:?}) }};\n",
            rel.display(),
            name.to_uppercase(),
            rel.display(),
            cubin
        ));
    }
    let all: Vec<String> = sources
        .iter()
        .map(|s| {
            s.strip_prefix(&kernels)
                .unwrap()
                .with_extension("")
                .to_string_lossy()
                .replace(['/', '-'], "_")
                .to_uppercase()
        })
        .collect();
    consts.push_str(&format!(
        "/// Every embedded cubin.\npub const ALL: &[Cubin] = &[{}];\n",
        all.join(", ")
    ));
    std::fs::write(out.join("cubins.rs"), consts).unwrap();
    std::fs::write(out.join("ptxas.log"), ptxas_log).unwrap();

    let abi = bindgen::Builder::default()
        .header(include.join("weft/abi.h").to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("weft_.*")
        .allowlist_var("WEFT_.*")
        .allowlist_function("weft_.*")
        // WEFT_HD functions are `static inline` in C: bindgen writes extern wrappers for them,
        // compiled below, so the host calls the very definitions the kernels use.
        .wrap_static_fns(true)
        .wrap_static_fns_path(out.join("abi_static"))
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| panic!("weft-kernels: bindgen failed on kernels/include/weft/abi.h: {e} (is libclang installed? run `bash ci/setup.sh`)"));
    abi.write_to_file(out.join("abi.rs")).unwrap();
    cc::Build::new()
        .file(out.join("abi_static.c"))
        .include(&include)
        .include(&manifest) // the wrappers #include the header by the path bindgen was given
        .flag_if_supported("-std=c11")
        .warnings_into_errors(true)
        .compile("weft_abi_static");
}

/// Compiles every source to a cubin in `out`, a few nvcc processes at a time; returns each
/// source's cubin path and nvcc's output, in the order of `sources`.
fn compile_all(
    nvcc: &Path,
    include: &Path,
    out: &Path,
    kernels: &Path,
    sources: &[PathBuf],
) -> Vec<(PathBuf, std::process::Output)> {
    let jobs = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<(PathBuf, std::process::Output)>>> =
        std::sync::Mutex::new((0..sources.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(sources.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(src) = sources.get(i) else { break };
                let rel = src.strip_prefix(kernels).unwrap();
                let name = rel
                    .with_extension("")
                    .to_string_lossy()
                    .replace(['/', '-'], "_");
                let cubin = out.join(format!("{name}.cubin"));
                let output = Command::new(nvcc)
                    .args([
                        GENCODE,
                        "-cubin",
                        "-O3",
                        "-std=c++17",
                        "-lineinfo",
                        "-Xptxas",
                        "-v",
                        "-Werror",
                        "all-warnings",
                    ])
                    .arg("-I")
                    .arg(include)
                    .arg("-o")
                    .arg(&cubin)
                    .arg(src)
                    .output()
                    .unwrap_or_else(|e| {
                        panic!("weft-kernels: could not run {}: {e}", nvcc.display())
                    });
                results.lock().unwrap()[i] = Some((cubin, output));
            });
        }
    });
    results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every source compiled"))
        .collect()
}

fn collect_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
    {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "cu") {
            out.push(path);
        }
    }
}

/// nvcc by the documented precedence; on failure, the list of places searched.
fn find_nvcc(root: &Path) -> Result<PathBuf, String> {
    let mut searched = Vec::new();
    if let Ok(p) = std::env::var("NVCC") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        searched.push(format!("NVCC={}", p.display()));
    }
    // What ci/setup.sh installed wins over whatever else the machine has.
    let p = root.join(".toolchain/cuda/nvidia/cu13/bin/nvcc");
    if p.is_file() {
        return Ok(p);
    }
    searched.push(p.display().to_string());
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(home) = std::env::var(var) {
            let p = Path::new(&home).join("bin/nvcc");
            if p.is_file() {
                return Ok(p);
            }
            searched.push(format!("{var}/bin/nvcc={}", p.display()));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
        searched.push("PATH".into());
    }
    Err(searched.join(", "))
}

/// "release 13.0" from `nvcc --version`, or why it could not be read.
fn nvcc_release(nvcc: &Path) -> String {
    match Command::new(nvcc).arg("--version").output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| {
                l.split(", ")
                    .find(|w| w.starts_with("release "))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "version not reported".into()),
        Err(e) => format!("did not run: {e}"),
    }
}
