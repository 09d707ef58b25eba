//! The search for the CUDA libraries (what [`crate::cuda_libs`] documents and re-exports),
//! below the CUDA backend's loaders that open what it finds.

use std::fmt;
use std::path::{Path, PathBuf};

/// A library to look for: its sonames, its pip packages' folders and its companions.
///
/// A crate that loads a CUDA library at run time names it with a constant of its own, as
/// longshore-nvjpeg does for libnvjpeg:
///
/// ```
/// use longshore_transfer::cuda_libs::{LibrarySpec, search_order};
///
/// const CUFFT: LibrarySpec = LibrarySpec {
///     name: "cuFFT",
///     sonames: &["libcufft.so.12", "libcufft.so.11", "libcufft.so"],
///     pip_dirs: &["nvidia/cufft/lib", "torch/lib"],
///     companions: &[],
/// };
/// assert_eq!(search_order(&CUFFT)[0].file.to_str(), Some("libcufft.so.12"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibrarySpec {
    /// The library's name for people, e.g. `NVRTC`.
    pub name: &'static str,
    /// File names to try, in order: versioned sonames (newest first), then unversioned.
    pub sonames: &'static [&'static str],
    /// Folders inside `site-packages` where pip packages put it (e.g. `nvidia/cuda_nvrtc/lib`).
    pub pip_dirs: &'static [&'static str],
    /// File name prefixes of libraries it needs from its own folder, loaded first from there
    /// (e.g. `libnvrtc-builtins.so` beside `libnvrtc.so.12`).
    pub companions: &'static [&'static str],
}

/// NVRTC (`libnvrtc.so.13`, `.12`, `.11`), with `libnvrtc-builtins` from the same folder.
pub const NVRTC: LibrarySpec = LibrarySpec {
    name: "NVRTC",
    sonames: &[
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so.11",
        "libnvrtc.so.11.2",
        "libnvrtc.so",
    ],
    pip_dirs: &["nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib", "torch/lib"],
    companions: &["libnvrtc-builtins.so"],
};

/// One file to try: a bare soname (found by the system search path) or a full path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// What to open: a bare file name or a full path.
    pub file: PathBuf,
    /// Where it comes from, for messages (e.g. `the nvidia-* pip packages of VIRTUAL_ENV`).
    pub origin: String,
}

/// What the search reads from the process: environment variables, the home folder, and the
/// file system under a root (`/` for real use, a temporary folder in tests).
#[derive(Debug, Clone, Default)]
pub struct SearchEnv {
    vars: Vec<(String, String)>,
    root: PathBuf,
    /// Site-packages folders reported by Python, when it was run (step 6).
    python_reported: Option<Vec<PathBuf>>,
}

impl SearchEnv {
    /// The running process: its environment and `/`.
    pub fn from_process() -> Self {
        Self {
            vars: std::env::vars().collect(),
            root: PathBuf::from("/"),
            python_reported: None,
        }
    }

    /// Only these variables, with every absolute folder read under `root` (for tests).
    pub fn with_vars(root: impl Into<PathBuf>, vars: &[(&str, &str)]) -> Self {
        Self {
            vars: vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            root: root.into(),
            python_reported: None,
        }
    }

    /// Sets the folders step 6 would get from Python (tests, or a caller that knows them).
    pub fn python_site_packages(mut self, dirs: Vec<PathBuf>) -> Self {
        self.python_reported = Some(dirs);
        self
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// `path` (absolute) under the root.
    fn at(&self, path: &Path) -> PathBuf {
        match path.strip_prefix("/") {
            Ok(rel) => self.root.join(rel),
            Err(_) => path.to_owned(),
        }
    }

    /// Sub-folders of `dir` whose names start with `prefix`, sorted newest (largest) first.
    fn glob(&self, dir: &Path, prefix: &str) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path())
            .collect();
        found.sort_by_key(|p| std::cmp::Reverse(version_key(p)));
        found
    }
}

/// Orders `cuda-12.8` after `cuda-13.0` and `python3.9` after `python3.12`.
fn version_key(p: &Path) -> Vec<u64> {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0))
        .collect()
}

/// Every file `spec` is looked for as, in order, for the running process (see the module docs).
pub fn search_order(spec: &LibrarySpec) -> Vec<Candidate> {
    search_order_in(spec, &SearchEnv::from_process())
}

/// [`search_order`] for a given environment.
pub fn search_order_in(spec: &LibrarySpec, env: &SearchEnv) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = spec
        .sonames
        .iter()
        .map(|s| Candidate {
            file: PathBuf::from(s),
            origin: "the system search path (LD_LIBRARY_PATH, ldconfig cache)".to_owned(),
        })
        .collect();
    let mut dirs: Vec<(PathBuf, String)> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(v) = env.var(var) {
            for sub in ["lib64", "lib"] {
                dirs.push((Path::new(v).join(sub), format!("{var} ({v})")));
            }
        }
    }
    let mut sites: Vec<(PathBuf, String)> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = env.var(var) {
            sites.extend(prefix_sites(env, Path::new(v), &format!("{var} ({v})")));
        }
    }
    if let Some(prefix) = python_prefix_on_path(env) {
        let why = format!("the python on PATH ({})", prefix.display());
        sites.extend(prefix_sites(env, &prefix, &why));
    }
    push_sites(&mut dirs, &sites, spec);
    let local = env.at(Path::new("/usr/local"));
    dirs.push((
        PathBuf::from("/usr/local/cuda/lib64"),
        "the CUDA toolkit".into(),
    ));
    for d in env.glob(&local, "cuda-") {
        let name = d
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        dirs.push((
            Path::new("/usr/local").join(name).join("lib64"),
            "a CUDA toolkit".into(),
        ));
    }
    let arch = std::env::consts::ARCH;
    for d in [
        format!("/usr/lib/{arch}-linux-gnu"),
        format!("/lib/{arch}-linux-gnu"),
    ] {
        dirs.push((PathBuf::from(d), "the distribution's libraries".into()));
    }
    let mut fallback_sites: Vec<(PathBuf, String)> = Vec::new();
    if let Some(home) = env.var("HOME") {
        let lib = env.at(&Path::new(home).join(".local/lib"));
        for py in env.glob(&lib, "python3") {
            fallback_sites.push((
                unroot(env, &py.join("site-packages")),
                "the user's python packages".into(),
            ));
        }
    }
    for py in env.glob(&env.at(Path::new("/usr/local/lib")), "python3") {
        for sub in ["site-packages", "dist-packages"] {
            fallback_sites.push((
                unroot(env, &py.join(sub)),
                "the system's python packages".into(),
            ));
        }
    }
    fallback_sites.push((
        PathBuf::from("/usr/lib/python3/dist-packages"),
        "the system's python packages".into(),
    ));
    push_sites(&mut dirs, &fallback_sites, spec);
    let any_site = sites
        .iter()
        .chain(&fallback_sites)
        .any(|(d, _)| env.at(d).is_dir());
    if !any_site {
        let reported = match &env.python_reported {
            Some(d) => d.clone(),
            None if env.root == Path::new("/") => python_reported_sites(),
            None => Vec::new(),
        };
        let sites: Vec<(PathBuf, String)> = reported
            .into_iter()
            .map(|d| (d, "the site-packages python3 reports".to_owned()))
            .collect();
        push_sites(&mut dirs, &sites, spec);
    }
    let mut seen = std::collections::HashSet::new();
    for (dir, origin) in dirs {
        if !seen.insert(dir.clone()) {
            continue;
        }
        for s in spec.sonames {
            out.push(Candidate {
                file: dir.join(s),
                origin: origin.clone(),
            });
        }
    }
    out
}

fn unroot(env: &SearchEnv, p: &Path) -> PathBuf {
    match p.strip_prefix(&env.root) {
        Ok(rel) if env.root != Path::new("/") => Path::new("/").join(rel),
        _ => p.to_owned(),
    }
}

/// `prefix/lib/python3*/site-packages`, newest Python first.
fn prefix_sites(env: &SearchEnv, prefix: &Path, why: &str) -> Vec<(PathBuf, String)> {
    let lib = env.at(&prefix.join("lib"));
    env.glob(&lib, "python3")
        .into_iter()
        .map(|py| (unroot(env, &py.join("site-packages")), why.to_owned()))
        .collect()
}

fn push_sites(dirs: &mut Vec<(PathBuf, String)>, sites: &[(PathBuf, String)], spec: &LibrarySpec) {
    for (site, why) in sites {
        for sub in spec.pip_dirs {
            let what = if sub.starts_with("torch") {
                "torch/lib"
            } else {
                "the nvidia-* pip packages"
            };
            dirs.push((site.join(sub), format!("{what} of {why}")));
        }
    }
}

/// The prefix of the first `python3` (or `python`) on `PATH`: `<prefix>/bin/python3`.
fn python_prefix_on_path(env: &SearchEnv) -> Option<PathBuf> {
    let path = env.var("PATH")?;
    for dir in std::env::split_paths(path) {
        for exe in ["python3", "python"] {
            if env.at(&dir.join(exe)).exists() {
                return dir.parent().map(Path::to_owned);
            }
        }
    }
    None
}

/// The site-packages folders `python3` reports, asked once per process (only when no
/// site-packages folder was found otherwise). Empty if Python cannot be run.
fn python_reported_sites() -> Vec<PathBuf> {
    static SITES: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    SITES
        .get_or_init(|| {
            let out = std::process::Command::new("python3")
                .args([
                    "-c",
                    "import site\nfor d in site.getsitepackages() + [site.getusersitepackages()]: print(d)",
                ])
                .stderr(std::process::Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(PathBuf::from)
                    .collect(),
                _ => Vec::new(),
            }
        })
        .clone()
}

/// A library that could not be loaded from any candidate: every place searched and why each
/// failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryNotFound {
    /// The library, e.g. `NVRTC`.
    pub library: &'static str,
    /// Each candidate tried and why it failed (`not found`, or the loader's message).
    pub tried: Vec<(Candidate, String)>,
}

impl fmt::Display for LibraryNotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} could not be loaded; searched, in order:",
            self.library
        )?;
        let mut origin = "";
        let mut i = 0;
        while i < self.tried.len() {
            let (c, _) = &self.tried[i];
            if c.origin != origin {
                origin = &c.origin;
                write!(f, "\n  {origin}:")?;
            }
            // One line per folder whose names were all missing; the loader's message otherwise.
            let dir = c.file.parent().filter(|d| !d.as_os_str().is_empty());
            let same: Vec<&(Candidate, String)> = self.tried[i..]
                .iter()
                .take_while(|(o, _)| {
                    o.file.parent().filter(|d| !d.as_os_str().is_empty()) == dir
                        && o.origin == c.origin
                })
                .collect();
            match dir {
                Some(d) if same.iter().all(|(_, why)| why == NOT_FOUND) => {
                    write!(f, "\n    {}/ (no {})", d.display(), names(&same))?;
                }
                _ => {
                    for (c, why) in &same {
                        write!(f, "\n    {} ({why})", c.file.display())?;
                    }
                }
            }
            i += same.len();
        }
        write!(
            f,
            "\n  install it (the CUDA toolkit, or PyTorch's nvidia-* pip packages) or put its \
             folder on LD_LIBRARY_PATH"
        )
    }
}

/// Why a full-path candidate whose file does not exist failed.
pub(crate) const NOT_FOUND: &str = "not found";

fn names(group: &[&(Candidate, String)]) -> String {
    group
        .iter()
        .filter_map(|(c, _)| c.file.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::error::Error for LibraryNotFound {}
