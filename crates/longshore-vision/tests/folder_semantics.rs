//! ImageFolder follows torchvision's `datasets/folder.py`: sorted classes, `class_to_idx`,
//! sample order (classes in order; walked folders sorted by path, files by name), extensions
//! matched case-insensitively, and its errors for missing or empty class folders.

use std::fs;
use std::path::Path;

use longshore_data::{DataError, Dataset};
use longshore_vision::folder::has_allowed_extension;
use longshore_vision::synth::{FolderSpec, image_jpeg, write_folder};
use longshore_vision::{IMG_EXTENSIONS, ImageFolder, ImageFolderOptions};

fn touch(root: &Path, rel: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, b"x").unwrap();
}

fn rel(root: &Path, folder: &ImageFolder) -> Vec<(String, usize)> {
    folder
        .samples()
        .iter()
        .map(|(p, l)| {
            (
                p.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                *l,
            )
        })
        .collect()
}

#[test]
fn classes_and_samples_are_in_torchvision_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for f in [
        "dog/b.jpg",
        "dog/a.JPEG",
        "dog/notes.txt",
        "dog/sub/z.png",
        "dog/sub-x/y.png",
        "dog/sub/deeper/c.Png",
        "cat/1.webp",
        "cat/10.bmp",
        "cat/2.tif",
        "Zebra/x.jpg",
        ".hidden/h.jpg",
        "loose_file.jpg",
    ] {
        touch(root, f);
    }
    let folder = ImageFolder::new(root).unwrap();
    // Python's sorted(): code points, so upper case and '.' sort first.
    assert_eq!(folder.classes(), [".hidden", "Zebra", "cat", "dog"]);
    assert_eq!(folder.class_to_idx()["cat"], 2);
    // sorted(os.walk(...)) compares the roots as strings: "dog/sub" is a prefix of
    // "dog/sub-x", and '-' (0x2d) sorts before '/' (0x2f), so "dog/sub" < "dog/sub-x" <
    // "dog/sub/deeper". (Checked against torchvision 0.29's make_dataset on this tree.)
    let expected: Vec<(String, usize)> = [
        (".hidden/h.jpg", 0),
        ("Zebra/x.jpg", 1),
        ("cat/1.webp", 2),
        ("cat/10.bmp", 2),
        ("cat/2.tif", 2),
        ("dog/a.JPEG", 3),
        ("dog/b.jpg", 3),
        ("dog/sub/z.png", 3),
        ("dog/sub-x/y.png", 3),
        ("dog/sub/deeper/c.Png", 3),
    ]
    .iter()
    .map(|(p, l)| ((*p).to_owned(), *l))
    .collect();
    assert_eq!(rel(root, &folder), expected);
    assert_eq!(folder.len(), 10);
    assert_eq!(
        folder.targets(),
        expected.iter().map(|(_, l)| *l).collect::<Vec<_>>()
    );
}

#[test]
fn extensions_match_case_insensitively_and_can_be_replaced() {
    assert_eq!(IMG_EXTENSIONS.len(), 9);
    assert!(has_allowed_extension("A.JPG", &IMG_EXTENSIONS));
    assert!(has_allowed_extension("x.tar.Jpeg", &IMG_EXTENSIONS));
    assert!(!has_allowed_extension("jpg", &IMG_EXTENSIONS));
    assert!(!has_allowed_extension("a.jpg.txt", &IMG_EXTENSIONS));
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "c/a.jpg");
    touch(dir.path(), "c/b.raw");
    let only_raw = ImageFolder::with_options(
        dir.path(),
        ImageFolderOptions::default().extensions([".RAW"]),
    )
    .unwrap();
    assert_eq!(rel(dir.path(), &only_raw), [("c/b.raw".to_owned(), 0)]);
}

#[test]
fn a_root_without_class_folders_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "loose.jpg");
    let err = ImageFolder::new(dir.path()).unwrap_err();
    assert!(matches!(err, DataError::InvalidFile { .. }));
    assert!(
        err.to_string().contains("couldn't find any class folder"),
        "{err}"
    );
    let missing = ImageFolder::new(dir.path().join("nope")).unwrap_err();
    assert!(matches!(missing, DataError::Io { .. }), "{missing:?}");
}

#[test]
fn an_empty_class_is_an_error_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "full/a.jpg");
    touch(dir.path(), "empty_b/readme.txt");
    fs::create_dir_all(dir.path().join("empty_a")).unwrap();
    let err = ImageFolder::new(dir.path()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("found no valid file for the classes empty_a, empty_b"),
        "{msg}"
    );
    assert!(msg.contains(".jpg, .jpeg, .png"), "{msg}");
    let allowed =
        ImageFolder::with_options(dir.path(), ImageFolderOptions::default().allow_empty(true))
            .unwrap();
    assert_eq!(allowed.classes(), ["empty_a", "empty_b", "full"]);
    assert_eq!(rel(dir.path(), &allowed), [("full/a.jpg".to_owned(), 2)]);
}

#[cfg(unix)]
#[test]
fn symlinked_folders_are_followed_without_looping() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    touch(&root, "c/a.jpg");
    touch(dir.path(), "elsewhere/b.jpg");
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("linked_class")).unwrap();
    std::os::unix::fs::symlink(root.join("c"), root.join("c/loop")).unwrap();
    let folder = ImageFolder::new(&root).unwrap();
    assert_eq!(folder.classes(), ["c", "linked_class"]);
    assert_eq!(
        rel(&root, &folder),
        [
            ("c/a.jpg".to_owned(), 0),
            ("linked_class/b.jpg".to_owned(), 1)
        ]
    );
}

#[test]
fn from_samples_keeps_the_given_pairs_and_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("img.jpg");
    fs::write(&p, image_jpeg(&FolderSpec::tiny(), 1, 1)).unwrap();
    let folder = ImageFolder::from_samples([(p.clone(), 3), (p, 0)]);
    assert_eq!(folder.classes().len(), 4);
    assert_eq!(folder.targets(), [3, 0]);
    let (img, label) = folder.get(0).unwrap();
    assert_eq!(label, 3);
    assert!(img.width() > 0 && img.height() > 0);
}

#[test]
fn synthetic_folders_are_imagefolders_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = FolderSpec::tiny();
    let first = write_folder(dir.path(), &spec).unwrap();
    assert!(!first.reused);
    let again = write_folder(dir.path(), &spec).unwrap();
    assert!(again.reused);
    assert_eq!(again.bytes, first.bytes);
    let folder = ImageFolder::new(dir.path()).unwrap();
    assert_eq!(folder.len(), spec.len());
    assert_eq!(folder.classes(), ["n0000", "n0001", "n0002", "n0003"]);
    for i in 0..folder.len() {
        folder.get(i).unwrap();
    }
}
