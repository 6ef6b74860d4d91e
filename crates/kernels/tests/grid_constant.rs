//! Every kernel that takes a weft parameter struct by value marks it `__grid_constant__`.
//!
//! Without the mark, a kernel that takes the struct's address (passes it by reference, indexes an
//! array in it by a run-time value) makes every thread copy the whole struct to its stack before
//! anything else: on two H200s that cost the collectives' 4 KiB AllReduce 3.2 µs of its 6.8 µs
//! per call (`kernels/collectives/collectives.cu`). This reads the sources, so a kernel added
//! without the mark fails here rather than in a benchmark.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("cu" | "cuh")
        ) {
            out.push(path);
        }
    }
}

/// The parameter lists of the `__global__` functions in `text`: for each, the text between the
/// last `(` … `)` pair before the body's `{`.
fn kernel_params(text: &str) -> Vec<String> {
    let mut lists = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("__global__") {
        let after = &rest[at..];
        let Some(body) = after.find('{') else { break };
        let head = &after[..body];
        if let (Some(open), Some(close)) = (head.rfind('('), head.rfind(')')) {
            // A parameter list without nested parentheses (weft's kernels have none).
            let open = head[..close].rfind('(').unwrap_or(open);
            lists.push(head[open + 1..close].replace('\\', " "));
        }
        rest = &after[body..];
    }
    lists
}

/// The by-value weft struct parameters in `list` that lack the mark.
fn unmarked(list: &str) -> Vec<String> {
    list.split(',')
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| {
            p.split(' ').any(|w| w.starts_with("weft_"))
                && !p.contains('*')
                && !p.contains('&')
                && !p.contains("__grid_constant__")
        })
        .collect()
}

#[test]
fn struct_parameters_are_grid_constant() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 10,
        "found only {} sources under {}",
        files.len(),
        root.display()
    );
    let mut bad = Vec::new();
    let mut kernels = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for list in kernel_params(&text) {
            kernels += 1;
            for p in unmarked(&list) {
                bad.push(format!("{}: {p}", file.display()));
            }
        }
    }
    assert!(kernels > 20, "found only {kernels} kernels");
    assert!(
        bad.is_empty(),
        "struct parameters without __grid_constant__:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_sees_a_missing_mark() {
    let lists = kernel_params(
        "extern \"C\" __global__ void __launch_bounds__(512) k(weft_collective_params p) { f(p); }\n\
         #define K(NAME) \\\n  extern \"C\" __global__ void NAME(const __grid_constant__ weft_x q, const float* a) { \\\n }",
    );
    assert_eq!(lists.len(), 2);
    assert_eq!(unmarked(&lists[0]), vec!["weft_collective_params p"]);
    assert!(unmarked(&lists[1]).is_empty());
}
