//! [`ImageFolder`]: torchvision's `datasets.ImageFolder`, `root/<class>/**/<file>`.
//!
//! The semantics are torchvision's (`torchvision/datasets/folder.py`):
//!
//! * classes are the names of the sub-folders of `root` (symbolic links followed), sorted;
//!   `class_to_idx` maps each to its position;
//! * the samples of each class, classes in that order, come from walking its folder (links
//!   followed) with the walked folders sorted by path and the files of each sorted by name;
//! * a file is kept when its lower-cased name ends with one of [`IMG_EXTENSIONS`];
//! * a root without class folders is an error, and so is a class folder without a valid file,
//!   unless [`ImageFolderOptions::allow_empty`] is set.
//!
//! One deviation: a folder reached twice through symbolic links is walked once, where
//! Python's `os.walk(followlinks=True)` would loop forever.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use longshore_data::{DataError, Dataset};

use crate::decode::{DecodeOptions, decode_rgb};
use crate::image::RgbImage;

/// torchvision's `IMG_EXTENSIONS`, matched case-insensitively against the end of file names.
pub const IMG_EXTENSIONS: [&str; 9] = [
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
];

/// Whether `name` ends with one of `extensions`, ignoring case (torchvision's
/// `has_file_allowed_extension`).
pub fn has_allowed_extension(name: &str, extensions: &[&str]) -> bool {
    let lower = name.to_lowercase();
    extensions
        .iter()
        .any(|e| lower.ends_with(&e.to_lowercase()))
}

/// Options of [`ImageFolder::with_options`].
#[derive(Debug, Clone)]
pub struct ImageFolderOptions {
    extensions: Vec<String>,
    allow_empty: bool,
    decode: DecodeOptions,
}

impl Default for ImageFolderOptions {
    fn default() -> Self {
        ImageFolderOptions {
            extensions: IMG_EXTENSIONS.iter().map(|e| (*e).to_owned()).collect(),
            allow_empty: false,
            decode: DecodeOptions::default(),
        }
    }
}

impl ImageFolderOptions {
    /// The accepted extensions (with their dot, matched case-insensitively); default
    /// [`IMG_EXTENSIONS`].
    pub fn extensions<I: IntoIterator<Item = S>, S: Into<String>>(mut self, exts: I) -> Self {
        self.extensions = exts.into_iter().map(Into::into).collect();
        self
    }

    /// Accept class folders without valid files (torchvision's `allow_empty=True`).
    pub fn allow_empty(mut self, allow: bool) -> Self {
        self.allow_empty = allow;
        self
    }

    /// Decoding options (the pixel limit) used by [`ImageFolder::load`].
    pub fn decode(mut self, options: DecodeOptions) -> Self {
        self.decode = options;
        self
    }
}

/// A dataset of images in class folders, torchvision's `ImageFolder`.
///
/// As a [`Dataset`] it yields `(RgbImage, i64)`: the decoded image and its class index, like
/// torchvision's ImageFolder without a transform. Add a pipeline with
/// [`ImageFolder::with_transform`] to get tensors written straight into batches.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    root: Option<PathBuf>,
    classes: Arc<[String]>,
    class_to_idx: Arc<BTreeMap<String, usize>>,
    samples: Arc<[(PathBuf, usize)]>,
    decode: DecodeOptions,
}

fn io_err(path: &Path, source: std::io::Error) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl ImageFolder {
    /// Scans `root` with torchvision's defaults.
    ///
    /// # Errors
    /// [`DataError::Io`] when `root` cannot be read; [`DataError::InvalidFile`] when it has no
    /// class folder (torchvision: "Couldn't find any class folder in ...") or a class folder
    /// has no valid file ("Found no valid file for the classes ...").
    pub fn new(root: impl AsRef<Path>) -> Result<ImageFolder, DataError> {
        ImageFolder::with_options(root, ImageFolderOptions::default())
    }

    /// Scans `root` with `options`.
    ///
    /// # Errors
    /// As [`ImageFolder::new`].
    pub fn with_options(
        root: impl AsRef<Path>,
        options: ImageFolderOptions,
    ) -> Result<ImageFolder, DataError> {
        let root = root.as_ref();
        let classes = find_classes(root)?;
        let class_to_idx: BTreeMap<String, usize> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), i))
            .collect();
        let exts: Vec<&str> = options.extensions.iter().map(String::as_str).collect();
        let mut samples = Vec::new();
        let mut empty = Vec::new();
        for (idx, class) in classes.iter().enumerate() {
            let before = samples.len();
            for path in walk_sorted(&root.join(class))? {
                let name = path.file_name().map(|n| n.to_string_lossy());
                if name.is_some_and(|n| has_allowed_extension(&n, &exts)) {
                    samples.push((path, idx));
                }
            }
            if samples.len() == before {
                empty.push(class.clone());
            }
        }
        if !empty.is_empty() && !options.allow_empty {
            return Err(DataError::InvalidFile {
                path: root.to_path_buf(),
                reason: format!(
                    "found no valid file for the classes {}; supported extensions are: {}",
                    empty.join(", "),
                    exts.join(", ")
                ),
            });
        }
        tracing::debug!(target: "longshore::vision", root = %root.display(), classes = classes.len(), samples = samples.len(), "scanned image folder");
        Ok(ImageFolder {
            root: Some(root.to_path_buf()),
            classes: classes.into(),
            class_to_idx: Arc::new(class_to_idx),
            samples: samples.into(),
            decode: options.decode,
        })
    }

    /// A dataset of explicit `(path, label)` pairs, for layouts other than class folders.
    /// The classes are named `"0"`, `"1"`, ... up to the largest label.
    pub fn from_samples<I, P>(samples: I) -> ImageFolder
    where
        I: IntoIterator<Item = (P, usize)>,
        P: Into<PathBuf>,
    {
        let samples: Vec<(PathBuf, usize)> =
            samples.into_iter().map(|(p, l)| (p.into(), l)).collect();
        let n = samples.iter().map(|(_, l)| l + 1).max().unwrap_or(0);
        let classes: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let class_to_idx = classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), i))
            .collect();
        ImageFolder {
            root: None,
            classes: classes.into(),
            class_to_idx: Arc::new(class_to_idx),
            samples: samples.into(),
            decode: DecodeOptions::default(),
        }
    }

    /// Sets the decoding options (the pixel limit).
    pub fn decode_options(mut self, options: DecodeOptions) -> ImageFolder {
        self.decode = options;
        self
    }

    /// The decoding options.
    pub fn decode(&self) -> &DecodeOptions {
        &self.decode
    }

    /// The scanned root, if built from a folder.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The class names, sorted (torchvision's `classes`).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Class name to index (torchvision's `class_to_idx`).
    pub fn class_to_idx(&self) -> &BTreeMap<String, usize> {
        &self.class_to_idx
    }

    /// `(path, class index)` in sample order (torchvision's `samples` / `imgs`).
    pub fn samples(&self) -> &[(PathBuf, usize)] {
        &self.samples
    }

    /// The class index of every sample (torchvision's `targets`).
    pub fn targets(&self) -> Vec<usize> {
        self.samples.iter().map(|(_, t)| *t).collect()
    }

    /// Reads the bytes of sample `index`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`], or [`DataError::Io`] naming the file.
    pub fn read(&self, index: usize) -> Result<(&Path, Vec<u8>, usize), DataError> {
        let (path, label) = self.samples.get(index).ok_or(DataError::IndexOutOfRange {
            index,
            len: self.samples.len(),
            what: "image folder",
        })?;
        let bytes = fs::read(path).map_err(|e| io_err(path, e))?;
        Ok((path, bytes, *label))
    }

    /// Reads and decodes sample `index` to RGB.
    ///
    /// # Errors
    /// [`DataError::Io`] when the file cannot be read, [`DataError::InvalidFile`] naming the
    /// file and the reason when it cannot be decoded.
    pub fn load(&self, index: usize) -> Result<(RgbImage, usize), DataError> {
        let (path, bytes, label) = self.read(index)?;
        let image = decode_rgb(&bytes, &self.decode).map_err(|e| invalid(path, e))?;
        Ok((image, label))
    }
}

/// A decoding error as the [`DataError`] of the file it came from.
pub fn invalid(path: &Path, e: crate::decode::DecodeError) -> DataError {
    DataError::InvalidFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

impl Dataset for ImageFolder {
    type Item = (RgbImage, i64);

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn get(&self, index: usize) -> Result<(RgbImage, i64), DataError> {
        let (image, label) = self.load(index)?;
        Ok((image, label as i64))
    }
}

/// torchvision's `find_classes`: the sorted names of the folders in `root`.
fn find_classes(root: &Path) -> Result<Vec<String>, DataError> {
    let mut classes = Vec::new();
    for entry in fs::read_dir(root).map_err(|e| io_err(root, e))? {
        let entry = entry.map_err(|e| io_err(root, e))?;
        // `is_dir` through the link, as Python's `DirEntry.is_dir()`.
        if fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            classes.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    classes.sort();
    if classes.is_empty() {
        return Err(DataError::InvalidFile {
            path: root.to_path_buf(),
            reason: "couldn't find any class folder".into(),
        });
    }
    Ok(classes)
}

/// The files under `dir` in torchvision's order: `sorted(os.walk(dir, followlinks=True))`,
/// then each folder's file names sorted.
fn walk_sorted(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut folders: Vec<(PathBuf, Vec<String>)> = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = HashSet::new();
    while let Some(folder) = stack.pop() {
        if let Ok(real) = fs::canonicalize(&folder)
            && !seen.insert(real)
        {
            continue;
        }
        let mut files = Vec::new();
        // os.walk ignores folders it cannot list.
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
                stack.push(path);
            } else {
                files.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        files.sort();
        folders.push((folder, files));
    }
    // Python sorts the (root, dirs, files) tuples by the root's string.
    folders.sort_by(|a, b| a.0.as_os_str().cmp(b.0.as_os_str()));
    Ok(folders
        .into_iter()
        .flat_map(|(folder, files)| files.into_iter().map(move |f| folder.join(f)))
        .collect())
}
