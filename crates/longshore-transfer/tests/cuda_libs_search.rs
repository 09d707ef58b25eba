//! Where a library is looked for (a spec of the test's own, shaped like NCCL's, and transfer's
//! NVRTC), and what the error says when it is not found: checked on a fake file system,
//! without CUDA.

use std::path::{Path, PathBuf};

use longshore_transfer::cuda_libs::{self, Candidate, LibrarySpec, NVRTC, SearchEnv};

/// A library a crate above would name (NCCL's sonames and pip folder).
const NCCL: LibrarySpec = LibrarySpec {
    name: "NCCL",
    sonames: &["libnccl.so.2", "libnccl.so"],
    pip_dirs: &["nvidia/nccl/lib", "torch/lib"],
    companions: &[],
};

fn touch(root: &Path, rel: &str) {
    let p = root.join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"not an ELF file").unwrap();
}

fn dirs(c: &[Candidate]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for c in c {
        let dir = c
            .file
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        if out.last().map(|(d, _)| d) != Some(&dir) {
            out.push((dir, c.origin.clone()));
        }
    }
    out
}

fn pos(d: &[(String, String)], dir: &str) -> usize {
    d.iter()
        .position(|(x, _)| x == dir)
        .unwrap_or_else(|| panic!("{dir} not searched: {d:#?}"))
}

#[test]
fn the_search_goes_system_toolkit_python_then_distribution() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    touch(
        root,
        "/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
    );
    touch(root, "/venv/lib/python3.9/site-packages/x");
    touch(root, "/venv/bin/python3");
    std::fs::create_dir_all(root.join("usr/local/cuda-12.8/lib64")).unwrap();
    std::fs::create_dir_all(root.join("usr/local/cuda-13.0/lib64")).unwrap();
    touch(root, "/home/u/.local/lib/python3.11/site-packages/x");
    let env = SearchEnv::with_vars(
        root,
        &[
            ("VIRTUAL_ENV", "/venv"),
            ("CUDA_HOME", "/opt/cuda"),
            ("HOME", "/home/u"),
            ("PATH", "/venv/bin:/usr/bin"),
        ],
    )
    .python_site_packages(vec![PathBuf::from("/never/used")]);
    let c = cuda_libs::search_order_in(&NCCL, &env);
    // First the bare sonames, versioned first, as dlopen finds them.
    assert_eq!(c[0].file, PathBuf::from("libnccl.so.2"));
    assert_eq!(c[1].file, PathBuf::from("libnccl.so"));
    assert!(c[0].origin.contains("system search path"));
    let d = dirs(&c[2..]);
    let order = [
        "/opt/cuda/lib64",
        "/opt/cuda/lib",
        "/venv/lib/python3.12/site-packages/nvidia/nccl/lib",
        "/venv/lib/python3.12/site-packages/torch/lib",
        "/venv/lib/python3.9/site-packages/nvidia/nccl/lib",
        "/usr/local/cuda/lib64",
        "/usr/local/cuda-13.0/lib64",
        "/usr/local/cuda-12.8/lib64",
        &format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH),
        &format!("/lib/{}-linux-gnu", std::env::consts::ARCH),
        "/home/u/.local/lib/python3.11/site-packages/nvidia/nccl/lib",
        "/usr/lib/python3/dist-packages/nvidia/nccl/lib",
    ];
    let at: Vec<usize> = order.iter().map(|o| pos(&d, o)).collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "{order:?} at {at:?} in {d:#?}"
    );
    assert!(d[pos(&d, "/opt/cuda/lib64")].1.contains("CUDA_HOME"));
    assert!(
        d[pos(&d, "/venv/lib/python3.12/site-packages/nvidia/nccl/lib")]
            .1
            .contains("VIRTUAL_ENV")
    );
    // The venv is both VIRTUAL_ENV and the python on PATH: searched once.
    assert_eq!(
        d.iter()
            .filter(|(x, _)| x.starts_with("/venv/lib/python3.12"))
            .count(),
        2
    );
    // Site-packages were found, so Python is not asked.
    assert!(!d.iter().any(|(x, _)| x.starts_with("/never")), "{d:#?}");
    // Each folder is tried with every soname, versioned first.
    let venv = c
        .iter()
        .filter(|c| {
            c.file
                .starts_with("/venv/lib/python3.12/site-packages/nvidia")
        })
        .map(|c| c.file.file_name().unwrap().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    assert_eq!(venv, ["libnccl.so.2", "libnccl.so"]);
}

#[test]
fn python_is_asked_only_when_no_site_packages_were_found() {
    let tmp = tempfile::tempdir().unwrap();
    let env = SearchEnv::with_vars(tmp.path(), &[])
        .python_site_packages(vec![PathBuf::from("/py/site-packages")]);
    let c = cuda_libs::search_order_in(&NVRTC, &env);
    let d = dirs(&c);
    let last = &d[d.len() - 3..];
    assert_eq!(last[0].0, "/py/site-packages/nvidia/cuda_nvrtc/lib");
    assert!(last[0].1.contains("python3 reports"), "{last:?}");
    assert!(c.iter().any(|c| c.file.ends_with("libnvrtc.so.13")));
}

#[cfg(feature = "cuda")]
#[test]
fn a_library_not_found_names_every_place_searched_and_why() {
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("site/nvidia/nccl/lib");
    touch(tmp.path(), "site/nvidia/nccl/lib/libnccl.so.2");
    let missing = tmp.path().join("missing");
    let candidates = vec![
        Candidate {
            file: PathBuf::from("liblongshore-test-absent.so.7"),
            origin: "the system search path (LD_LIBRARY_PATH, ldconfig cache)".into(),
        },
        Candidate {
            file: missing.join("libnccl.so.2"),
            origin: "CUDA_HOME (/x)".into(),
        },
        Candidate {
            file: missing.join("libnccl.so"),
            origin: "CUDA_HOME (/x)".into(),
        },
        Candidate {
            file: broken.join("libnccl.so.2"),
            origin: "the nvidia-* pip packages of VIRTUAL_ENV (/venv)".into(),
        },
    ];
    let e = cuda_libs::load_from(&NCCL, &candidates).unwrap_err();
    assert_eq!(e.library, "NCCL");
    assert_eq!(e.tried.len(), 4);
    assert_eq!(e.tried[1].1, "not found");
    let text = e.to_string();
    assert!(
        text.starts_with("NCCL could not be loaded; searched, in order:"),
        "{text}"
    );
    for needle in [
        "the system search path",
        "liblongshore-test-absent.so.7 (",
        "CUDA_HOME (/x):",
        &format!("{}/ (no libnccl.so.2, libnccl.so)", missing.display()),
        "the nvidia-* pip packages of VIRTUAL_ENV (/venv):",
        &format!("{} (", broken.join("libnccl.so.2").display()),
        "LD_LIBRARY_PATH",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // The broken file's line carries the loader's own reason, not "not found".
    let line = text.lines().find(|l| l.contains("site/nvidia")).unwrap();
    assert!(!line.contains("not found"), "{line}");
}

#[test]
fn the_real_search_starts_with_the_versioned_sonames() {
    let c = cuda_libs::search_order(&NVRTC);
    let first: Vec<_> = c.iter().take(3).map(|c| c.file.clone()).collect();
    assert_eq!(
        first,
        [
            PathBuf::from("libnvrtc.so.13"),
            PathBuf::from("libnvrtc.so.12"),
            PathBuf::from("libnvrtc.so.11")
        ]
    );
    assert!(
        c.iter()
            .any(|c| c.file.starts_with("/usr/local/cuda/lib64"))
    );
}
